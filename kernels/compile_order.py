"""The order to hand compile jobs to ``resources.measure`` in, so that its workers share them.

``resources.measure`` deals its jobs to its worker processes in turns (worker ``w`` of
``n`` takes jobs ``w, w + n, ...``). In the sweep's order of tilings the turns alternate
the number of warps, and compiles differ most in time by it: building FA2's backward at
head_dim 256 (2026-12-07), one of two workers had every 4-warp compile, the slow ones,
and the other sat idle. ``measured_evenly`` hands the tilings over in a seeded random
order instead, where each worker's share is as slow as another's on average, and gives
the results back in the caller's order: the same results, as each job's result is its
own.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

SEED = 0


def measured_evenly(compile_in_order: Callable[[list], list], tilings: Sequence) -> list:
    """``compile_in_order(tilings in a seeded random order)``'s results, one per tiling, put
    back in the order of ``tilings``."""
    order = list(range(len(tilings)))
    random.Random(SEED).shuffle(order)
    results = compile_in_order([tilings[i] for i in order])
    if len(results) != len(order):
        raise ValueError(f"{len(order)} tilings compiled, {len(results)} results")
    back: list = [None] * len(order)
    for position, i in enumerate(order):
        back[i] = results[position]
    return back
