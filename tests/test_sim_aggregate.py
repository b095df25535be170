"""The aggregated engine against the full engine: the stated error bound, tested.

``simulator.sim.fluid.ERROR_BOUND`` is what the aggregation may cost, per kernel: its time
and its DRAM bytes within that fraction of the full (event-per-tile-step) engine's. The
matrix spans every schedule, one to five stages, with and without causal masking and GQA,
one wave and several; one case shrinks L2 to 2 MiB so that, as in a causal FA2 forward at
N = 128k on an H100, the K/V of the resident heads do not fit and hits depend on the order
the CTAs run in. One runs naive attention with the registers its kernels compile to (16
one-row softmax CTAs per SM) and a score matrix larger than L2: HBM-bound one-shot CTAs,
which the aggregated engine once ran in lock-step (a third slower than the full engine).
"""

from __future__ import annotations

import dataclasses

import pytest

from simulator.hardware import load_hardware
from simulator.occupancy import CompiledResources
from simulator.sim import run
from simulator.sim.fluid import ERROR_BOUND
from traces.problem import AttentionProblem
from traces.tiling import Tiling

HW = load_hardware("h100-sxm5")
SMALL_L2 = dataclasses.replace(HW, l2_bytes=2 * 2**20)
# Registers of naive attention's kernels at BM = BN = 64, 4 warps, d = 64 (sm_90 compile of
# the Triton twins with `tilesim kernels resources`, Triton 3.9; softmax for rows of 1024).
NAIVE_COMPILED = {"naive_qk": CompiledResources(60), "naive_softmax": CompiledResources(22),
                  "naive_pv": CompiledResources(58)}

MATRIX = {
    "fa2 one wave": ("fa2", AttentionProblem(1, 16, 2048, 128), Tiling(128, 64, 2), HW),
    "fa2 causal": ("fa2", AttentionProblem(1, 16, 2048, 128, causal=True), Tiling(), HW),
    "fa2 causal 1 stage": ("fa2", AttentionProblem(2, 16, 2048, 128, causal=True),
                           Tiling(64, 64, 1), HW),
    "fa2 d64 3 stages": ("fa2", AttentionProblem(1, 8, 4096, 64), Tiling(128, 128, 3, 8), HW),
    "fa2 fwd+bwd": ("fa2", AttentionProblem(1, 8, 2048, 128, pass_="fwd+bwd"), Tiling(), HW),
    "naive": ("naive", AttentionProblem(1, 4, 2048, 128), Tiling(128, 64), HW),
    "fa1": ("fa1", AttentionProblem(1, 16, 1024, 64), Tiling(64, 64), HW),
    # Two waves of split-KV CTAs. With one wave of one CTA per SM (B=2 here) the full
    # engine's CTAs run in lock-step and the aggregation errs by more: a stress case of
    # BENCHMARKS.md.
    "decode gqa": ("decode", AttentionProblem(8, 32, 1, 128, seq_kv=4096, kv_heads=8),
                   Tiling(block_n=64, split_kv=8), HW),
    "fa2 causal, L2 too small": ("fa2", AttentionProblem(1, 8, 8192, 64, causal=True),
                                 Tiling(), SMALL_L2),
    "naive compiled, HBM-bound": ("naive", AttentionProblem(2, 16, 1024, 64),
                                  Tiling(64, 64, 2, 4),
                                  dataclasses.replace(HW, l2_bytes=16 * 2**20), NAIVE_COMPILED),
}


@pytest.mark.parametrize("case", sorted(MATRIX))
def test_aggregated_within_bound_of_full(case):
    name, problem, tiling, hw, *compiled = MATRIX[case]
    compiled = compiled[0] if compiled else None
    full = run(problem, tiling, name, hw, "full", compiled)
    fast = run(problem, tiling, name, hw, "aggregated", compiled)
    for a, b in zip(full.runs, fast.runs, strict=True):
        assert b.time_s == pytest.approx(a.time_s, rel=ERROR_BOUND["time"]), a.name
        dram_full, dram_fast = a.dram_read + a.dram_write, b.dram_read + b.dram_write
        assert dram_fast == pytest.approx(dram_full, rel=ERROR_BOUND["dram_bytes"]), a.name
        # Both engines see exactly the same accesses; only the order and timing differ.
        assert b.l2_hit + b.dram_read == a.l2_hit + a.dram_read
    assert fast.events < full.events
