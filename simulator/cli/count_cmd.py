"""`tilesim count`: exact traffic, FLOPs and SRAM of a schedule (no timing)."""

from __future__ import annotations

from simulator.cli.common import (
    add_hardware_arg,
    add_problem_args,
    add_tiling_args,
    hardware_from_args,
    print_json,
    problem_from_args,
    tiling_that_fits,
)
from simulator.cli.resources_args import add_compiled_arg, compiled_from_args


def add_parser(sub) -> None:
    p = sub.add_parser("count", help="exact bytes, FLOPs and SRAM per kernel and tensor")
    add_hardware_arg(p)
    add_problem_args(p)
    add_tiling_args(p)
    p.add_argument("--json", action="store_true", help="print the prediction JSON")
    add_compiled_arg(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from simulator.prediction import count_prediction

    hw = hardware_from_args(args)
    problem = problem_from_args(args)
    tiling, tiling_note = tiling_that_fits(args, problem, (args.schedule,), hw)
    compiled = compiled_from_args(args, problem, tiling, args.schedule, hw)
    pred = count_prediction(problem, tiling, args.schedule, hw, compiled)
    if args.json:
        print_json(pred)
    else:
        from simulator.cli.render import counts_tables, print_tables

        if tiling_note:
            print(tiling_note)
        print_tables(counts_tables(pred))
    return 0
