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

import numpy as np

from simulator.hardware import Hardware
from traces.problem import AttentionProblem, ProblemError
from traces.tiling import Tiling

FULL_MODE_MAX_STEPS = 20_000
# ``predict_as_timed`` simulates a later launch again alone, as Nsight Compute profiles it
# (L2 invalidated first), where the bytes it found in L2 of earlier launches' stores
# (``carried_bytes``) reach this share of what it read from DRAM.
PROFILE_ALONE_SHARE = 0.01
MODES = ("auto", "full", "aggregated")
# What L2 holds when the run starts: "cold", nothing; "dirty", the preset's whole capacity
# of another program's dirty lines, as ``triton.testing.do_bench`` leaves it before every
# timed run (it zeroes 256 MiB; ``simulator.sim.l2``, "Foreign dirty data").
L2_STARTS = ("cold", "dirty")


@dataclass
class Simulation:
    problem: AttentionProblem
    tiling: Tiling
    schedule: str
    hardware: Hardware
    tensor_names: list[str]
    tensor_nbytes: list[int]  # each tensor's size, in ``tensor_names`` order
    runs: list  # KernelRun per kernel launch, in order
    mode: str
    wall_s: float  # seconds the simulation itself took (not the Python start-up)
    compiled: dict | None = None  # kernel name -> CompiledResources, where given
    l2_start: str = "cold"  # one of L2_STARTS

    @property
    def time_s(self) -> float:
        return sum(r.time_s for r in self.runs)

    @property
    def events(self) -> int:
        return sum(r.events for r in self.runs)


def _check_l2_start(l2_start: str) -> None:
    if l2_start not in L2_STARTS:
        raise ProblemError(f'"l2_start" must be one of {", ".join(L2_STARTS)}, got '
                           f'{l2_start!r}.')


def misfit(schedule, hw: Hardware, compiled=None) -> tuple[str, str] | None:
    """Why a CTA of some kernel cannot be resident at all (with the registers and shared
    memory of ``compiled``, by kernel name, where given), as ``(reason, advice)``: the
    limit it exceeds, and what to change, with its punctuation; None where every kernel
    fits."""
    from simulator.occupancy import kernel_residency

    for kernel in schedule.kernels:
        res = kernel_residency(kernel, schedule.tiling, schedule.problem.head_dim, hw,
                               compiled)
        if res.ctas_per_sm > 0:
            continue
        t = schedule.tiling
        tiles = f"BM={t.block_m} BN={t.block_n} stages={t.num_stages} warps={t.num_warps}"
        if res.smem_per_cta_bytes > hw.smem_per_cta_max_bytes:
            return (f"tiling {tiles} does not fit on {hw.name}: {kernel.name} needs "
                    f"{res.smem_per_cta_bytes / 1024:.1f} KiB of shared memory per CTA, the "
                    f"GPU allows {hw.smem_per_cta_max_bytes / 1024:.1f} KiB",
                    " (try smaller blocks or fewer stages)")
        if t.threads > hw.max_threads_per_sm:
            return (f"tiling {tiles} does not fit on {hw.name}: a {kernel.name} CTA has "
                    f"{t.threads} threads (the SM runs at most {hw.max_threads_per_sm})",
                    "; use fewer warps")
        return (f"tiling {tiles} does not fit on {hw.name}: a {kernel.name} CTA needs "
                f"{res.registers_per_thread} registers x {t.threads} threads "
                f"(the SM has {hw.registers_per_sm})", "; use fewer warps or smaller blocks")
    return None


def check_one_storer(schedule) -> None:
    """Each tensor is stored by at most one kernel of the schedule: what a kernel leaves
    dirty in L2 is attributed to it by tensor (``record.KernelRun``), and a tensor two
    kernels stored would be counted twice. A schedule that breaks this is a bug."""
    from traces.schedules import STORE

    storer: dict[str, str] = {}
    for kernel in schedule.kernels:
        for access in kernel.accesses:
            if access.kind == STORE:
                first = storer.setdefault(access.tensor, kernel.name)
                if first != kernel.name:
                    raise ValueError(f"tensor {access.tensor!r} is stored by {first} and "
                                     f"{kernel.name}; the L2 model needs one storer.")


