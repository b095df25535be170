"""``tilesim simulate``: time a schedule on a GPU preset with the discrete-event model.

Prints the counts tables of ``tilesim count`` with DRAM bytes and times filled in, then a
timing summary (time, TFLOP/s by the papers' FLOP convention, achieved bandwidth per level,
occupancy and what bounds each kernel), or the full prediction JSON with ``--json``.
``--timeline run.json`` writes a Chrome Trace Event file (Perfetto UI opens it). A note
follows for every kernel whose warp layout computes a tile more than once
(``traces.schedules.mma_layout``), and for decode whose split kernel leaves half the SMs
or more without a CTA, the split count that would give each one. A tiling whose CTA
cannot fit on an SM is refused with one line and exit code 2.
"""

from __future__ import annotations

from simulator.cli.common import (
    add_hardware_arg,
    add_problem_args,
    add_tiling_args,
    check_output_paths,
    hardware_from_args,
    print_json,
    problem_from_args,
    tiling_that_fits,
)
from simulator.cli.resources_args import add_compiled_arg, compiled_from_args
from simulator.sim import L2_STARTS
from traces.schedules.mma_layout import MMA_TILE_M as MMA_ROWS
from traces.schedules.mma_layout import parse_layout_label, replication


def add_parser(sub) -> None:
    p = sub.add_parser("simulate", help="predict time and DRAM traffic (SimPy model of the GPU)",
                       description=__doc__.split("\n\n")[0])
    add_hardware_arg(p)
    add_problem_args(p)
    add_tiling_args(p)
    p.add_argument("--json", action="store_true", help="print the prediction JSON")
    p.add_argument("--timeline", metavar="PATH", help="write a Chrome Trace Event file")
    add_compiled_arg(p)
    p.add_argument("--mode", choices=("auto", "full", "aggregated"), default="auto",
                   help="full: an event per tile step; aggregated: CTAs as fluid jobs "
                        "(auto picks by size)")
    p.add_argument("--l2-start", choices=L2_STARTS, default="cold",
                   help="what L2 holds at the start: cold, nothing; dirty, the preset's L2 "
                        "full of another program's dirty lines, as triton.testing.do_bench "
                        "leaves it (its writes-back cost HBM time; bytes of none of the "
                        "run's tensors)")
    p.set_defaults(func=run)


def run(args) -> int:
    from simulator.sim import predict

    hw = hardware_from_args(args)
    check_output_paths(args.timeline)
    problem = problem_from_args(args)
    tiling, tiling_note = tiling_that_fits(args, problem, (args.schedule,), hw)
    compiled = compiled_from_args(args, problem, tiling, args.schedule, hw)
    pred, sim = predict(problem, tiling, args.schedule, hw, args.mode, compiled,
                        args.l2_start)
    if args.timeline:
        from simulator.sim.timeline import write_chrome_trace

        write_chrome_trace(sim, args.timeline)
    if args.json:
        print_json(pred)
        return 0
    from simulator.cli.render import counts_tables, print_tables, spill_notes

    if tiling_note:
        print(tiling_note)
    print_tables(counts_tables(pred) + [timing_table(pred)])
    for note in (repeated_work_notes(pred) + spill_notes({args.schedule: pred})
                 + split_notes(pred, problem, tiling, hw)):
        print(note)
    if args.timeline:
        print(f"timeline written to {args.timeline}")
    return 0


