"""`tilesim trace`: write a schedule's access trace (Parquet), a DRAM request trace, or the
simulated run as a Chrome trace.

Parquet, Ramulator 2 and DRAMsim3 hold the access stream, which the hardware does not
change (the Parquet metadata names the hardware it was written for). ``--format chrome`` is
the timed form of the same trace: the timing simulator runs the schedule on the hardware
and writes its timeline (kernels, a track per CTA slot of each SM, HBM/L2 bandwidth and
SRAM counters; ``simulator.sim.timeline``), as ``simulate --timeline`` does, with the
registers and shared memory ``simulate`` takes (the table of compiles where it has the
schedule's kernels, ``--compiled-resources``, ``--estimated-resources``).
"""

from __future__ import annotations

from simulator.cli.common import (
    add_hardware_arg,
    add_problem_args,
    add_tiling_args,
    check_output_paths,
    hardware_from_args,
    problem_from_args,
    tiling_that_fits,
    write_atomically,
)
from simulator.cli.resources_args import add_compiled_arg

FORMATS = ("parquet", "chrome", "ramulator2", "dramsim3")


def add_parser(sub) -> None:
    p = sub.add_parser("trace", help="write the access trace of a schedule")
    add_hardware_arg(p)
    add_problem_args(p)
    add_tiling_args(p)
    p.add_argument("--out", required=True, help="output file")
    p.add_argument("--format", choices=FORMATS, default="parquet",
                   help="parquet: the access trace; chrome: the simulated run on --hardware "
                   "(Perfetto opens it); ramulator2, dramsim3: DRAM request traces")
    add_compiled_arg(p)  # for --format chrome, as simulate takes them
    p.set_defaults(func=run)


def run(args) -> int:
    import sys

    from simulator.prediction import tool_version
    from traces import export
    from traces.schedules import build_schedule
    from traces.trace import Trace, iter_kernel_traces, write_parquet

    check_output_paths(args.out)
    hw = hardware_from_args(args)
    problem = problem_from_args(args)
    tiling, tiling_note = tiling_that_fits(args, problem, (args.schedule,), hw)
    if tiling_note:
        sys.stderr.write(tiling_note + "\n")
    if args.format == "chrome":
        from simulator.cli.render import fmt_time
        from simulator.cli.resources_args import compiled_from_args
        from simulator.sim import predict
        from simulator.sim.timeline import write_chrome_trace

        compiled = compiled_from_args(args, problem, tiling, args.schedule, hw)
        pred, sim = predict(problem, tiling, args.schedule, hw, compiled=compiled)
        write_chrome_trace(sim, args.out)
        sys.stderr.write(f"wrote {args.out}: the simulated run on {hw.name}, "
                         f"{fmt_time(pred['time_s'])}\n")
        return 0
    sched = build_schedule(problem, tiling, args.schedule)
    if args.format == "parquet":
        trace = Trace.from_schedule(sched, tool_version(), hw.name)
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
    sys.stderr.write(f"wrote {args.out}: {message}\n")
    return 0
