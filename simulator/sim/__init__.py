"""The timing simulator: a schedule's kernel launches replayed on a GPU preset with SimPy.

``simulate(problem, tiling, schedule, hw)`` runs the model of ``DESIGN.md`` level 3 and
returns the ``tilesim.prediction/1`` dict (``timeline=True`` adds the per-launch
``KernelRun`` records under ``"timeline"``); ``predict`` returns that dict and the
``Simulation`` behind it; ``run`` only the ``Simulation``. Two engines implement one model:

- ``full``: every tile load, store and compute step is an event (``sim.full``);
- ``aggregated``: CTA phases are fluid jobs, every tile still goes through the L2 model
  (``sim.fluid``); its error against ``full`` is measured and bounded by tests.

``mode="auto"`` picks ``full`` up to ``FULL_MODE_MAX_STEPS`` CTA steps (loop iterations plus
one per CTA for its prologue and epilogue) and ``aggregated`` above.

The modules, one concept each: ``program`` (a kernel's steps as arrays), ``compute`` (step
time on an SM), ``l2`` (the cache), ``bandwidth`` (processor-sharing pools), ``full`` and
``fluid`` (the engines), ``fairshare`` and ``stream`` (the fluid's rates and its L2 replay),
``record`` (what a run records), ``results`` (bound and prediction JSON), ``timeline``
(Chrome trace export).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from simulator.hardware import Hardware
from traces.problem import AttentionProblem, ProblemError
from traces.tiling import Tiling

FULL_MODE_MAX_STEPS = 20_000
MODES = ("auto", "full", "aggregated")


@dataclass
class Simulation:
    problem: AttentionProblem
    tiling: Tiling
    schedule: str
    hardware: Hardware
    tensor_names: list[str]
    runs: list  # KernelRun per kernel launch, in order
    mode: str
    wall_s: float  # seconds the simulation itself took (not the Python start-up)
    compiled: dict | None = None  # kernel name -> CompiledResources, where given

    @property
    def time_s(self) -> float:
        return sum(r.time_s for r in self.runs)

    @property
    def events(self) -> int:
        return sum(r.events for r in self.runs)


def check_fits(schedule, hw: Hardware, compiled=None) -> None:
    """Raise ``ProblemError`` (one line) if a CTA of some kernel cannot be resident at all
    (with the registers and shared memory of ``compiled``, by kernel name, where given)."""
    from simulator.occupancy import kernel_residency

    for kernel in schedule.kernels:
        res = kernel_residency(kernel, schedule.tiling, schedule.problem.head_dim, hw,
                               compiled)
        if res.ctas_per_sm > 0:
            continue
        t = schedule.tiling
        tiles = f"BM={t.block_m} BN={t.block_n} stages={t.num_stages} warps={t.num_warps}"
        if res.smem_per_cta_bytes > hw.smem_per_cta_max_bytes:
            raise ProblemError(
                f"tiling {tiles} does not fit on {hw.name}: {kernel.name} needs "
                f"{res.smem_per_cta_bytes / 1024:.1f} KiB of shared memory per CTA, the GPU allows "
                f"{hw.smem_per_cta_max_bytes / 1024:.1f} KiB (try smaller blocks or fewer stages)"
            )
        if t.threads > hw.max_threads_per_sm:
            raise ProblemError(
                f"tiling {tiles} does not fit on {hw.name}: a {kernel.name} CTA has "
                f"{t.threads} threads (the SM runs at most {hw.max_threads_per_sm}); use "
                f"fewer warps"
            )
        raise ProblemError(
            f"tiling {tiles} does not fit on {hw.name}: a {kernel.name} CTA needs "
            f"{res.registers_per_thread} registers x {t.threads} threads "
            f"(the SM has {hw.registers_per_sm}); use fewer warps or smaller blocks"
        )


def run(problem: AttentionProblem, tiling: Tiling, schedule: str, hw: Hardware,
        mode: str = "auto", compiled=None) -> Simulation:
    """Simulate every kernel of the schedule's pass; ``ProblemError`` if a tiling cannot run
    (``DeviceMemoryError`` if the problem's tensors do not fit on the GPU at all).

    ``compiled`` maps kernel names to ``simulator.occupancy.CompiledResources``: the
    registers and shared memory the compiler gave them, used for residency instead of the
    estimate.
    """
    from simulator.device_memory import check_device_memory
    from simulator.sim.l2 import BlockLayout, L2Cache
    from simulator.sim.program import schedule_programs
    from simulator.sim.warmup import fast_numba_start
    from traces.schedules import build_schedule

    if mode not in MODES:
        raise ProblemError(f'"mode" must be one of {", ".join(MODES)}, got {mode!r}.')
    started = time.perf_counter()
    check_device_memory(problem, tiling, schedule, hw)
    sched = build_schedule(problem, tiling, schedule)
    check_fits(sched, hw, compiled)
    fast_numba_start()
    programs = schedule_programs(sched, hw, compiled=compiled)
    steps = sum(p.iterations + p.grid for p in programs)
    if mode == "auto":
        mode = "full" if steps <= FULL_MODE_MAX_STEPS else "aggregated"
    cache = L2Cache(hw.l2_bytes, BlockLayout.from_schedule(sched))
    if mode == "full":
        from simulator.sim.full import FullEngine as Engine
    else:
        from simulator.sim.fluid import FluidEngine as Engine
    runs = Engine(programs, hw, cache, tiling.num_stages).run()
    return Simulation(problem, tiling, schedule, hw, sched.tensor_names, runs, mode,
                      time.perf_counter() - started, compiled)


def predict(problem: AttentionProblem, tiling: Tiling, schedule: str, hw: Hardware,
            mode: str = "auto", compiled=None) -> tuple[dict, Simulation]:
    """The full ``tilesim.prediction/1`` dict, and the simulation behind it."""
    from simulator.sim.results import fill_prediction

    sim = run(problem, tiling, schedule, hw, mode, compiled)
    return fill_prediction(sim), sim


def simulate(problem: AttentionProblem, tiling: Tiling, schedule: str, hw: Hardware,
             mode: str = "auto", timeline: bool = False, compiled=None) -> dict:
    """The full ``tilesim.prediction/1`` dict; with ``timeline`` also ``"timeline"``: the
    ``KernelRun`` of each launch (CTA start, end and slot; not JSON — pop it first)."""
    pred, sim = predict(problem, tiling, schedule, hw, mode, compiled)
    if timeline:
        pred["timeline"] = sim.runs
    return pred
