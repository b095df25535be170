"""The one place validation asks the model for a prediction.

``predict(problem, tiling, schedule, hw)`` returns a ``tilesim.prediction/1`` dict. It uses
the timing simulator (``simulator.sim``) when that package is importable and falls back to
the exact counts (``count_prediction``: bytes and FLOPs, ``time_s`` and DRAM bytes ``None``)
when it is not. Everything in ``validation/`` calls the model through this module, so
switching the model is a one-line change here; tests pass their own predictor instead.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from simulator.hardware import Hardware
from traces.problem import AttentionProblem
from traces.tiling import Tiling

Predictor = Callable[[AttentionProblem, Tiling, str, Hardware], dict]


@functools.cache
def _simulate() -> Predictor | None:
    """The simulator's entry point, or None while it is not installed (no simpy) or built."""
    try:
        from simulator.sim import simulate
    except ImportError:
        return None
    return simulate


def simulator_available() -> bool:
    return _simulate() is not None


def model_name() -> str:
    """Which model ``predict`` uses: ``simulator`` (time and DRAM bytes) or ``counts``."""
    return "simulator" if simulator_available() else "counts"


def predict(problem: AttentionProblem, tiling: Tiling, schedule: str, hw: Hardware) -> dict:
    """The model's prediction for one configuration (see the module docstring)."""
    simulate = _simulate()
    if simulate is not None:
        return simulate(problem, tiling, schedule, hw)
    from simulator.prediction import count_prediction

    return count_prediction(problem, tiling, schedule, hw)
