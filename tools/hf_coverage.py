"""Which common Hugging Face model families autoshard plans out of the box.

    python3 tools/hf_coverage.py [--families llama,mixtral,...] [--mesh 8x8] [--time-limit S]
                                 [--trace-only]

Builds each family with a tiny config on the meta device (python/autoshard/_testing/hf_zoo.py),
traces its training step, and plans it on a virtual mesh (fake process group, default 8x8).
Prints per family OK, or the ops without a sharding rule, or the error. Exit status 1 when a
family is not OK.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings


def main(argv=None) -> int:
    from autoshard._testing import hf_zoo

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--families",
        default=",".join(hf_zoo.FAMILIES),
        help="comma-separated (default: all): " + ", ".join(hf_zoo.FAMILIES),
    )
    ap.add_argument("--mesh", default="8x8")
    ap.add_argument("--time-limit", type=float, default=5.0, help="solver time limit (s)")
    ap.add_argument(
        "--trace-only", action="store_true", help="only trace and list missing rules, do not plan"
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    warnings.filterwarnings("ignore")
    mesh = tuple(int(x) for x in args.mesh.split("x"))
    failed = 0
    print(f"{'family':<12} {'nodes':>6} {'trace s':>8} {'plan s':>7}  status")
    for name in args.families.split(","):
        r = hf_zoo.check_family(name, mesh, args.time_limit, plan=not args.trace_only)
        failed += not r.ok
        print(
            f"{name:<12} {r.nodes:>6} {r.trace_s:>8.1f} {r.plan_s:>7.1f}  {r.status()}", flush=True
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
