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
    assert np.array_equal(fluid._jobs(1000, slots, loopless=False), np.arange(1000))
    few = fluid.MAX_JOBS_PER_SLOT * slots  # exactly MAX waves: one CTA a job
    assert np.array_equal(fluid._jobs(few, slots, loopless=True), np.arange(few))
    many = 3 * few + 7  # three CTAs and a bit per job: four consecutive CTAs each
    first = fluid._jobs(many, slots, loopless=True)
    assert np.array_equal(first, np.arange(0, many, 4))
    assert first.size <= fluid.MAX_JOBS_PER_SLOT * slots


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
