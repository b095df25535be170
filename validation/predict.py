"""The one place validation asks the model for a prediction.

``predict(problem, tiling, schedule, hw)`` returns the ``tilesim.prediction/1`` dict of the
timing simulator (``simulator.sim.predict``): time, DRAM bytes through the L2 model, bound.
Everything in ``validation/`` calls the model through this module; tests pass their own
predictor instead.
"""

from __future__ import annotations

from collections.abc import Callable

from simulator.hardware import Hardware
from traces.problem import AttentionProblem
from traces.tiling import Tiling

Predictor = Callable[[AttentionProblem, Tiling, str, Hardware], dict]


def model_name() -> str:
    """Which model ``predict`` uses."""
    return "simulator"


def predict(problem: AttentionProblem, tiling: Tiling, schedule: str, hw: Hardware) -> dict:
    """The simulator's prediction for one configuration."""
    from simulator.sim import predict as simulate

    return simulate(problem, tiling, schedule, hw)[0]
