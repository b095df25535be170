"""How the aggregated engine groups CTAs into jobs and which CTAs start in a burst."""

import numpy as np

from simulator.hardware import load_hardware
from simulator.sim import fluid
from simulator.sim.costs import FOLD, CtaCosts
from simulator.sim.l2 import BlockLayout
from simulator.sim.program import schedule_programs
from traces.problem import AttentionProblem
from traces.schedules import build_schedule
from traces.tiling import Tiling


def test_only_loopless_kernels_of_many_waves_merge_ctas():
    slots = 10
    looping = fluid._jobs(1000, slots, loopless=False)
    assert looping.order is None and np.array_equal(looping.first, np.arange(1000))
    few = fluid.MAX_JOBS_PER_SLOT * slots  # exactly MAX waves: one CTA a job
    kept = fluid._jobs(few, slots, loopless=True)
    assert kept.order is None and np.array_equal(kept.first, np.arange(few))
    many = 3 * few + 7  # three times MAX waves and a bit: jobs of four, rounds of 4 waves
    jobs = fluid._jobs(many, slots, loopless=True)
    assert jobs.first.size <= fluid.MAX_JOBS_PER_SLOT * slots
    assert np.array_equal(np.sort(jobs.order), np.arange(many))  # every CTA once
    members = np.split(jobs.order, jobs.first[1:])
    rounds = many // (4 * slots)  # then a round of the 7 CTAs left, one a job
    assert [m.size for m in members] == [4] * rounds * slots + [1] * 7
    for m in members:  # a wave apart, in launch order
        assert (np.diff(m) == slots).all()
    # At each step of their jobs the slots of a round hold a wave of neighbours.
    for start in range(0, len(members), slots):
        ones = members[start:start + slots]
        for k in range(len(ones[0])):
            wave = [m[k] for m in ones if k < m.size]
            assert np.array_equal(wave, np.arange(wave[0], wave[0] + len(wave)))


def test_in_job_order_and_back():
    jobs = fluid._jobs(3 * fluid.MAX_JOBS_PER_SLOT * 4 + 3, 4, loopless=True)
    x = np.random.default_rng(0).random(jobs.order.size)
    assert not np.array_equal(jobs.in_job_order(x), x)
    assert np.array_equal(jobs.in_grid_order(jobs.in_job_order(x)), x)


def _fa2_costs():
    hw = load_hardware("h200-sxm")
    problem = AttentionProblem(batch=1, heads=2, seq_q=4096, head_dim=64)
    tiling = Tiling(block_m=64, block_n=64, num_stages=2, num_warps=4)
    sched = build_schedule(problem, tiling, "fa2")
    (prog,) = schedule_programs(sched, hw)
    layout = BlockLayout.from_schedule(sched)
    return prog, CtaCosts(prog, hw, tiling.num_stages, layout.rows.size)


def test_only_the_ctas_of_the_burst_keep_their_first_loads_apart():
    """CTAs that start the first wave together keep their latency and first loads as
    phases of their own; any other CTA (a later wave, or a merged job's later CTAs, which
    start as the earlier ones end) has them folded into its body when they are small."""
    prog, costs = _fa2_costs()
    grid = prog.grid
    miss = costs.load.copy()  # every load misses: the first-load phases are not empty
    args = (miss, costs.first_load, np.zeros(grid), np.ones(grid))
    apart = costs.phases(*args, np.ones(grid, dtype=np.bool_))
    folded = costs.phases(*args, np.zeros(grid, dtype=np.bool_))
    B, M, K, CP, W, moved = apart
    assert np.array_equal(M, moved)  # no line costs given: capacity is the missed bytes
    assert not W[:, [0, 1, 3]].any()  # write-backs come with the body's accesses
    assert (CP[:, 0] > 0).all() and (B[:, 1] > 0).all()  # latency, then the first loads
    for a, f in zip(apart, folded, strict=True):  # folding never changes a CTA's totals
        assert np.allclose(a.sum(axis=1), f.sum(axis=1), rtol=1e-12)
    small = CP[:, 0] + CP[:, 1] < FOLD * CP[:, 2]
    assert small.all()  # 64 iterations: the first loads are a small part of the body
    assert (folded[3][:, :2] == 0).all() and (folded[0][:, :2] == 0).all()
    burst = np.zeros(grid, dtype=np.bool_)
    burst[::3] = True  # say, the first CTA of each three-CTA job
    mixed = costs.phases(*args, burst)
    assert np.array_equal(mixed[3][burst], CP[burst])
    assert np.array_equal(mixed[3][~burst], folded[3][~burst])
