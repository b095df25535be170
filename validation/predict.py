"""The one place validation asks the model for a prediction.

``predict(problem, tiling, schedule, hw)`` returns the ``tilesim.prediction/1`` dict of the
timing simulator (``simulator.sim.predict``): time, DRAM bytes through the L2 model, bound.
Everything in ``validation/`` calls the model through this module; tests pass their own
predictor instead. ``predict_record`` predicts a measurement record with the occupancy its
kernels really had: the registers and shared memory the device's compiler gave them (the
record's ``kernel_facts``), where the record has them, instead of the model's estimate; and
with L2 as its timing left it (``l2_start_of``): ``do_bench`` zeroes 256 MiB before every
timed run, so each starts with L2 full of dirty lines that its first misses write back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from simulator.hardware import Hardware
from traces.problem import AttentionProblem, ProblemError
from traces.tiling import Tiling
from validation.records import DO_BENCH

# predictor(problem, tiling, schedule, hw, compiled=None, l2_start="cold")
#     -> tilesim.prediction/1 dict
Predictor = Callable[..., dict]


def model_name() -> str:
    """Which model ``predict`` uses."""
    return "simulator"


def predict(problem: AttentionProblem, tiling: Tiling, schedule: str, hw: Hardware,
            compiled=None, l2_start: str = "cold") -> dict:
    """The simulator's prediction for one configuration (``compiled``: kernel name ->
    ``simulator.occupancy.CompiledResources``, where known; ``l2_start``: what L2 held when
    the call was timed, ``simulator.sim.L2_STARTS``; the kernels as Nsight Compute
    profiles them, cold, and alone where that differs: ``simulator.sim.predict_as_timed``
    with ``profiled``)."""
    from simulator.sim import predict_as_timed

    return predict_as_timed(problem, tiling, schedule, hw, compiled, l2_start,
                            profiled=True)[0]


def l2_start_of(rec: dict) -> str:
    """What L2 held when the record's timed runs started: "dirty" after ``do_bench``'s flush
    (it zeroes a 256 MiB buffer, and L2 is write-back: the last ``l2_bytes`` of zeros are
    still there, dirty; ``simulator.sim.l2``), "cold" for any other timing, which the model
    does not know better."""
    timing = rec.get("timing") or {}
    flushed = timing.get("method") == DO_BENCH and timing.get("l2_flushed") is True
    return "dirty" if flushed else "cold"


def compiled_resources(rec: dict, hw: Hardware | None = None) -> dict | None:
    """Kernel name -> ``CompiledResources`` from a record's ``kernel_facts`` (the device
    compile's registers, shared memory and, in records made after 2026-12-02, its main loop's
    spill traffic, stack frame, waits for reloaded spills and instructions, or a loop-less
    kernel's instructions; ``occupancy.spill_fields``); None if it has neither for any
    kernel, or if
    ``hw`` is another architecture than the GPU the record ran on (its compile says nothing
    of another's). A register count of 0 is no count (``CompiledResources`` says so)."""
    from simulator.occupancy import CompiledResources, spill_fields

    capability = (rec.get("environment") or {}).get("gpu_capability")
    if hw is not None and capability and capability.replace(".", "") != str(
            hw.compute_capability):
        return None
    found = {}
    for fact in rec.get("kernel_facts") or ():
        loaded, stored = (fact.get(f"spill_{kind}_bytes_per_iteration")
                          for kind in ("load", "store"))
        waits, loop_issued, straight_issued, prologue, epilogue, masked, frame = (
            None if fact.get(key) is None else int(fact[key])
            for key in ("spill_reload_waits", "loop_instructions", "straight_instructions",
                        "prologue_instructions", "epilogue_instructions",
                        "masked_loop_instructions", "spill_bytes"))
        given = CompiledResources(
            None if fact.get("registers") is None else int(fact["registers"]),
            None if fact.get("shared_bytes") is None else int(fact["shared_bytes"]),
            spill_reload_waits=waits, loop_instructions=loop_issued,
            straight_instructions=straight_issued, prologue_instructions=prologue,
            epilogue_instructions=epilogue, masked_loop_instructions=masked,
            **spill_fields(loaded, stored, frame))
        if given != CompiledResources():
            found[fact["name"]] = given
    return found or None


def predict_record(predictor: Predictor, rec: dict, hw: Hardware) -> dict:
    """``predictor``'s prediction for a Triton record, with the record's compiled resources
    (``compiled=``; None where it has none) and L2 as its timing found it (``l2_start=``).
    ``ProblemError`` if its ``kernel_facts`` name a kernel the record's schedule does not
    launch (they belong to another config)."""
    from traces.schedules import build_schedule

    problem, tiling = AttentionProblem.from_dict(rec["problem"]), Tiling.from_dict(rec["tiling"])
    named = {fact["name"] for fact in rec.get("kernel_facts") or ()}
    if named:
        launched = {k.name for k in build_schedule(problem, tiling, rec["schedule"]).kernels}
        stray = sorted(named - launched)
        if stray:
            raise ProblemError(f"kernel_facts name {', '.join(stray)}, which "
                               f"{rec['schedule']} {problem.pass_} does not launch "
                               f"({', '.join(sorted(launched))})")
    return predictor(problem, tiling, rec["schedule"], hw,
                     compiled=compiled_resources(rec, hw), l2_start=l2_start_of(rec))


def predict_or_refusal(task) -> tuple[dict | None, str | None]:
    """``(prediction, None)`` for ``task = (predictor, record, hw)`` (``predict_record``), or
    ``(None, why)`` when the model refuses the record's config (an illegal tiling, say);
    module-level, so that ``map_tasks`` can send it to other processes."""
    predictor, rec, hw = task
    try:
        return predict_record(predictor, rec, hw), None
    except ProblemError as exc:
        return None, str(exc)


def map_tasks(fn: Callable, tasks: Sequence, jobs: int = 1, chunksize: int = 1,
              progress: Callable[[int, int], None] | None = None) -> list:
    """``[fn(task) for task in tasks]``, spread over ``jobs`` processes when ``jobs > 1``.

    ``fn`` and everything in the tasks (a predictor, say) must be picklable: module-level
    functions. The order of the results is the order of the tasks. ``progress(done,
    total)``, if given, is called as each result arrives (in that order).
    """
    results: list = []

    def collect(values) -> list:
        for value in values:
            results.append(value)
            if progress:
                progress(len(results), len(tasks))
        return results

    if jobs <= 1 or len(tasks) <= 1:
        return collect(fn(task) for task in tasks)
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=min(jobs, len(tasks))) as pool:
        return collect(pool.map(fn, tasks, chunksize=chunksize))
