"""Reading validation records for a command, and the loop facts it gives the records
that lack them (``reconcile``, ``calibrate``, ``python -m validation.pace``:
``validation.fill_facts``)."""

from __future__ import annotations

import argparse
import sys

from simulator.cli.common import progress_lines
from traces.problem import ProblemError

SKIPPED_LINES_SHOWN = 3  # warnings printed for malformed record lines; the rest counted


def read_records_or_fail(paths: list[str]) -> tuple[list[dict], list]:
    """The valid records of ``paths`` and the malformed lines. The first few malformed lines
    are warned about on stderr (then how many more); ``ProblemError`` (one line) if no line
    is a valid record."""
    from validation.records import read_many

    records, errors = read_many(paths)
    if not records:
        skipped = (f" ({len(errors)} malformed line{'s' if len(errors) > 1 else ''}, the "
                   f"first: {errors[0]})" if errors else " (no lines)")
        raise ProblemError("no valid records in " + ", ".join(paths) + skipped)
    for err in errors[:SKIPPED_LINES_SHOWN]:
        sys.stderr.write(f"tilesim: warning: skipped {err}\n")
    if len(errors) > SKIPPED_LINES_SHOWN:
        sys.stderr.write(f"tilesim: warning: skipped {len(errors) - SKIPPED_LINES_SHOWN} "
                         "more malformed lines\n")
    return records, errors


def add_loop_facts_args(parser: argparse.ArgumentParser) -> None:
    """``--fill-loop-facts`` and ``--as-recorded``: where records that lack their kernels'
    main-loop facts take them (``validation.fill_facts``); by default from tilesim's table
    of compiles alone, as the prediction commands take them."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--fill-loop-facts", action="store_true",
                       help="records without the main-loop facts of their kernels (a "
                            "warp's instructions per iteration, or in all in a kernel "
                            "without loops; spills per iteration and the waits for them; "
                            "the H200 records of 2026-11-30) take them, as by default, "
                            "from tilesim's table of compiles where it has all their "
                            "kernels and the device ran its Triton, and the others from a "
                            "compile here (needs torch and triton; cached); for each "
                            "kernel the compile gives the device's registers")
    group.add_argument("--as-recorded", action="store_true",
                       help="predict each record with the kernel facts it carries alone, "
                            "without those tilesim's table of compiles has for it (by "
                            "default a record without loop facts takes the table's, as "
                            "simulate takes them for its config)")


def fill_loop_facts_as_asked(records: list[dict], args: argparse.Namespace,
                             command: str) -> tuple[list[dict], dict | None]:
    """The records with the loop facts ``add_loop_facts_args``' flags ask for, and
    ``validation.fill_facts.fill_saying_how``'s account of them (None with
    ``--as-recorded``, and by default where the table gave no record any)."""
    if args.as_recorded:
        return records, None
    from validation.fill_facts import fill_saying_how

    out, filled = fill_saying_how(records, progress_lines(command, "problems compiled"),
                                  compile_here=args.fill_loop_facts)
    return out, filled if args.fill_loop_facts or filled["records"] else None
