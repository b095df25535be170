"""The reconciliation statistics against values computed by hand."""

from __future__ import annotations

import math

import pytest

from validation import stats


def test_pct_errors_and_mape_by_hand():
    pred, meas = [1.0, 2.0, 3.0], [1.1, 1.8, 3.0]
    errs = stats.pct_errors(pred, meas)
    assert errs == pytest.approx([-100 / 11, 100 / 9, 0.0])
    # (9.0909 + 11.1111 + 0) / 3
    assert stats.mape(pred, meas) == pytest.approx((100 / 11 + 100 / 9) / 3)
    assert stats.max_abs_error(pred, meas) == pytest.approx(100 / 9)


def test_empty_and_invalid():
    assert math.isnan(stats.mape([], []))
    assert math.isnan(stats.max_abs_error([], []))
    with pytest.raises(ValueError):
        stats.pct_errors([1.0], [0.0])
    with pytest.raises(ValueError):
        stats.pct_errors([1.0, 2.0], [1.0])


def test_ranks_average_ties():
    assert stats.ranks([10, 20, 20, 5]) == [2.0, 3.5, 3.5, 1.0]
    assert stats.ranks([7, 7, 7]) == [2.0, 2.0, 2.0]


def test_spearman_perfect_and_reversed():
    assert stats.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert stats.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)


def test_spearman_with_ties_by_hand():
    # x ranks [1.5, 1.5, 3], y ranks [2, 1, 3]; deviations from the mean rank 2:
    # dx = [-.5, -.5, 1], dy = [0, -1, 1]; sxy = 1.5, sxx = 1.5, syy = 2
    assert stats.spearman([1, 1, 2], [2, 1, 4]) == pytest.approx(1.5 / math.sqrt(1.5 * 2))


def test_spearman_undefined():
    assert math.isnan(stats.spearman([1], [2]))
    assert math.isnan(stats.spearman([1, 1, 1], [1, 2, 3]))  # no predicted ranking


def test_predicted_ties_by_hand():
    # The pick is index 1 (1.0); index 2 is within 2% (+1.5%), index 0 is not (+3%).
    ties = stats.predicted_ties([1.03, 1.0, 1.015], [1.0, 2.0, 2.5], 0.02)
    assert len(ties) == 1
    i, dp, dm = ties[0]
    assert i == 2 and dp == pytest.approx(1.5) and dm == pytest.approx(25.0)
    assert stats.predicted_ties([1.0, 2.0], [1.0, 1.0], 0.02) == []
    with pytest.raises(ValueError):
        stats.predicted_ties([1.0], [], 0.02)


def test_regret_by_hand():
    assert stats.regret([3.0, 1.0, 2.0], [1.0, 1.2, 1.1]) == pytest.approx(20.0)
    assert stats.regret([1.0, 2.0], [1.0, 5.0]) == 0.0
    # tied predictions: the first tied one is the pick
    assert stats.regret([1.0, 1.0, 2.0], [2.0, 1.0, 4.0]) == pytest.approx(100.0)
    with pytest.raises(ValueError):
        stats.regret([], [])
