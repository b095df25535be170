"""How one-shot CTAs merged into jobs move the aggregated engine away from the full engine.

The aggregated engine runs the one-shot CTAs of a loop-less kernel (naive attention's QK
and softmax) of more than ``MAX_JOBS_PER_SLOT`` waves as jobs of several CTAs
(``simulator.sim.fluid._jobs``). This script measures, per kernel and against the full
engine, the aggregated engine's time and DRAM bytes and its events, with the threshold at
64, 16 and 8 waves, and with a job's CTAs a wave apart (the engine's grouping) or side by
side in launch order (the grouping before 2026-12-07). Run from the repository root
(about 5 minutes on two cores, most of it the full engine on the H200 cases):

    python benchmarks/merged_jobs.py

BENCHMARKS.md ("Accuracy of the aggregation") quotes its output.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator.hardware import load_hardware  # noqa: E402
from simulator.occupancy import CompiledResources  # noqa: E402
from simulator.sim import fluid, run  # noqa: E402
from traces.problem import AttentionProblem  # noqa: E402
from traces.tiling import Tiling  # noqa: E402

H100 = load_hardware("h100-sxm5")
H200 = load_hardware("h200-sxm")
# Naive attention's compiles on the H200 records of 2026-11-30 (Triton 3.6.0, sm_90),
# rows of 1024: registers and shared memory at 64x64, 4 warps.
D64 = {"naive_qk": CompiledResources(62, 16384), "naive_softmax": CompiledResources(22, 16),
       "naive_pv": CompiledResources(62, 32768)}


def few_sms(hw, count: int):
    """``hw`` with ``count`` SMs and L2 in proportion (the full engine stays quick)."""
    return dataclasses.replace(hw, sm_count=count, l2_bytes=hw.l2_bytes * count // hw.sm_count)


CASES = {
    "h200 B=4 H=16 N=1k d=64 64x64 w4": (AttentionProblem(4, 16, 1024, 64),
                                         Tiling(64, 64, 2, 4), H200, D64),
    "h200 B=16 H=16 N=1k d=64 64x64 w4": (AttentionProblem(16, 16, 1024, 64),
                                          Tiling(64, 64, 2, 4), H200, D64),
    "h100/4 SMs B=1 H=4 N=1k d=64 64x64 w4": (AttentionProblem(1, 4, 1024, 64),
                                              Tiling(64, 64, 2, 4),
                                              dataclasses.replace(H100, sm_count=4), D64),
    "h200/8 SMs B=1 H=8 N=2k d=64 64x64 w4": (AttentionProblem(1, 8, 2048, 64),
                                              Tiling(64, 64, 2, 4), few_sms(H200, 8), None),
    "h200/8 SMs B=2 H=16 N=1k d=128 128x64 w4": (AttentionProblem(2, 16, 1024, 128),
                                                 Tiling(128, 64, 2, 4), few_sms(H200, 8),
                                                 None),
    "h100/8 SMs B=1 H=16 N=1k d=256 64x64 w4": (AttentionProblem(1, 16, 1024, 256),
                                                Tiling(64, 64, 2, 4), few_sms(H100, 8), None),
    "h100/8 SMs B=1 H=4 N=4k d=64 64x64 w4 causal": (
        AttentionProblem(1, 4, 4096, 64, causal=True), Tiling(64, 64, 2, 4),
        few_sms(H100, 8), None),
    "h200/16 SMs B=1 H=8 N=2k d=128 64x128 w8, 1 stage": (
        AttentionProblem(1, 8, 2048, 128), Tiling(64, 128, 1, 8), few_sms(H200, 16), None),
}
VARIANTS = [(64, True), (16, True), (8, True), (64, False), (16, False)]
wave_apart = fluid._jobs  # the engine's grouping


def side_by_side(grid: int, slots: int, loopless: bool) -> fluid.Jobs:
    """The engine's jobs' sizes, each job's CTAs consecutive in launch order."""
    jobs = wave_apart(grid, slots, loopless)
    if jobs.order is None:
        return jobs
    per_job = int(jobs.first[1] - jobs.first[0])
    return fluid.Jobs(None, np.arange(0, grid, per_job, dtype=np.int64))


def relative(new: float, ref: float) -> str:
    return f"{(new / ref - 1) * 100:+.1f} %" if ref else "n/a"


def main() -> None:
    print("| case | kernel | waves | engine | time | DRAM bytes | events | wall |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    kept = fluid.MAX_JOBS_PER_SLOT
    for case, (problem, tiling, hw, compiled) in CASES.items():
        started = time.perf_counter()
        full = run(problem, tiling, "naive", hw, "full", compiled)
        rows = [("full", full, time.perf_counter() - started)]
        for threshold, apart in VARIANTS:
            fluid.MAX_JOBS_PER_SLOT = threshold
            fluid._jobs = wave_apart if apart else side_by_side
            started = time.perf_counter()
            fast = run(problem, tiling, "naive", hw, "aggregated", compiled)
            label = f"{threshold} waves, {'a wave apart' if apart else 'side by side'}"
            rows.append((label, fast, time.perf_counter() - started))
        fluid.MAX_JOBS_PER_SLOT, fluid._jobs = kept, wave_apart
        for label, sim, wall in rows:
            for ref, k in zip(full.runs, sim.runs, strict=True):
                if k.name == "naive_pv":  # loops: never merged
                    continue
                waves = ref.cta_start.size / ref.slots
                print(f"| {case} | {k.name} | {waves:.0f} | {label} | "
                      f"{relative(k.time_s, ref.time_s)} | "
                      f"{relative(k.dram_read + k.dram_write, ref.dram_read + ref.dram_write)}"
                      f" | {k.events:,} | {wall:.1f} s |", flush=True)


if __name__ == "__main__":
    main()
