"""Processor sharing: completion times against hand-computed schedules."""

from __future__ import annotations

import pytest
import simpy

from simulator.sim.bandwidth import SharedBandwidth


def _run(flows: list[tuple[float, float]], rate: float = 100.0) -> list[float]:
    """Start ``(time, bytes)`` flows on one pool; return when each finished."""
    env = simpy.Environment()
    pool = SharedBandwidth(env, rate)
    done = [None] * len(flows)

    def starter(i, at, nbytes):
        yield env.timeout(at)
        pool.start(nbytes, lambda: done.__setitem__(i, env.now))

    for i, (at, nbytes) in enumerate(flows):
        env.process(starter(i, at, nbytes))
    env.run()
    return done


def test_alone_takes_bytes_over_rate():
    assert _run([(0.0, 500.0)]) == [pytest.approx(5.0)]


def test_equal_flows_share_evenly():
    assert _run([(0.0, 100.0), (0.0, 100.0)]) == [pytest.approx(2.0), pytest.approx(2.0)]


def test_late_arrival_and_early_departure():
    # A: 300 B at t=0; B: 100 B at t=1. Alone A does 100 B by t=1; then both at 50 B/s:
    # B finishes at t=3 (A has 100 B left), A alone again finishes at t=4.
    assert _run([(0.0, 300.0), (1.0, 100.0)]) == [pytest.approx(4.0), pytest.approx(3.0)]


def test_work_conserving_busy_time():
    env = simpy.Environment()
    pool = SharedBandwidth(env, 10.0)
    for nbytes in (10.0, 20.0, 30.0):
        pool.start(nbytes, lambda: None)
    env.run()
    assert env.now == pytest.approx(6.0)  # 60 B at 10 B/s, never idle
    assert pool.busy_s == pytest.approx(6.0)
    assert pool.busy_log == [(0.0, pytest.approx(6.0))]


def test_many_flows_finish_in_size_order():
    sizes = [float(s) for s in (5, 1, 4, 2, 3)]
    done = _run([(0.0, s) for s in sizes], rate=1.0)
    # Processor sharing: the smallest leaves first; total work 15 s.
    assert sorted(range(5), key=lambda i: done[i]) == sorted(range(5), key=lambda i: sizes[i])
    assert max(done) == pytest.approx(15.0)
    assert min(done) == pytest.approx(5.0)  # 5 flows x 1 B each before the first leaves


def test_rate_must_be_positive():
    with pytest.raises(ValueError, match='"rate" must be > 0'):
        SharedBandwidth(simpy.Environment(), 0.0)
