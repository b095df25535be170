"""The aggregated engine against the full engine outside the bounded matrix.

``tests/test_sim_aggregate.py`` asserts the aggregation's error bound on a matrix of
moderate cases. This script measures the cases known to fall outside it, per kernel: the
aggregated engine's time and DRAM bytes relative to the full engine's. Run from the
repository root (about a quarter of an hour on two cores, most of it the full engine on
the last case):

    python benchmarks/aggregation_stress.py

BENCHMARKS.md ("Accuracy of the aggregation") quotes its output.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator.cli.resources_args import table_compiled  # noqa: E402
from simulator.hardware import load_hardware  # noqa: E402
from simulator.occupancy import CompiledResources  # noqa: E402
from simulator.sim import run  # noqa: E402
from traces.problem import AttentionProblem  # noqa: E402
from traces.tiling import Tiling  # noqa: E402

H100 = load_hardware("h100-sxm5")
H200 = load_hardware("h200-sxm")
SMALL_L2 = dataclasses.replace(H100, l2_bytes=2 * 2**20)
DECODE = AttentionProblem(2, 32, 1, 128, seq_kv=8192, kv_heads=8)
# Naive attention's registers at 64x64, 4 warps, d = 64 (sm_90 compile, Triton 3.9).
NAIVE_COMPILED = {"naive_qk": CompiledResources(60), "naive_softmax": CompiledResources(22),
                  "naive_pv": CompiledResources(58)}
FEW_SMS = dataclasses.replace(H100, sm_count=4)

CASES = {
    # L2 shrunk to 2 MiB: convoys of CTAs in the full engine.
    "fa2 causal bwd B=2 H=8 N=4096 d=64, L2 2 MiB":
        ("fa2", AttentionProblem(2, 8, 4096, 64, causal=True, pass_="bwd"), Tiling(), SMALL_L2),
    "fa1 fwd B=1 H=32 N=2048 d=64, L2 2 MiB":
        ("fa1", AttentionProblem(1, 32, 2048, 64), Tiling(64, 64), SMALL_L2),
    "naive fwd B=1 H=2 N=2048 d=64, 1 stage, L2 2 MiB":
        ("naive", AttentionProblem(1, 2, 2048, 64), Tiling(num_stages=1), SMALL_L2),
    # One wave of one CTA per SM: lock-step in the full engine.
    "decode B=2 H=32 Hkv=8 Nkv=8192 d=128, BN=64, split 8, 2 stages":
        ("decode", DECODE, Tiling(block_n=64, num_stages=2, split_kv=8), H100),
    "decode B=2 H=32 Hkv=8 Nkv=8192 d=128, BN=64, split 8, 1 stage":
        ("decode", DECODE, Tiling(block_n=64, num_stages=1, split_kv=8), H100),
    # Naive attention with the estimated registers (4 CTAs per SM): the aggregated engine
    # makes a one-shot CTA wait for the write-backs its loads cause; the full engine not.
    "naive fwd h200 B=4 H=16 N=1024 d=64, 64x64 w4":
        ("naive", AttentionProblem(4, 16, 1024, 64), Tiling(64, 64, 2, 4), H200),
    "naive fwd h200 B=2 H=16 N=2048 d=64, 64x64 w4":
        ("naive", AttentionProblem(2, 16, 2048, 64), Tiling(64, 64, 2, 4), H200),
    "naive fwd h200 B=2 H=16 N=2048 d=64, 128x64 w8":
        ("naive", AttentionProblem(2, 16, 2048, 64), Tiling(128, 64, 2, 8), H200),
    "naive fwd h100 B=4 H=16 N=1024 d=64, 64x64 w4":
        ("naive", AttentionProblem(4, 16, 1024, 64), Tiling(64, 64, 2, 4), H100),
    # More than MAX_JOBS_PER_SLOT waves (few SMs here, to keep the full engine quick): the
    # aggregated engine merges one-shot CTAs into jobs of several (one phase each since
    # 2026-11-30; summed phase by phase before, such jobs stayed in step).
    "naive fwd h100 with 4 SMs B=1 H=16 N=1024 d=64, compiled registers, L2 2 MiB":
        ("naive", AttentionProblem(1, 16, 1024, 64), Tiling(64, 64, 2, 4),
         dataclasses.replace(FEW_SMS, l2_bytes=2 * 2**20), NAIVE_COMPILED),
    "naive fwd h100 with 4 SMs B=2 H=16 N=1024 d=64, compiled registers":
        ("naive", AttentionProblem(2, 16, 1024, 64), Tiling(64, 64, 2, 4), FEW_SMS,
         NAIVE_COMPILED),
    "naive fwd h100 with 8 SMs B=1 H=16 N=1024 d=64, compiled registers, L2 4 MiB":
        ("naive", AttentionProblem(1, 16, 1024, 64), Tiling(64, 64, 2, 4),
         dataclasses.replace(H100, sm_count=8, l2_bytes=4 * 2**20), NAIVE_COMPILED),
    # A shape of the validation plan at full size (the full engine takes minutes): softmax
    # compiles to 91 registers for rows of 8192 (5 CTAs per SM), 7 CTAs a job.
    "naive fwd h200 B=2 H=16 N=8192 d=64, 64x64 w4, compiled registers":
        ("naive", AttentionProblem(2, 16, 8192, 64), Tiling(64, 64, 2, 4), H200,
         {**NAIVE_COMPILED, "naive_softmax": CompiledResources(91)}),
    # One wave of P.V CTAs after a softmax that left part of P in L2, with the table's
    # compiles (found comparing the engines on random problems, 2026-12-07): which CTAs
    # find their P resident depends on which run ahead, which only the full engine follows.
    "naive fwd h100 B=2 H=16 Hkv=2 N=1024 d=64, 128x64 w4, the table's compiles":
        ("naive", AttentionProblem(2, 16, 1024, 64, kv_heads=2), Tiling(128, 64, 2, 4), H100,
         "table"),
}


def relative(new: float, ref: float) -> str:
    return f"{(new / ref - 1) * 100:+.1f} %" if ref else "n/a"


def main() -> None:
    print("| case | kernel | time | DRAM bytes |")
    print("| --- | --- | --- | --- |")
    for case, (schedule, problem, tiling, hw, *compiled) in CASES.items():
        compiled = compiled[0] if compiled else None
        if compiled == "table":
            compiled = table_compiled(problem, tiling, schedule, hw)
        full = run(problem, tiling, schedule, hw, "full", compiled)
        fast = run(problem, tiling, schedule, hw, "aggregated", compiled)
        for a, b in zip(full.runs, fast.runs, strict=True):
            dram_full, dram_fast = a.dram_read + a.dram_write, b.dram_read + b.dram_write
            print(f"| {case} | {a.name} | {relative(b.time_s, a.time_s)} | "
                  f"{relative(dram_fast, dram_full)} |", flush=True)


if __name__ == "__main__":
    main()