def timing_table(pred: dict):
    from rich.table import Table

    from simulator.cli.render import fmt_time

    table = Table(title="simulated timing", title_justify="left")
    for col in ("kernel", "time", "TFLOP/s", "HBM GB/s", "L2 GB/s", "CTAs/SM", "waves",
                "bound", "utilization"):
        table.add_column(col, justify="left" if col in ("kernel", "bound", "utilization")
                         else "right", no_wrap=True)
    for k in pred["kernels"]:
        util = " ".join(f"{name.removeprefix('sm_')} {value:.0%}"
                        for name, value in k["utilization"].items() if value >= 0.1)
        table.add_row(k["name"], fmt_time(k["time_s"]), f"{k['achieved']['tflops']:.1f}",
                      f"{k['achieved']['hbm_bytes_per_s'] / 1e9:,.0f}",
                      f"{k['achieved']['l2_bytes_per_s'] / 1e9:,.0f}",
                      str(k["occupancy"]["ctas_per_sm"]), f"{k['occupancy']['waves']:.2f}",
                      k["bound"], util)
    a, sim = pred["achieved"], pred["simulation"]
    table.add_section()
    table.add_row("total", fmt_time(pred["time_s"]), f"{a['convention_tflops']:.1f}*",
                  f"{a['hbm_bytes_per_s'] / 1e9:,.0f}", f"{a['l2_bytes_per_s'] / 1e9:,.0f}",
                  str(pred["ctas_per_sm"]), "", pred["bound"],
                  f"L2 hit rate {sim['l2_load_hit_rate']:.1%}"
                  if sim["l2_load_hit_rate"] is not None else "")
    table.caption = (f"* total TFLOP/s counts the papers' convention FLOPs; kernel rows count "
                     f"executed tensor FLOPs. {sim['mode']} simulation: {sim['events']:,} "
                     f"events in {sim['wall_s']:.2f} s")
    foreign = pred["bytes"].get("foreign_dram_write")
    if foreign:
        table.caption += (f". L2 started dirty: {foreign / 1e6:,.1f} MB of another program's "
                          f"data written back, in the HBM GB/s above")
    return table


def split_notes(pred: dict, problem, tiling, hw) -> list[str]:
    """For decode whose split kernel leaves at least half the GPU's SMs without a CTA
    (one CTA a batch, K/V head and split): the split count, a power of two, that gives
    every SM one, within what the K/V blocks allow; no line otherwise."""
    from dataclasses import replace

    from traces.problem import ProblemError
    from traces.schedules import decode
    from traces.schedules.base import cdiv

    def refused(splits: int) -> bool:
        try:
            decode.check(problem, replace(tiling, split_kv=splits))
        except ProblemError:  # chunks left empty
            return True
        return False

    split = next((k for k in pred["kernels"] if k["name"] == "decode_split"), None)
    if split is None or 2 * split["grid"] > hw.sm_count:
        return []
    heads = split["grid"] // tiling.split_kv  # batch x K/V heads
    blocks = cdiv(problem.seq_kv, tiling.block_n)
    more = 1
    while heads * more < hw.sm_count and more * 2 <= blocks:
        more *= 2
    while more > tiling.split_kv and refused(more):
        more //= 2
    line = (f"note: decode_split runs {split['grid']} CTAs on {hw.sm_count} SMs "
            f"(batch x K/V heads x --split-kv {tiling.split_kv})")
    if more <= tiling.split_kv:
        return [f"{line}; its keys have {blocks} blocks of {tiling.block_n}, too few to split "
                f"further (a smaller --block-n splits finer)"]
    return [f"{line}; --split-kv {more} gives {heads * more} (`tilesim sweep --schedule "
            f"decode` ranks the split counts)"]


def repeated_work_notes(pred: dict) -> list[str]:
    """One line per kernel whose warp layout computes part of its work more than once
    (``simulator.prediction.warp_layout``): which tile, and what it costs."""
    notes = []
    for k in pred["kernels"]:
        layout = k.get("warp_layout")
        if not layout or max(layout["copies"].values()) <= 1:
            continue
        for label in layout["matmuls"]:
            result, warps = parse_layout_label(label)
            copies, wm = replication(result, warps)[0], warps[0]
            if copies > 1:
                break
        else:
            continue  # columns replicated, not rows: no advice to give
        notes.append(
            f"note: {k['name']} lays {wm} warps of {MMA_ROWS} rows along a {result.m}x"
            f"{result.n} tile ({layout['instruction']}), so its warps compute it {copies} times: "
            f"{layout['copies']['tensor']:.2f}x the matmul work, "
            f"{layout['copies']['elementwise']:.0f}x the elementwise work; "
            f"{MMA_ROWS * wm} rows or fewer warps avoid it")
    return notes
