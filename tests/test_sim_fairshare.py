"""Fair rates: the joint solve tried first (after a memory-limited answer) gives the same
rates as solving every SM alone first; skipping the free SMs' visits gives the rates of
visiting every SM, bit for bit; and every answer respects every capacity."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simulator.sim import fairshare
from simulator.sim.fairshare import LIMIT_HBM, LIMIT_L2, ROWS, fair_rates

N_SM = 4
PORT = 1e9


def _jobs(rng, slots: int, empty: float = 0.2, free: bool = False):
    """Random phases: bytes through L2 and HBM, SM seconds, critical path (some slots empty).

    ``free``: phases so short of compute and port that every SM is free (``fairshare``):
    at their critical paths' pace the 8 slots of an SM want at most 80% of either.
    """
    if free:
        B = rng.uniform(1e3, 1e4, slots)
        K = rng.uniform(1e-7, 1e-5, slots)
        CP = rng.uniform(1e-4, 1e-3, slots)
    else:
        B = rng.uniform(1e3, 1e5, slots)
        K = rng.uniform(1e-7, 1e-5, slots)
        CP = rng.uniform(1e-6, 1e-4, slots)
    M = B * rng.uniform(0.0, 1.0, slots)
    CP[rng.random(slots) < empty] = np.inf  # empty slots
    return B, M, K, CP


def _rates(B, M, K, CP, l2, hbm, state):
    """Rates and limits from ``fair_rates`` with every SM marked changed."""
    slots = B.shape[0]
    rate, limit = np.zeros(slots), np.zeros(slots, dtype=np.int64)
    fair_rates(B, M, K, CP, N_SM, l2, hbm, PORT, np.zeros(N_SM), np.zeros(N_SM),
               np.zeros((ROWS, slots)), rate, limit, np.ones(N_SM, dtype=np.bool_),
               np.zeros(N_SM, dtype=np.bool_), state)
    return rate, limit


def _reference_rates(B, M, K, CP, l2_rate, hbm_rate):
    """The fair rates as the solver found them before it skipped free SMs: every SM alone,
    then, if L2 or HBM is over, L2, HBM and every SM's compute and port in turn until no
    level moves. Plain Python, the same operations in the same order; a level's relative
    change (``_change``) is the solver's own."""
    n, inf = B.shape[0], math.inf
    change = fairshare._change.py_func

    def level(values, count, capacity):  # the water level of ``count`` demands
        total = 0.0
        for value in values[:count]:
            total += value
        if total <= capacity:
            return inf
        water, below = capacity / count, -1
        while True:
            small, under = 0.0, 0
            for value in values[:count]:
                if value < water:
                    small += value
                    under += 1
            if under == below:
                return water
            below = under
            water = (capacity - small) / (count - under)
    cap = [1.0 / CP[i] if math.isfinite(CP[i]) else 0.0 for i in range(n)]
    by = {key: [inf] * n for key in ("sm", "port", "l2", "hbm")}
    levels = {"sm": [inf] * N_SM, "port": [inf] * N_SM}

    def sm_levels(weight, other, capacity, key, moved):
        for s in range(min(N_SM, n)):
            values = [weight[i] * other[i] for i in range(s, n, N_SM)
                      if weight[i] > 0 and cap[i] > 0]
            total = 0.0
            for value in values:
                total += value
            if total <= capacity:
                new = inf
            elif len(values) == 1:
                new = capacity
            elif len(values) == 2:
                low = min(values)
                new = capacity / 2 if 2 * low >= capacity else capacity - low
            else:
                new = level(np.array(values), len(values), capacity)
            moved = max(moved, change(levels[key][s], new))
            levels[key][s] = new
        return moved

    def sm_round(moved, memory):
        mem = [min(by["l2"][i], by["hbm"][i]) for i in range(n)] if memory else [inf] * n
        work = [min(cap[i], by["port"][i], mem[i]) for i in range(n)]
        moved = sm_levels(K, work, 1.0, "sm", moved)
        by["sm"] = [levels["sm"][i % N_SM] / K[i] if K[i] > 0 else inf for i in range(n)]
        work = [min(cap[i], by["sm"][i], mem[i]) for i in range(n)]
        moved = sm_levels(B, work, PORT, "port", moved)
        by["port"] = [levels["port"][i % N_SM] / B[i] if B[i] > 0 else inf
                      for i in range(n)]
        return moved

    def finish():
        rate, limit = np.zeros(n), np.zeros(n, dtype=np.int64)
        for i in range(n):
            r, which = cap[i], fairshare.LIMIT_PATH
            for key, bound in (("sm", fairshare.LIMIT_SM), ("port", fairshare.LIMIT_PORT),
                               ("l2", LIMIT_L2), ("hbm", LIMIT_HBM)):
                if by[key][i] < r:
                    r, which = by[key][i], bound
            rate[i], limit[i] = r, which
        return rate, limit

    for _ in range(fairshare.MAX_ROUNDS):
        if sm_round(0.0, memory=False) <= 1e-12:
            break
    rate, limit = finish()
    l2_draw = hbm_draw = 0.0
    for i in range(n):
        l2_draw += B[i] * rate[i]
        hbm_draw += M[i] * rate[i]
    if l2_draw <= l2_rate and hbm_draw <= hbm_rate:
        return rate, limit
    by = {key: [inf] * n for key in by}
    levels = {"sm": [inf] * N_SM, "port": [inf] * N_SM}
    level_l2 = level_hbm = inf
    for _ in range(fairshare.MAX_ROUNDS):
        values = [B[i] * min(cap[i], by["sm"][i], by["port"][i], by["hbm"][i])
                  for i in range(n) if cap[i] > 0 and B[i] > 0]
        new = level(np.array(values), len(values), l2_rate)
        moved = change(level_l2, new)
        level_l2 = new
        by["l2"] = [level_l2 / B[i] if B[i] > 0 else inf for i in range(n)]
        values = [M[i] * min(cap[i], by["sm"][i], by["port"][i], by["l2"][i])
                  for i in range(n) if cap[i] > 0 and M[i] > 0]
        new = level(np.array(values), len(values), hbm_rate)
        moved = max(moved, change(level_hbm, new))
        level_hbm = new
        by["hbm"] = [level_hbm / M[i] if M[i] > 0 else inf for i in range(n)]
        if sm_round(moved, memory=True) <= 1e-12:
            break
    return finish()


