"""`tilesim trace`: write a schedule's access trace (Parquet) or a DRAM request trace."""

from __future__ import annotations

from simulator.cli.common import (
    add_problem_args,
    add_tiling_args,
    check_output_paths,
    problem_from_args,
    tiling_from_args,
    write_atomically,
)

FORMATS = ("parquet", "ramulator2", "dramsim3")


def add_parser(sub) -> None:
    p = sub.add_parser("trace", help="write the access trace of a schedule")
    add_problem_args(p)
    add_tiling_args(p)
    p.add_argument("--out", required=True, help="output file")
    p.add_argument("--format", choices=FORMATS, default="parquet")
    p.set_defaults(func=run)


def run(args) -> int:
    from simulator.prediction import tool_version
    from traces import export
    from traces.schedules import build_schedule
    from traces.trace import Trace, iter_kernel_traces, write_parquet

    check_output_paths(args.out)
    sched = build_schedule(problem_from_args(args), tiling_from_args(args), args.schedule)
    if args.format == "parquet":
        trace = Trace.from_schedule(sched, tool_version())
        write_atomically(args.out, lambda tmp: write_parquet(trace, tmp))
        message = f"{trace.n_records:,} records"
    else:
        width = export.address_width(sched.device_bytes)

        def records():
            return (k.records for k in iter_kernel_traces(sched))

        def write(tmp):
            nonlocal message
            with open(tmp, "wb") as out:
                if args.format == "ramulator2":
                    lines = export.write_ramulator2(records(), out, width)
                else:
                    total = export.count_requests(records())
                    lines = export.write_dramsim3(records(), out, width, total)
            message = f"{lines:,} requests of {export.REQUEST_BYTES} bytes"

        message = ""
        write_atomically(args.out, write)
    import sys

    sys.stderr.write(f"wrote {args.out}: {message}\n")
    return 0