def check_fits(schedule, hw: Hardware, compiled=None) -> None:
    """Raise ``ProblemError`` (one line: ``misfit``'s reason and advice) if a CTA of some
    kernel cannot be resident at all."""
    found = misfit(schedule, hw, compiled)
    if found is not None:
        raise ProblemError("".join(found))


def run(problem: AttentionProblem, tiling: Tiling, schedule: str, hw: Hardware,
        mode: str = "auto", compiled=None, l2_start: str = "cold",
        kernels: int | None = None, alone: int | None = None) -> Simulation:
    """Simulate every kernel of the schedule's pass; ``ProblemError`` if a tiling cannot run
    (``DeviceMemoryError`` if the problem's tensors do not fit on the GPU at all).

    ``compiled`` maps kernel names to ``simulator.occupancy.CompiledResources``: the
    registers and shared memory the compiler gave them, used for residency instead of the
    estimate. ``l2_start`` is what L2 holds at the start (``L2_STARTS``): with "dirty" the
    first allocations also write another program's data back to DRAM, in HBM time the
    kernels pay; for the same order of accesses their own hits, misses and DRAM bytes are
    those of a cold start. ``kernels``: simulate only the first that many launches
    (``mode`` "auto" then decides on those alone). ``alone``: simulate only launch
    ``alone`` (0-based), by itself on an empty L2, as Nsight Compute profiles it
    (``--cache-control all`` invalidates L2 before each kernel).
    """
    from simulator.device_memory import check_device_memory
    from simulator.sim.l2 import BlockLayout, L2Cache
    from simulator.sim.program import schedule_programs
    from simulator.sim.warmup import fast_numba_start
    from traces.schedules import build_schedule

    if mode not in MODES:
        raise ProblemError(f'"mode" must be one of {", ".join(MODES)}, got {mode!r}.')
    _check_l2_start(l2_start)
    started = time.perf_counter()
    check_device_memory(problem, tiling, schedule, hw)
    sched = build_schedule(problem, tiling, schedule)
    check_fits(sched, hw, compiled)
    fast_numba_start()
    check_one_storer(sched)
    programs = schedule_programs(sched, hw, compiled=compiled)
    if kernels is not None and alone is not None:
        raise ProblemError('give "kernels" or "alone", not both.')
    if kernels is not None:
        if not 1 <= kernels <= len(programs):
            raise ProblemError(f'"kernels" must be 1 to {len(programs)}, got {kernels}.')
        programs = programs[:kernels]
    if alone is not None:
        if not 0 <= alone < len(programs):
            raise ProblemError(f'"alone" must be 0 to {len(programs) - 1}, got {alone}.')
        programs = [programs[alone]]
    steps = sum(p.iterations + p.grid for p in programs)
    if mode == "auto":
        mode = "full" if steps <= FULL_MODE_MAX_STEPS else "aggregated"
    layout = BlockLayout.from_schedule(sched)
    if l2_start == "dirty":
        layout = layout.with_foreign(hw.l2_bytes)
    cache = L2Cache(hw.l2_bytes, layout)
    if l2_start == "dirty":
        cache.fill_foreign()
    if mode == "full":
        from simulator.sim.full import FullEngine as Engine
    else:
        from simulator.sim.fluid import FluidEngine as Engine
    runs = Engine(programs, hw, cache, tiling.num_stages).run()
    return Simulation(problem, tiling, schedule, hw, sched.tensor_names,
                      [t.nbytes for t in sched.tensors.values()], runs, mode,
                      time.perf_counter() - started, compiled, l2_start)


def predict(problem: AttentionProblem, tiling: Tiling, schedule: str, hw: Hardware,
            mode: str = "auto", compiled=None, l2_start: str = "cold"
            ) -> tuple[dict, Simulation]:
    """The full ``tilesim.prediction/1`` dict, and the simulation behind it."""
    from simulator.sim.results import fill_prediction

    sim = run(problem, tiling, schedule, hw, mode, compiled, l2_start)
    return fill_prediction(sim), sim


