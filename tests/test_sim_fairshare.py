"""Fair rates: the joint solve tried first (after a memory-limited answer) gives the same
rates as solving every SM alone first, and every answer respects every capacity."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.sim.fairshare import LIMIT_HBM, LIMIT_L2, ROWS, fair_rates

N_SM = 4
PORT = 1e9


def _jobs(rng, slots: int, empty: float = 0.2):
    """Random phases: bytes through L2 and HBM, SM seconds, critical path (some slots empty)."""
    B = rng.uniform(1e3, 1e5, slots)
    M = B * rng.uniform(0.0, 1.0, slots)
    K = rng.uniform(1e-7, 1e-5, slots)
    CP = rng.uniform(1e-6, 1e-4, slots)
    CP[rng.random(slots) < empty] = np.inf  # empty slots
    return B, M, K, CP


def _rates(B, M, K, CP, l2, hbm, state):
    """Rates and limits from ``fair_rates`` with every SM marked changed."""
    slots = B.shape[0]
    rate, limit = np.zeros(slots), np.zeros(slots, dtype=np.int64)
    fair_rates(B, M, K, CP, N_SM, l2, hbm, PORT, np.zeros(N_SM), np.zeros(N_SM),
               np.zeros((ROWS, slots)), rate, limit, np.ones(N_SM, dtype=np.bool_), state)
    return rate, limit


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


def test_a_sequence_of_events_matches_solving_from_scratch():
    """Jobs change one slot at a time while memory turns from limiting to ample and back:
    the state kept between calls (incremental or joint-first) never changes an answer."""
    rng = np.random.default_rng(7)
    slots = 24
    B, M, K, CP = _jobs(rng, slots)
    rate, limit = np.zeros(slots), np.zeros(slots, dtype=np.int64)
    levels, work = np.zeros((2, N_SM)), np.zeros((ROWS, slots))
    dirty, state = np.zeros(N_SM, dtype=np.bool_), np.zeros(3)
    seen = set()
    for event in range(200):
        s = rng.integers(slots)
        B[s], M[s] = rng.uniform(1e3, 1e5), rng.uniform(0, 1e5)
        CP[s] = np.inf if rng.random() < 0.2 else rng.uniform(1e-6, 1e-4)
        dirty[s % N_SM] = True
        hbm = 5e8 if (event // 25) % 2 else 1e12  # memory limits in alternate stretches
        fair_rates(B, M, K, CP, N_SM, 1e12, hbm, PORT, levels[0], levels[1], work, rate,
                   limit, dirty, state)
        seen.add(state[0])
        if hbm > 1e11:  # memory has room: the next event may solve only the changed SM
            assert state[0] == 1.0
        expected = _rates(B, M, K, CP, 1e12, hbm, np.zeros(3))
        np.testing.assert_array_equal(rate, expected[0])
        np.testing.assert_array_equal(limit, expected[1])
        _check_capacities(B, M, K, CP, rate, 1e12, hbm)
    assert seen == {1.0, -1.0}  # both kept states were exercised
