"""The statistics reconciliation reports: percentage errors, MAPE, rank correlation, regret.

All take plain sequences of positive floats (predicted, measured), pairwise. Errors are
relative to the measurement: ``(predicted - measured) / measured``, in percent.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def pct_errors(predicted: Sequence[float], measured: Sequence[float]) -> list[float]:
    """Signed error of each prediction, percent of the measurement."""
    if len(predicted) != len(measured):
        raise ValueError("predicted and measured must have the same length")
    out = []
    for p, m in zip(predicted, measured, strict=True):
        if not (m > 0 and math.isfinite(m)):  # NaN fails the first test, not ``m <= 0``
            raise ValueError(f"measurements must be finite and > 0, got {m}")
        out.append(100.0 * (p - m) / m)
    return out


def mape(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Mean absolute percentage error; NaN for no pairs."""
    errors = pct_errors(predicted, measured)
    return sum(abs(e) for e in errors) / len(errors) if errors else math.nan


def max_abs_error(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Largest absolute percentage error; NaN for no pairs."""
    errors = pct_errors(predicted, measured)
    return max(abs(e) for e in errors) if errors else math.nan


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks; tied values share the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        mean_rank = (i + j) / 2 + 1
        for k in range(i, j + 1):
            out[order[k]] = mean_rank
        i = j + 1
    return out


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation with tie-averaged ranks (Pearson on the ranks).

    NaN when fewer than two pairs or when either side has all values tied (no ranking).
    """
    if len(x) != len(y):
        raise ValueError("x and y must have the same length")
    n = len(x)
    if n < 2:
        return math.nan
    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / n, sum(ry) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return math.nan
    return sxy / math.sqrt(sxx * syy)


def regret(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """How much slower the predicted-best choice really is than the measured best, percent.

    The predicted best is the smallest prediction (the first of tied ones); the result is
    ``100 * (measured[predicted best] / min(measured) - 1)``.
    """
    if not predicted or len(predicted) != len(measured):
        raise ValueError("predicted and measured must be non-empty and of the same length")
    pick = min(range(len(predicted)), key=lambda i: predicted[i])
    return 100.0 * (measured[pick] / min(measured) - 1.0)


def predicted_ties(predicted: Sequence[float], measured: Sequence[float],
                   gap: float) -> list[tuple[int, float, float]]:
    """The tilings the model rates within ``gap`` (relative) of its predicted best, each as
    ``(index, predicted difference %, measured difference %)`` against that best.

    Such a tie is a claim too — "these do not differ" — that neither Spearman (ties barely
    move ranks) nor the regret (which sees one pick) tests directly. The predicted best is
    ``regret``'s pick.
    """
    if not predicted or len(predicted) != len(measured):
        raise ValueError("predicted and measured must be non-empty and of the same length")
    pick = min(range(len(predicted)), key=lambda i: predicted[i])
    return [(i, 100.0 * (predicted[i] / predicted[pick] - 1.0),
             100.0 * (measured[i] / measured[pick] - 1.0))
            for i in range(len(predicted))
            if i != pick and predicted[i] <= predicted[pick] * (1.0 + gap)]


def spread(values: Sequence[float | None]) -> dict:
    """How many of ``values`` exist (None: not known), and their median, least and most
    (None when none exists)."""
    known = [v for v in values if v is not None]
    if not known:
        return {"n": 0, "median": None, "min": None, "max": None}
    return {"n": len(known), "median": statistics.median(known), "min": min(known),
            "max": max(known)}
