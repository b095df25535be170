"""The one place validation asks the model for a prediction.

``predict(problem, tiling, schedule, hw)`` returns the ``tilesim.prediction/1`` dict of the
timing simulator (``simulator.sim.predict``): time, DRAM bytes through the L2 model, bound.
Everything in ``validation/`` calls the model through this module; tests pass their own
predictor instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

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


def map_tasks(fn: Callable, tasks: Sequence, jobs: int = 1, chunksize: int = 1) -> list:
    """``[fn(task) for task in tasks]``, spread over ``jobs`` processes when ``jobs > 1``.

    ``fn`` and everything in the tasks (a predictor, say) must be picklable: module-level
    functions. The order of the results is the order of the tasks.
    """
    if jobs <= 1 or len(tasks) <= 1:
        return [fn(task) for task in tasks]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(fn, tasks, chunksize=chunksize))
