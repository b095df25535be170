"""Which of a group's candidate tilings a validation run measures (``choose``).

The model rates every candidate at every sequence length of its group; four are kept
that it rates differently at every length — the predicted best (by geometric mean over
the lengths), its runner-up, and two that spread the ratings — plus a near tie of the
best when the runner-up is far from it. Measuring the close call is what makes the regret
of the predicted-best tiling a test of the model.
"""

from __future__ import annotations

import itertools
import math

TILINGS_PER_SHAPE = 4
MIN_GAP = 0.02  # two ratings closer than 2% do not count as "rated differently"
# A runner-up rated more than this much slower than the best (geometric mean over the
# lengths) cannot test the regret target (5%; twice that is no close call): the best-rated
# candidate it passed over, a near tie, is measured too.
CLOSE_CALL = 0.10
NEAR_TIE = "near tie"  # the role of that candidate in the plan (profiled last)


def min_gap(combo: tuple[int, ...], table: list[list[float]]) -> float:
    """Smallest relative difference between two chosen tilings over all lengths."""
    gap = math.inf
    for row in table:
        values = sorted(row[i] for i in combo)
        for a, b in itertools.pairwise(values):
            gap = min(gap, (b - a) / a)
    return gap


def choose(table: list[list[float]], k: int = TILINGS_PER_SHAPE) -> tuple[list[int], float]:
    """Indices of the candidates (columns of ``table``, rows = lengths) to measure: ``k``
    rated differently, and one near tie when the runner-up is far.

    Always the candidate with the best geometric-mean rating and its runner-up: the next
    best that is rated at least ``MIN_GAP`` apart from it at every length (the second best
    overall if none is). Measuring the close call is what makes the regret of the
    predicted-best tiling a test of the model: against tilings rated far worse, it only
    tests gross errors. The ``k - 2`` others spread the ratings: they maximise the
    smallest relative gap between any two chosen ratings at any length, then the smallest
    gap among them and the best alone (so they also span the range when the close call
    sets the first gap). When that runner-up is rated more than ``CLOSE_CALL`` slower, the
    candidates it passed over are near ties of the best (the model says they do not
    matter, e.g. block_n at block_m = 128): the best-rated of them is added, last, so that
    the measurement can say whether they do. Returns the indices (best, runner-up, the
    others from fastest rated, the near tie if any) and the smallest gap of the first ``k``.
    """
    n = len(table[0]) if table else 0
    if n < k:
        raise ValueError(f"need at least {k} legal candidates, got {n}")
    geo = [sum(math.log(row[i]) for row in table) for i in range(n)]
    ranked = sorted(range(n), key=lambda i: (geo[i], i))
    best = ranked[0]
    apart = [i for i in ranked[1:] if min_gap((best, i), table) >= MIN_GAP]
    runner_up = (apart or ranked[1:])[0]
    others = [i for i in range(n) if i not in (best, runner_up)]
    combo = max(itertools.combinations(others, k - 2),
                key=lambda c: (min_gap((best, runner_up, *c), table),
                               min_gap((best, *c), table), -sum(c)))
    chosen = [best, runner_up, *sorted(combo, key=lambda i: geo[i])]
    gap = min_gap(tuple(chosen), table)
    near_ties = [i for i in ranked[1:ranked.index(runner_up)] if i not in chosen]
    if near_ties and (geo[runner_up] - geo[best]) / len(table) > math.log1p(CLOSE_CALL):
        chosen.append(near_ties[0])
    return chosen, gap


def role_of(position: int) -> str:
    """Why the tiling at ``position`` of ``choose``'s result is measured."""
    if position >= TILINGS_PER_SHAPE:
        return NEAR_TIE
    return ("best", "runner-up")[position] if position < 2 else "spread"
