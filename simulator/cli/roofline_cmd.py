"""``tilesim roofline``: naive and FA2 kernels placed on a preset's roofline."""

from __future__ import annotations

import argparse

from simulator.cli.common import add_hardware_arg, add_problem_args, add_tiling_args


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "roofline", help="the roofline of a GPU preset with naive and FA2 kernels placed on it",
        description="Attainable FLOP/s = min(peak, intensity x HBM bandwidth) for the dtype's "
        "tensor-core peak; ridge point = peak / bandwidth; the exp unit's ceiling in "
        "FLOP-equivalents; every kernel of the naive and FA2 schedules at its arithmetic "
        "intensity (FLOPs per DRAM byte from the timing simulator) and the utilisation it can "
        "reach.",
    )
    add_hardware_arg(p)
    add_problem_args(p, schedule=False)
    add_tiling_args(p)
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    p.add_argument("--plot", metavar="FILE", help="write the roofline to FILE (.png/.svg)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from simulator.cli.common import (
        hardware_from_args,
        print_json,
        problem_from_args,
        tiling_that_fits,
    )
    from simulator.cli.resources_args import table_compiled_pair
    from simulator.explain import model, roofline
    from simulator.explain.common import check_plot_path

    check_plot_path(args.plot)
    hw = hardware_from_args(args)
    problem = problem_from_args(args)
    tiling, tiling_note = tiling_that_fits(args, problem, model.PAIR, hw)
    # the kernels tilesim's table of compiles has take their resources from it
    preds = model.predict_pair(problem, tiling, hw, table_compiled_pair(problem, tiling, hw))
    result = roofline.roofline(problem, tiling, hw, preds=preds)
    if args.plot:
        roofline.plot(result, args.plot)
    if args.json:
        print_json(result)
    else:
        if tiling_note:
            print(tiling_note)
        roofline.print_render(result)
    return 0
