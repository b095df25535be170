"""HBM reads of parts of lines: a missed byte of a load whose contiguous runs are shorter
than an L2 line takes ``line / run`` bytes of HBM's capacity (``program.hbm_line_cost``).

Naive P·V reads P (N x N) in ``BM x BN`` tiles: at ``BN = 32`` in bf16 each tile row is
64 bytes, half a line, and the H200 read P at 2.3 TB/s where whole lines streamed at 3.8
(BENCHMARKS.md, "HBM reads of parts of lines"). The engines must charge those reads twice
HBM's time without counting a byte more of DRAM traffic; FA2's and decode's tiles are whole
rows of their tensors, so nothing changes for them.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from simulator.hardware import load_hardware
from simulator.sim import run
from simulator.sim.program import schedule_programs
from traces.problem import AttentionProblem
from traces.schedules import build_schedule
from traces.tiling import Tiling

HW = load_hardware("h200-sxm")
NAIVE = AttentionProblem(2, 8, 1024, 64)


def _costs(problem: AttentionProblem, tiling: Tiling, schedule: str, hw=HW) -> dict:
    """{(kernel, tensor, LOAD or STORE): hbm_cost} over every access of the schedule."""
    sched = build_schedule(problem, tiling, schedule)
    out = {}
    for prog in schedule_programs(sched, hw):
        for phase in (prog.pre, prog.loop, prog.post):
            for k in range(phase.kind.size):
                key = (prog.name, sched.tensor_names[phase.tensor[k]], int(phase.kind[k]))
                out[key] = float(phase.hbm_cost[k])
    return out


def test_a_load_of_half_lines_costs_twice_and_whole_rows_cost_once():
    costs = _costs(NAIVE, Tiling(block_m=64, block_n=32), "naive")
    assert costs[("naive_pv", "p", 0)] == 2.0  # 32 bf16 columns of 1024: 64 B rows
    assert costs[("naive_pv", "v", 0)] == 1.0  # 32 whole rows of V: one 4 KB run
    assert costs[("naive_qk", "s", 1)] == 1.0  # stores: L2 writes back whole lines
    assert costs[("naive_softmax", "s", 0)] == 1.0  # whole rows of S
    wide = _costs(NAIVE, Tiling(block_m=64, block_n=64), "naive")
    assert wide[("naive_pv", "p", 0)] == 1.0  # 128 B rows: whole lines
    narrow = _costs(NAIVE, Tiling(block_m=64, block_n=16), "naive")
    assert narrow[("naive_pv", "p", 0)] == 4.0  # 32 B rows: one sector of four
    # The same tile in fp32 is 128 B a row.
    fp32 = _costs(AttentionProblem(2, 8, 1024, 64, dtype="fp32"), Tiling(block_m=64, block_n=32),
                  "naive")
    assert fp32[("naive_pv", "p", 0)] == 1.0


ROWS_OF_FP32 = {(k, t, 0): 2.0 for k in ("fa2_bwd_dkdv", "fa2_bwd_dq") for t in ("lse", "delta")}


@pytest.mark.parametrize("schedule,problem,tiling,short", [
    ("fa2", AttentionProblem(2, 8, 1024, 64, causal=True, pass_="fwd+bwd"),
     Tiling(block_m=64, block_n=32), {}),
    # 16 rows of the fp32 LSE and delta: 64 B, the one short run of FA2
    ("fa2", AttentionProblem(2, 8, 1024, 128, pass_="fwd+bwd"), Tiling(block_m=16, block_n=64),
     ROWS_OF_FP32),
    # decode's reduction reads each split's LSE alone: 4 B, a 32 B sector
    ("decode", AttentionProblem(4, 32, 1, 64, seq_kv=2048, kv_heads=8),
     Tiling(block_m=16, block_n=32, split_kv=4), {("decode_reduce", "lse_partial", 0): 4.0}),
])
def test_flash_attention_and_decode_read_whole_lines(schedule, problem, tiling, short):
    """Their Q, K, V, O and gradient tiles are whole rows of the tensors: runs of kilobytes.
    Only the fp32 vectors read a few rows at a time are shorter than a line."""
    costs = _costs(problem, tiling, schedule)
    assert {key: cost for key, cost in costs.items() if cost != 1.0} == short


def _pv_alone(hw, mode: str):
    """Naive P·V alone on a cold L2 (``run(alone=...)``): P was never written, so every
    read of it misses, as at sizes where P outgrows L2."""
    (pv,) = run(STREAM, Tiling(block_m=64, block_n=32), "naive", hw, mode, alone=2).runs
    assert pv.name == "naive_pv"
    return pv


# 1024 CTAs of P·V, 134 MB of P: HBM-bound on the H200.
STREAM = AttentionProblem(4, 16, 1024, 64)


@pytest.mark.parametrize("mode", ["full", "aggregated"])
def test_half_lines_take_hbm_about_twice_as_long_and_move_the_same_bytes(mode):
    """With 64-byte lines (where P's 64-byte rows would be whole lines) the same reads take
    about half the time; DRAM moves the same bytes either way."""
    half, whole = (_pv_alone(replace(HW, l2_line_bytes=line), mode) for line in (128, 64))
    p_bytes = 4 * 16 * 1024 * 1024 * 2
    # P misses once either way; V's few misses depend a little on the timing.
    assert half.dram_read >= p_bytes and whole.dram_read >= p_bytes
    assert half.dram_read == pytest.approx(whole.dram_read, rel=1e-3)
    assert half.hbm_line_extra_bytes == p_bytes  # each byte of P once more
    assert whole.hbm_line_extra_bytes == 0.0
    # HBM's busy time counts the extra; its traffic does not.
    assert half.hbm_busy_bytes == half.hbm_bytes + p_bytes
    ratio = half.time_s / whole.time_s
    # Not quite 2: the latency's share of HBM's capacity (``costs.miss_occupancy``) and the
    # first loads' latency are the same either way.
    assert 1.5 < ratio < 2.0, ratio


def test_hbm_bound_while_it_moves_less_than_half_its_rate():
    """The bound counts HBM's busy time, not its bytes: P·V at BN = 32 keeps HBM busy while
    it moves P at about half HBM's rate."""
    from simulator.sim import predict

    pred, _ = predict(AttentionProblem(4, 16, 1024, 64), Tiling(block_m=64, block_n=32),
                      "naive", HW)
    pv = next(k for k in pred["kernels"] if k["name"] == "naive_pv")
    assert pv["bound"] == "hbm"
    assert pv["achieved"]["hbm_bytes_per_s"] < 0.5 * HW.hbm_effective_bytes_per_s
    assert pv["utilization"]["hbm"] > 0.7