def _check_capacities(B, M, K, CP, rate, l2, hbm):
    tol = 1 + 1e-9
    assert (rate * B).sum() <= l2 * tol and (rate * M).sum() <= hbm * tol
    for s in range(N_SM):
        assert (rate[s::N_SM] * K[s::N_SM]).sum() <= tol
        assert (rate[s::N_SM] * B[s::N_SM]).sum() <= PORT * tol
    busy = np.isfinite(CP)
    assert np.all(rate[busy] <= tol / CP[busy]) and np.all(rate[busy] > 0)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("memory", ["ample", "tight"])
def test_joint_first_gives_the_same_rates(seed, memory):
    rng = np.random.default_rng(seed)
    B, M, K, CP = _jobs(rng, 32)
    l2, hbm = (1e12, 1e12) if memory == "ample" else (2e9, 5e8)
    fresh = _rates(B, M, K, CP, l2, hbm, np.zeros(3))
    after_limited = _rates(B, M, K, CP, l2, hbm, np.array([-1.0, 0.0, 0.0]))
    np.testing.assert_array_equal(fresh[0], after_limited[0])
    np.testing.assert_array_equal(fresh[1], after_limited[1])
    _check_capacities(B, M, K, CP, fresh[0], l2, hbm)
    by_memory = np.isin(fresh[1][np.isfinite(CP)], [LIMIT_L2, LIMIT_HBM])
    assert by_memory.any() == (memory == "tight")


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("sms", ["free", "one busy", "busy"])
@pytest.mark.parametrize("memory", [(1e12, 1e12), (2e9, 5e8), (2e8, 1e12), (3e8, 2e8)],
                         ids=["ample", "hbm", "l2", "both"])
def test_skipping_free_sms_changes_no_rate(seed, sms, memory):
    """Against the full visit (``_reference_rates``), bit for bit, with every SM free, one
    SM busy, or all busy, and L2, HBM, both or neither limiting."""
    rng = np.random.default_rng(seed)
    B, M, K, CP = _jobs(rng, 32, free=sms != "busy")
    if sms == "one busy":  # SM 1's slots a hundred times faster: its port is over
        CP[1::N_SM] /= 100
    l2, hbm = memory
    for state in (np.zeros(3), np.array([-1.0, 0.0, 0.0])):
        rate, limit = _rates(B, M, K, CP, l2, hbm, state)
        expected = _reference_rates(B, M, K, CP, l2, hbm)
        np.testing.assert_array_equal(rate, expected[0])
        np.testing.assert_array_equal(limit, expected[1])
        _check_capacities(B, M, K, CP, rate, l2, hbm)
    free = np.zeros(N_SM, dtype=np.bool_)
    fair_rates(B, M, K, CP, N_SM, l2, hbm, PORT, np.zeros(N_SM), np.zeros(N_SM),
               np.zeros((ROWS, 32)), rate, limit, np.ones(N_SM, dtype=np.bool_), free,
               np.zeros(3))
    assert list(free) == {"free": [True] * 4, "one busy": [True, False, True, True],
                          "busy": [False] * 4}[sms]


