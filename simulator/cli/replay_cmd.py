"""`tilesim replay`: counts from a trace file (equal to `tilesim count` for the same input,
registers and shared memory from the same source: the table of compiles where it has the
schedule's kernels, a compile with ``--compiled-resources``, or the estimate)."""

from __future__ import annotations

from simulator.cli.common import add_hardware_arg, print_json
from simulator.cli.resources_args import add_compiled_arg


def add_parser(sub) -> None:
    p = sub.add_parser("replay", help="count bytes and FLOPs from a trace file")
    p.add_argument("trace", help="a .parquet trace written by `tilesim trace`")
    add_hardware_arg(p)
    p.add_argument("--json", action="store_true")
    add_compiled_arg(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from simulator.cli.common import hardware_from_args
    from simulator.cli.resources_args import compiled_from_args
    from simulator.replay import check_schedule, replay_prediction
    from traces.trace import TraceError, read_parquet

    hw = hardware_from_args(args)
    trace = read_parquet(args.trace)
    try:
        check_schedule(trace)  # before its problem is looked up in the table or compiled
        compiled = compiled_from_args(args, trace.problem, trace.tiling, trace.schedule, hw)
        pred = replay_prediction(trace, hw, compiled)
    except TraceError as exc:
        raise TraceError(f"{args.trace}: {exc}") from None
    if args.json:
        print_json(pred)
    else:
        from simulator.cli.render import counts_tables, print_tables

        print_tables(counts_tables(pred))
    return 0
