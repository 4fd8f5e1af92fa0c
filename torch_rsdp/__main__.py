"""``python -m torch_rsdp``: the report to paste into a bug; ``--check N`` runs every
collective on N local ranks (see :mod:`torch_rsdp._env_report`, :mod:`torch_rsdp._selfcheck`)."""
import argparse
import sys

from . import _env_report, _selfcheck


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torch_rsdp", description=__doc__.split(";")[0])
    p.add_argument("--check", nargs="?", type=int, const=2, metavar="N",
                   help="run every collective once on N local ranks (default 2), rsdp and gloo")
    p.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                   help="deadline of the whole --check run (default 120)")
    args = p.parse_args(argv)
    if args.check is None:
        print(_env_report.report())
        return 0
    return _selfcheck.check(args.check, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