def predict_as_timed(problem: AttentionProblem, tiling: Tiling, schedule: str, hw: Hardware,
                     compiled=None, l2_start: str = "cold",
                     profiled: bool = False) -> tuple[dict, Simulation]:
    """The prediction of a measured call, each number as its measurement saw L2.

    The kernels and bytes are those of a cold run, as Nsight Compute profiles the call's
    first kernel: it flushes and invalidates L2 before every kernel. The model's later
    kernels start with what the earlier ones left in L2 (written back, still resident), as
    in the timed call: where one re-reads what an earlier one wrote and L2 holds it
    (decode's reduce, the split's partials), it hits here and misses under ncu. With
    ``profiled`` (reconciliation asks for it) such a kernel (``carried_bytes``, at least
    ``PROFILE_ALONE_SHARE`` of its DRAM reads) is simulated again alone, and its entry
    gets ``profiled``: its time, DRAM bytes and what it left dirty as ncu profiles it.
    The call's time is what the timing saw: with
    ``l2_start`` "dirty" (``do_bench``'s flush) the cold run's time plus what the dirty
    start adds to its first kernel, simulated on its own in the same mode
    (``dirty_start``: those seconds and the foreign bytes written back). The kernels
    after the first run as in the cold run: by then the first has written back the
    foreign data (all of it, once it has allocated ``l2_bytes``; the rest, if it
    allocates less, is left out, as is any difference the first kernel's timing makes to
    their order of accesses).
    """
    _check_l2_start(l2_start)
    pred, cold = predict(problem, tiling, schedule, hw, compiled=compiled)
    pred["l2_start"] = l2_start
    for i, entry in enumerate(pred["kernels"] if profiled else ()):
        if i and carried_bytes(cold, i) >= PROFILE_ALONE_SHARE * max(cold.runs[i].dram_read, 1):
            alone = run(problem, tiling, schedule, hw, cold.mode, compiled, alone=i).runs[0]
            entry["profiled"] = {"time_s": float(alone.time_s),
                                 "dram_read": int(alone.dram_read),
                                 "dram_write": int(alone.dram_write),
                                 "left_dirty": alone.left_dirty}
    if l2_start == "dirty":
        first = run(problem, tiling, schedule, hw, cold.mode, compiled, "dirty", kernels=1)
        extra = float(first.runs[0].time_s - cold.runs[0].time_s)
        written = int(first.runs[0].foreign_writeback_bytes)
        pred["time_s"] += extra
        pred["bytes"]["foreign_dram_write"] = written
        pred["dirty_start"] = {"kernel": first.runs[0].name, "time_s": extra,
                               "foreign_dram_write": written}
    return pred, cold


def carried_bytes(sim: Simulation, i: int) -> int:
    """At most how many bytes launch ``i`` of ``sim`` found in L2 that earlier launches had
    stored there: its hits on the tensors they stored, but no more than those tensors' size
    nor than what they left dirty (``left_dirty``). 0 for the first launch. Its hits on
    such a tensor may include its own re-reads (the backward's dK/dV reads delta once per
    block of keys): the bounds keep those from counting."""
    from simulator.sim.l2 import HIT, MISS, WRITE

    runs = sim.runs
    if i == 0:
        return 0
    stored = np.zeros(len(sim.tensor_names), dtype=bool)
    for r in runs[:i]:
        stored |= r.tensor_bytes[:, WRITE] > 0
    mine = runs[i].tensor_bytes
    shared = stored & (mine[:, HIT] + mine[:, MISS] > 0)
    if not shared.any():
        return 0
    size = int(np.asarray(sim.tensor_nbytes, dtype=np.int64)[shared].sum())
    left = sum(r.left_dirty for r in runs[:i])
    return int(min(mine[shared, HIT].sum(), size, left))


def simulate(problem: AttentionProblem, tiling: Tiling, schedule: str, hw: Hardware,
             mode: str = "auto", timeline: bool = False, compiled=None,
             l2_start: str = "cold") -> dict:
    """The full ``tilesim.prediction/1`` dict; with ``timeline`` also ``"timeline"``: the
    ``KernelRun`` of each launch (CTA start, end and slot; not JSON — pop it first)."""
    pred, sim = predict(problem, tiling, schedule, hw, mode, compiled, l2_start)
    if timeline:
        pred["timeline"] = sim.runs
    return pred
