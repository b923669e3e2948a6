"""The `autoshard` console script: `demo` runs in Python (it traces a torch model), and so
do view, explain, diff and plan --preset (tools/commands.py); every other subcommand is the C++
command line in the extension."""

import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "demo":
        from autoshard.tools.demo import main as demo_main

        return demo_main(argv[1:])
    from autoshard.tools.commands import python_command

    command = python_command(argv)  # view, explain, diff, plan --preset (tools/commands.py)
    if command is not None:
        return command(argv[1:])
    from autoshard import _core

    rc, out, err = _core.cli_main(argv)
    sys.stdout.write(out)
    sys.stderr.write(err)
    return rc


if __name__ == "__main__":
    sys.exit(main())