def test_a_sequence_of_events_matches_solving_from_scratch():
    """Jobs change one slot at a time while memory turns from limiting to ample and back:
    the state kept between calls (incremental or joint-first) never changes an answer."""
    rng = np.random.default_rng(7)
    slots = 24
    B, M, K, CP = _jobs(rng, slots)
    rate, limit = np.zeros(slots), np.zeros(slots, dtype=np.int64)
    levels, work = np.zeros((2, N_SM)), np.zeros((ROWS, slots))
    dirty, state = np.zeros(N_SM, dtype=np.bool_), np.zeros(3)
    free = np.zeros(N_SM, dtype=np.bool_)
    seen = set()
    for event in range(200):
        s = rng.integers(slots)
        B[s], M[s] = rng.uniform(1e3, 1e5), rng.uniform(0, 1e5)
        CP[s] = np.inf if rng.random() < 0.2 else rng.uniform(1e-6, 1e-4)
        dirty[s % N_SM] = True
        hbm = 5e8 if (event // 25) % 2 else 1e12  # memory limits in alternate stretches
        fair_rates(B, M, K, CP, N_SM, 1e12, hbm, PORT, levels[0], levels[1], work, rate,
                   limit, dirty, free, state)
        seen.add(state[0])
        if hbm > 1e11:  # memory has room: the next event may solve only the changed SM
            assert state[0] == 1.0
        expected = _rates(B, M, K, CP, 1e12, hbm, np.zeros(3))
        np.testing.assert_array_equal(rate, expected[0])
        np.testing.assert_array_equal(limit, expected[1])
        _check_capacities(B, M, K, CP, rate, 1e12, hbm)
    assert seen == {1.0, -1.0}  # both kept states were exercised


def test_sms_turning_free_and_busy_keep_the_full_visits_rates():
    """Slots change one at a time through stretches of short phases (SMs turn busy) and
    long ones (free again) while memory limits in alternate stretches: every answer of a
    joint solve is the full visit's, bit for bit, with the SMs found free kept between
    calls. (Answers while memory has room solve the changed SMs alone, each to the
    solver's tolerance, as they did before free SMs were skipped.)"""
    rng = np.random.default_rng(7)
    slots = 24
    B, M, K, CP = _jobs(rng, slots, free=True)
    rate, limit = np.zeros(slots), np.zeros(slots, dtype=np.int64)
    levels, work = np.zeros((2, N_SM)), np.zeros((ROWS, slots))
    dirty, state = np.zeros(N_SM, dtype=np.bool_), np.zeros(3)
    free = np.zeros(N_SM, dtype=np.bool_)
    free_seen, joint = set(), 0
    for event in range(300):
        s = rng.integers(slots)
        B[s], M[s] = rng.uniform(1e3, 1e4), rng.uniform(0, 1e4)
        short = (event // 40) % 2
        CP[s] = np.inf if rng.random() < 0.2 else (
            rng.uniform(1e-6, 1e-5) if short else rng.uniform(1e-4, 1e-3))
        dirty[s % N_SM] = True
        hbm = 5e7 if (event // 25) % 2 else 1e12
        fair_rates(B, M, K, CP, N_SM, 1e12, hbm, PORT, levels[0], levels[1], work, rate,
                   limit, dirty, free, state)
        free_seen.add(int(free.sum()))
        reference = _reference_rates(B, M, K, CP, 1e12, hbm)
        if state[0] < 0:
            joint += 1
            np.testing.assert_array_equal(rate, reference[0])
            np.testing.assert_array_equal(limit, reference[1])
        else:
            np.testing.assert_allclose(rate, reference[0], rtol=1e-12)
        _check_capacities(B, M, K, CP, rate, 1e12, hbm)
    assert joint > 100
    assert 0 in free_seen and N_SM in free_seen  # all SMs busy, and all free
