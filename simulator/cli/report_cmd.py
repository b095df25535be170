"""``tilesim report``: one self-contained HTML page with every explainer drawn as plots."""

from __future__ import annotations

import argparse

from simulator.cli.common import add_hardware_arg, add_problem_args, add_tiling_args


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report", help="one self-contained HTML page: roofline, naive vs FA2, sweep, "
        "timeline, N² bill, ledger, and predicted vs measured",
        description="Write one HTML page that opens without a network: the roofline, naive vs "
        "FA2 side by side, a tile-sweep heatmap, the timeline of the best tiling, the N² bill, "
        "the online-softmax ledger and, with --records, predicted vs measured. Every time and DRAM "
        "byte comes from the timing simulator (one simulation per schedule, per sweep cell and "
        "for the timeline: about 10 s for the default problem; smaller --heads or --seq are "
        "faster).",
    )
    add_hardware_arg(p)
    add_problem_args(p, schedule=False)
    add_tiling_args(p)
    p.add_argument("--records", nargs="+", metavar="FILE", default=None,
                   help="validation records (.jsonl) to compare with the model")
    p.add_argument("--sweep-blocks", default="32,64,128,256",
                   help="block sizes of the sweep heatmap, both axes (default 32,64,128,256)")
    p.add_argument("--out", required=True, metavar="FILE", help="the HTML file to write")
    p.add_argument("--json", action="store_true", help="also print the page's data as JSON")
    p.set_defaults(func=run)


def load_records(paths: list[str], hardware: str) -> dict:
    """Reconcile the records (``validation.reconcile``) with the report's model.

    Each record is predicted on the preset of the GPU it ran on; ``hardware`` (the report's
    ``--hardware``) is used only where a record's GPU has no preset. A record without its
    kernels' main-loop facts takes them from tilesim's table of compiles where it has them,
    as ``tilesim reconcile`` does by default (``validation.fill_facts``).
    """
    from simulator.cli import UserError
    from simulator.explain import model, records

    try:
        from validation.fill_facts import fill_loop_facts
        from validation.reconcile import reconcile
        from validation.records import read_many
    except ImportError:
        raise UserError("--records needs the validation package (validation/reconcile.py)") \
            from None
    recs, errors = read_many(paths)
    if not any(r.get("timing") for r in recs):
        skipped = f" ({len(errors)} lines skipped, the first: {errors[0]})" if errors else ""
        raise UserError("no timed records in " + ", ".join(paths) + skipped)
    recs, filled = fill_loop_facts(recs, compile_here=False)
    name = model.source()["source"]
    result = reconcile(recs, predictor=model.predict_profiled, model=name,
                       fallback_hardware=hardware)
    if not result["rows"]:
        from validation.reconcile import nothing_compared

        raise UserError(nothing_compared(result))
    section = records.from_reconcile(result)
    if filled:
        section["source"] += (f"; {filled} records took their kernels' loop facts from "
                              "tilesim's table of compiles")
    section["line_errors"] = [str(e) for e in errors]
    return section


def run(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from simulator.cli import UserError
    from simulator.cli.common import (
        hardware_from_args,
        print_json,
        problem_from_args,
        tiling_that_fits,
    )
    from simulator.explain import report
    from simulator.explain.common import parse_int_list
    from simulator.explain.model import PAIR
    from traces.tiling import Tiling

    problem = problem_from_args(args)
    blocks = tuple(parse_int_list(args.sweep_blocks, "sweep-blocks"))
    for b in blocks:
        Tiling(block_m=b, block_n=b)  # same message as any bad block size
    hw = hardware_from_args(args)
    tiling, tiling_note = tiling_that_fits(args, problem, PAIR, hw)
    out_dir = Path(args.out).parent
    if not out_dir.is_dir():  # fail before simulating, not after
        raise UserError(f"cannot write {args.out}: directory {out_dir} does not exist")
    from rich.console import Console

    with Console(stderr=True).status("building the report ...") as status:
        recs = load_records(args.records, args.hardware) if args.records else None
        status.update("simulating, sweeping, drawing ...")
        data = report.build(problem, tiling, hw, records=recs, sweep_blocks=blocks)
        report.write(data, args.out)
    if args.json:
        print_json(data)
    else:
        if tiling_note:
            print(tiling_note)
        sys.stdout.write(f"wrote {args.out}\n")
    return 0
