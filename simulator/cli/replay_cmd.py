"""`tilesim replay`: counts from a trace file (equal to `tilesim count` for the same input)."""

from __future__ import annotations

from simulator.cli.common import add_hardware_arg, print_json


def add_parser(sub) -> None:
    p = sub.add_parser("replay", help="count bytes and FLOPs from a trace file")
    p.add_argument("trace", help="a .parquet trace written by `tilesim trace`")
    add_hardware_arg(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    from simulator.cli.common import hardware_from_args
    from simulator.replay import replay_prediction
    from traces.trace import TraceError, read_parquet

    hw = hardware_from_args(args)
    trace = read_parquet(args.trace)
    try:
        pred = replay_prediction(trace, hw)
    except TraceError as exc:
        raise TraceError(f"{args.trace}: {exc}") from None
    if args.json:
        print_json(pred)
    else:
        from simulator.cli.render import counts_tables, print_tables

        print_tables(counts_tables(pred))
    return 0
