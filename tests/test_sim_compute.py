"""The compute model: the units' busy time, the CTA's own critical path, iteration overhead.

``simulator.sim.compute`` says a step keeps the SM's units (tensor, exp and FP32 pipes and
shared memory's) busy for ``max(units) + (1 - unit_overlap) x (sum(units) - max(units))``
seconds, and lasts, for its CTA alone,
``max(busy, sum(units) / c)`` with ``c`` warps per processing block. The engine tests take
one CTA alone on the GPU, whose loop is compute-bound, so that every other term cancels
between two runs that differ only in warps or overhead: the difference in time is the
difference in the CTA's summed compute path.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simulator.hardware import load_hardware
from simulator.sim import run
from simulator.sim.compute import busy_seconds, path_seconds, uses_wgmma
from simulator.sim.program import schedule_programs
from traces.problem import AttentionProblem
from traces.schedules import build_schedule
from traces.tiling import Tiling

HW = load_hardware("h100-sxm5")
OVERLAPPED = dataclasses.replace(HW, unit_overlap=1.0)  # only the busiest unit counts
UNITS = np.array([[3.0, 1.0], [2.0, 1.0], [1.0, 4.0]])  # [tensor, exp, fp32] x two steps


def test_path_of_one_warp_per_block_is_the_sum_of_its_units():
    assert path_seconds(UNITS, 4, HW).tolist() == [6.0, 6.0]


def test_busy_time_is_the_busiest_unit_plus_the_share_of_the_others_that_does_not_overlap():
    # busiest 3 and 4, the others 3 and 2 more
    assert busy_seconds(UNITS, OVERLAPPED).tolist() == [3.0, 4.0]
    assert busy_seconds(UNITS, dataclasses.replace(HW, unit_overlap=0.0)).tolist() == [6.0, 6.0]
    assert busy_seconds(UNITS, dataclasses.replace(HW, unit_overlap=0.25)).tolist() == [
        3.0 + 0.75 * 3.0, 4.0 + 0.75 * 2.0]


def test_shared_memory_overlaps_the_math_pipes_as_they_overlap_one_another():
    # shared memory's 2 s beside the first step's units (not the busiest), 9 s beside the
    # second's (the busiest): one share for all four units
    with_smem = np.vstack([UNITS, [[2.0, 9.0]]])
    assert HW.unit_overlap == 0.53
    assert busy_seconds(with_smem, HW).tolist() == pytest.approx([3.0 + 0.47 * 5.0,
                                                                  9.0 + 0.47 * 6.0])
    taking_turns = dataclasses.replace(HW, unit_overlap=0.0)
    assert busy_seconds(with_smem, taking_turns).tolist() == pytest.approx([8.0, 15.0])
    assert busy_seconds(with_smem, OVERLAPPED).tolist() == pytest.approx([3.0, 9.0])
    # no shared-memory time: the math pipes alone
    assert busy_seconds(np.vstack([UNITS, [[0.0, 0.0]]]), HW).tolist() == pytest.approx(
        busy_seconds(UNITS, HW).tolist())


def test_two_warps_per_block_overlap_up_to_the_busy_time():
    # max(busy, sum / 2): with full overlap (3, 6/2) and (4, 6/2)
    assert path_seconds(UNITS, 8, OVERLAPPED).tolist() == [3.0, 4.0]
    assert path_seconds(UNITS, 32, OVERLAPPED).tolist() == [3.0, 4.0]  # never below the busiest
    # with the preset's overlap the busy time is the longer: 3 + 0.47 x 3 and 4 + 0.47 x 2
    assert HW.unit_overlap == 0.53
    assert path_seconds(UNITS, 8, HW).tolist() == pytest.approx([4.41, 4.94])


def test_fewer_warps_than_blocks_use_only_part_of_the_sm():
    # 2 warps on 4 blocks: the units of the 2 blocks used take twice as long, in turn.
    assert path_seconds(UNITS, 2, HW).tolist() == [12.0, 12.0]
    assert path_seconds(UNITS, 1, HW).tolist() == [24.0, 24.0]


# One CTA (B=1, H=1, N=BM) of a d=128 forward: its K/V loads are small next to its compute.
ALONE = AttentionProblem(1, 1, 128, 128, seq_kv=8192)


def _paths(tiling: Tiling, hw) -> tuple[int, float]:
    """(iterations, critical path of all compute steps) of the single CTA."""
    (prog,) = schedule_programs(build_schedule(ALONE, tiling, "fa2"), hw)
    assert prog.grid == 1
    total = prog.pre.path_s.sum() + prog.loop.path_s.sum() + prog.post.path_s.sum()
    return prog.iterations, float(total)


@pytest.mark.parametrize("mode", ["full", "aggregated"])
def test_more_warps_shorten_a_compute_bound_cta_by_the_path_difference(mode):
    four, eight = Tiling(128, 64, 2, 4), Tiling(128, 64, 2, 8)
    _, path4 = _paths(four, HW)
    _, path8 = _paths(eight, HW)
    assert path8 < path4
    slow = run(ALONE, four, "fa2", HW, mode).time_s
    fast = run(ALONE, eight, "fa2", HW, mode).time_s
    assert slow - fast == pytest.approx(path4 - path8, rel=1e-6)


@pytest.mark.parametrize("mode", ["full", "aggregated"])
def test_iteration_overhead_adds_once_per_iteration(mode):
    tiling = Tiling(128, 64, 2, 4)
    slower = dataclasses.replace(HW, iteration_overhead_s=1e-6)
    n, _ = _paths(tiling, HW)
    base = run(ALONE, tiling, "fa2", HW, mode).time_s
    more = run(ALONE, tiling, "fa2", slower, mode).time_s
    assert more - base == pytest.approx(n * 1e-6, rel=1e-6)


@pytest.mark.parametrize("overlap", [1.0, 0.53, 0.0])
def test_resident_ctas_overlap_up_to_the_busy_time(overlap):
    """Many CTAs per SM: time approaches the units' busy time (the busiest unit, plus the
    share of the others that does not overlap it), not the sum of the CTAs' paths; where
    the units overlap so far that one CTA's own path (its units in turn, one warp per
    processing block) is longer, the resident CTAs' paths side by side. Three
    stages: each CTA's next loads are in flight while it computes (with two, Triton issues
    them after its matmuls, and two CTAs per SM do not cover each one's wait); block_n 32,
    so that two CTAs of three stages fit an SM."""
    hw = dataclasses.replace(HW, unit_overlap=overlap)
    problem = AttentionProblem(4, 32, 4096, 128)
    tiling = Tiling(128, 32, 3, 4)
    sim = run(problem, tiling, "fa2", hw, "aggregated")
    (kernel,) = sim.runs
    # the busiest unit, plus the others' share that does not overlap it, shared memory
    # (the tiles' staging) among them (``busy_seconds``)
    units = kernel.unit_s / hw.sm_count
    assert units[3] > 0
    busy = units.max() + (1 - overlap) * (units.sum() - units.max())
    total = kernel.unit_s.sum() / hw.sm_count
    assert kernel.ctas_per_sm == 2
    bound = max(busy, total / kernel.ctas_per_sm)
    assert (bound == busy) == (overlap < 1.0)
    assert bound < kernel.time_s < 1.05 * bound  # measured 1.033-1.042 (loads, the last wave)
    if overlap == 1.0:
        assert kernel.time_s < 0.6 * total


def test_wgmma_needs_sm90_whole_warpgroups_and_rows_in_64s():
    h200, a100 = load_hardware("h200-sxm"), load_hardware("a100-sxm4-80gb")
    assert uses_wgmma(h200, 64, 4) and uses_wgmma(h200, 128, 8)
    assert not uses_wgmma(h200, 32, 4)  # rows not a multiple of 64
    assert not uses_wgmma(h200, 64, 2)  # no whole warpgroup
    assert not uses_wgmma(h200, 0, 4)  # no matmul
    assert not uses_wgmma(a100, 128, 8)  # no wgmma before sm_90


def test_synchronous_mma_runs_at_its_own_efficiency():
    """fa2 forward with BM=32 compiles to mma.sync: its tensor seconds use that rate."""
    problem = AttentionProblem(1, 2, 512, 64)
    for block_m, efficiency in ((64, HW.tensor_efficiency), (32, HW.tensor_sync_efficiency)):
        tiling = Tiling(block_m, 64, 2, 4)
        (prog,) = schedule_programs(build_schedule(problem, tiling, "fa2"), HW)
        tensor_s = prog.totals()["unit_s"][0].sum()
        flops = 4 * 2 * 512 * 512 * 64
        assert tensor_s == pytest.approx(
            flops / (HW.tensor_flops_per_s["bf16"] * efficiency / HW.sm_count), rel=1e-9)


@pytest.mark.parametrize("mode", ["full", "aggregated"])
def test_two_stages_wait_for_every_load_three_hide_all_but_the_first(mode):
    """Triton's pipeline (``kernels.resources.loop_pipeline``): iteration t issues the loads
    of t + stages - 1 after its matmuls. A lone CTA whose K/V all miss L2: at two stages
    each of its n iterations waits for its loads after the previous compute, so a longer
    HBM latency adds n times over; at three, with each step's compute longer than a load's
    latency and transfer, only the first loads' wait remains. Latencies are scaled by the
    CTA's ``latency_factor`` in both engines."""
    from simulator.sim.costs import latency_factor

    delta = 1e-7
    later = dataclasses.replace(HW, hbm_latency_s=HW.hbm_latency_s + delta)
    n, _ = _paths(Tiling(128, 64, 2, 4), HW)
    assert n == 128
    for stages, waits in ((2, n), (3, 1)):
        tiling = Tiling(128, 64, stages, 4)
        added = run(ALONE, tiling, "fa2", later, mode).time_s - run(ALONE, tiling, "fa2", HW,
                                                                    mode).time_s
        assert added == pytest.approx(waits * delta * float(latency_factor(0)), rel=1e-6)


def test_latency_factors_spread_evenly_about_one():
    """``latency_factor``: within 1 +- LATENCY_SPREAD, and any run of consecutive CTAs
    (a wave) averages close to 1, so the spread moves no mean latency."""
    from simulator.sim.costs import LATENCY_SPREAD, latency_factor

    factors = latency_factor(np.arange(10_000))
    assert factors.min() >= 1 - LATENCY_SPREAD and factors.max() <= 1 + LATENCY_SPREAD
    assert factors.max() - factors.min() > 1.9 * LATENCY_SPREAD
    for start, size in ((0, 132), (500, 264), (7_000, 1_000)):
        assert abs(factors[start:start + size].mean() - 1) < 0.01
    assert float(latency_factor(3)) == pytest.approx(factors[3])
