"""The ``tilesim`` command line: one entry point, one module per subcommand.

Each subcommand module defines ``add_parser(subparsers)`` and ``run(args) -> int`` and keeps
heavy imports (numba, matplotlib, torch) inside ``run`` so that start-up stays fast.
Any ``ProblemError`` (bad user input) becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from traces.problem import ProblemError

# Subcommand modules, in the order ``tilesim --help`` lists them.
COMMANDS = [
    "compare",
    "count",
    "simulate",
    "sweep",
    "trace",
    "replay",
    "hardware",
    "kernels",
    "bill",
    "ledger",
    "race",
    "roofline",
    "report",
    "validate",
    "reconcile",
    "calibrate",
]


class UserError(ProblemError):
    """Bad command-line input that is not about the problem itself (paths, files)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, as argparse does but shorter
        sys.stderr.write(f"tilesim: error: {message}\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tilesim",
        description="Memory-hierarchy simulator for attention kernels.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMANDS:
        module = importlib.import_module(f"simulator.cli.{name.replace('-', '_')}_cmd")
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ProblemError as exc:
        sys.stderr.write(f"tilesim: error: {exc}\n")
        return 2
    except MemoryError as exc:
        # The work arrays grow with the grid (CTAs) and, for traces, with the tile steps.
        sys.stderr.write(f"tilesim: error: out of memory ({exc}): the problem is too large "
                         "for this machine; try a smaller batch, fewer heads or a shorter "
                         "sequence\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("tilesim: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:  # the file system refused: a name too long, a device, ...
        if os.environ.get("TILESIM_DEBUG"):
            raise  # the traceback, for a failure that is not the user's
        where = f": {exc.filename}" if exc.filename else ""
        sys.stderr.write(f"tilesim: error: {exc.strerror or exc}{where}\n")
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
