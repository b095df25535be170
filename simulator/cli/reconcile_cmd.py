"""`tilesim reconcile RECORDS...`: predicted vs measured time, DRAM and L2 bytes."""

from __future__ import annotations

import json

from simulator.cli.records_args import add_loop_facts_args


def add_parser(sub) -> None:
    p = sub.add_parser("reconcile", help="compare measurement records with predictions")
    p.add_argument("records", nargs="*", help="records files (JSON Lines, tilesim.record/1)")
    p.add_argument("--from-saved", default=None, metavar="REPORT",
                   help="show a report that --save wrote (its tables, targets, --plot, "
                        "--json) instead of predicting records again")
    p.add_argument("--hardware", default=None,
                   help="preset or .toml for every record (default: from each record's GPU)")
    p.add_argument("--plot", default=None,
                   help="write predicted-vs-measured scatter (.png or .svg)")
    p.add_argument("--summary-only", action="store_true", help="no per-config table")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--save", default=None, metavar="PATH",
                   help="also write the report as JSON to PATH (the tables still print: one "
                        "prediction run gives both)")
    p.add_argument("--jobs", type=int, default=None,
                   help="processes predicting the records (default: the cores; naive "
                        "attention at N = 16k takes 8-110 s and about 1.1 GB per record)")
    p.add_argument("--match", default=None, metavar="REGEX",
                   help="only the records whose record_id matches REGEX (searched, e.g. "
                        "'fa2-bwd' or 'd128.*causal'; one that starts with '-' as "
                        "--match=-m128-): a quick look at one group while the model "
                        "changes; the report says it is a subset")
    p.add_argument("--max-seq", type=int, default=None, metavar="N",
                   help="only the records whose query and key lengths are at most N (naive "
                        "attention at N = 16k is most of a full run's time)")
    add_loop_facts_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from simulator.cli.common import (
        check_counts,
        check_output_paths,
        cores,
        progress_lines,
        write_atomically,
    )
    from simulator.cli.records_args import fill_loop_facts_as_asked, read_records_or_fail
    from simulator.explain.common import check_plot_path
    from traces.problem import ProblemError
    from validation.reconcile import nothing_compared, reconcile
    from validation.selection import compile_match, select_records

    check_counts(("--jobs", args.jobs), ("--max-seq", args.max_seq))  # before any file is read
    pattern = compile_match(args.match)
    check_plot_path(args.plot)
    check_output_paths(args.save)
    if args.from_saved is not None:
        return _show(_saved(args), args)
    if not args.records:
        raise ProblemError("reconcile needs records files, or --from-saved REPORT")
    records, errors = read_records_or_fail(args.records)
    records, selection = select_records(records, pattern, args.max_seq)
    records, filled = fill_loop_facts_as_asked(records, args, "reconcile")
    report = reconcile(records, hardware=args.hardware, jobs=args.jobs or cores(),
                       progress=progress_lines("reconcile", "records predicted"))
    if not report["rows"]:  # before --save: a report of nothing replaces no file
        raise ProblemError(nothing_compared(report))
    report["skipped_lines"] = [str(e) for e in errors]
    report["loop_facts_filled"] = None if filled is None else filled["records"]
    report["loop_facts_compilers"] = filled
    report["selection"] = selection
    if args.save:
        text = json.dumps(report, indent=1) + "\n"
        write_atomically(args.save, lambda tmp: tmp.write_text(text))
    return _show(report, args)


def _saved(args) -> dict:
    """The report ``--from-saved`` names; ``ProblemError`` if records or an option that
    only predicting uses come with it."""
    from traces.problem import ProblemError
    from validation.reconcile import load_saved_report

    given = [flag for flag, value in (("records files", args.records),
                                      ("--hardware", args.hardware), ("--jobs", args.jobs),
                                      ("--match", args.match), ("--max-seq", args.max_seq),
                                      ("--fill-loop-facts", args.fill_loop_facts),
                                      ("--as-recorded", args.as_recorded),
                                      ("--save", args.save)) if value]
    if given:
        raise ProblemError(f"--from-saved shows a saved report as it was: {', '.join(given)} "
                           "only apply when predicting records")
    return load_saved_report(args.from_saved)


def _show(report: dict, args) -> int:
    """The report as tables and target lines (or ``--json``), and its ``--plot``."""
    from simulator.cli.common import output_console, print_json
    from validation import report as rp

    if args.plot:
        rp.plot(report, args.plot)
    if args.json:
        print_json(report)
        return 0
    console = output_console()
    for table in rp.tables(report, per_config=not args.summary_only):
        console.print(table)
    for line in rp.target_lines(report):
        console.print(line)
    for path in (args.plot, args.save):
        if path:
            console.print(f"wrote {path}")
    return 0
