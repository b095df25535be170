"""Compile jobs are handed to the workers mixed, and their results given back in order."""

from __future__ import annotations

import pytest

from kernels import table
from kernels.compile_order import measured_evenly


def test_each_worker_gets_both_warp_counts_and_the_results_come_back_in_order():
    tilings = table.sweep_space()
    handed = []

    def compile_in_order(in_order):
        handed.extend(in_order)
        return [t.describe() for t in in_order]

    assert measured_evenly(compile_in_order, tilings) == [t.describe() for t in tilings]
    assert sorted(t.describe() for t in handed) == sorted(t.describe() for t in tilings)
    # resources.measure deals in turns: in the sweep's order one of two workers would
    # have every 4-warp tiling (125 of 250) and the other every 8-warp one
    assert [t.num_warps for t in tilings[0::2]] == [4] * 125
    for worker in range(2):
        warps = [t.num_warps for t in handed[worker::2]]
        assert 50 <= warps.count(4) <= 75, worker


def test_a_compile_that_loses_results_is_an_error():
    with pytest.raises(ValueError, match="3 tilings compiled, 2 results"):
        measured_evenly(lambda in_order: in_order[:2], table.sweep_space()[:3])
