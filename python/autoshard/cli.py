"""The `autoshard` console script: `demo` runs in Python (it traces a torch model); every
other subcommand is the C++ command line in the extension."""

import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "demo":
        from .demo import main as demo_main

        return demo_main(argv[1:])
    from . import _core

    rc, out, err = _core.cli_main(argv)
    sys.stdout.write(out)
    sys.stderr.write(err)
    return rc


if __name__ == "__main__":
    sys.exit(main())
