"""``python -m validation validate|reconcile|calibrate ...``: the same three subcommands as
``tilesim``, without loading the rest of the command line (what the GPU machine runs)."""

from __future__ import annotations

import argparse
import importlib
import sys

from traces.problem import ProblemError

COMMANDS = ("validate", "reconcile", "calibrate")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python -m validation")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMANDS:
        importlib.import_module(f"simulator.cli.{name}_cmd").add_parser(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ProblemError as exc:
        sys.stderr.write(f"{parser.prog}: error: {exc}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
