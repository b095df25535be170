"""The aggregated engine: CTAs as fluid jobs; the L2 model still sees every tile.

Replaying every tile step (``full``) costs a few events per step, and a long causal run has
tens of millions. This engine keeps the full engine's model but changes its unit of time
from the step to the CTA phase:

- **Dispatch** is the full engine's: launch order, ``sm_count x ctas_per_sm`` slots, the
  next CTA takes the first slot that frees. Loop-less kernels of more than
  ``MAX_JOBS_PER_SLOT`` waves run ``m`` CTAs a wave apart as one job, back to back in one
  slot (``_jobs`` says why only those, and why a wave apart), as a single phase where its
  SM can hide their latency and compute (``_fold_merged`` says why and when).
- **A CTA** is up to four phases run back to back in its slot: the latency of its first
  loads; the transfer of those loads (the prologue's and the first ``num_stages - 1``
  iterations' — when a wave starts together these bursts share the memory system, as they
  do on the GPU); the body; and the epilogue's stores, which the CTA waits for before it
  retires. After the first wave, CTAs start one by one as slots free, and their short
  phases are folded into the body when together they take under ``costs.FOLD`` of it. Each
  phase needs ``B`` bytes through L2 and its SM's port, ``M`` of HBM's capacity (its L2
  misses, each taking ``costs.miss_occupancy`` bytes of it at the mean latency factor,
  the latency inside, and a read of part of a line the line's transfer
  (``program.hbm_line_cost``): a later CTA's first misses have their latency phase join their
  transfer's path, while the first wave's, which wait out their latency together, take
  it byte for byte), ``K`` seconds of its SM's compute, and cannot be shorter than its
  critical path ``CP`` alone on the GPU. With ``s`` stages,
  iteration ``t``'s loads are issued when iteration ``t - s + 1`` has computed (Triton's
  order: ``full`` says how), so the loop runs at ``max(compute, (latency + transfer +
  compute) / (s - 1))`` per iteration (one or two stages: ``latency + transfer +
  compute``); the body's path is that loop plus the epilogue. A step's latency is HBM's
  for the share of the CTA's steps that missed L2, L2's otherwise, scaled by the CTA's
  ``costs.latency_factor`` as in the full engine.
- **Write-backs** of the dirty blocks a phase's accesses evict (``W``) are no phase's
  bytes: they join the kernel's write-back flow, which shares HBM with the phases and which
  no phase waits for (the full engine's write-backs, which nobody waits for either); the
  kernel ends when it has drained, the last one too (a fair share among all resident
  CTAs, the flow can lag far behind them in a kernel that writes as much as it reads).
  In a kernel without a loop the body is one compute step, and it queues on its SM first
  come, first served, as the full engine's steps do, rather than sharing the SM's units:
  the CTAs of an SM then finish their bodies one after another, not all at once, and
  one-shot CTAs that start together drift apart instead of running in lock-step (naive
  softmax, HBM-bound: a third slower than the full engine when its bodies shared).
- **Sharing**: between two events (a phase ending) every resident phase progresses at a
  constant rate set by max-min fair sharing of L2, HBM and its SM's compute and port
  (``fairshare``). A SimPy process steps from event to event (``fluid_kernel``).
- **L2** is the full engine's tile-level LRU, fed in time order (``stream``: a CTA's loop
  steps evenly spaced from the start of its body to its end). Hits depend on timing and
  timing on hits, so each kernel is timed twice: pass A (CTAs as single phases,
  compulsory misses only: an infinite cache), the L2 replay in pass A's order, and pass C
  (the phases, the replayed misses). If pass C's kernel time differs from pass A's by more
  than ``REFINE_TOLERANCE`` (and the CTAs loop), the replay and pass C are repeated once in
  pass C's order.

What the aggregation gives up: the order of tile accesses within a CTA's lifetime (its
steps are evenly spaced, so a follower does not catch up with a leader that waits on a
miss, as it does in the full engine, where identical CTAs also stay in lock-step after
the first wave). ``tests/test_sim_aggregate.py`` measures the difference against the full
engine on a matrix of schedules and tilings at moderate size and asserts ``ERROR_BOUND``
(per kernel, time and DRAM bytes); BENCHMARKS.md lists the stress cases outside it (L2
far smaller than the working set: causal backward, FA1, naive with one stage).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simpy

from simulator.hardware import Hardware
from simulator.sim.costs import CtaCosts, miss_occupancy
from simulator.sim.fluid_kernel import BODY, FluidKernel
from simulator.sim.l2 import L2Cache
from simulator.sim.program import KernelProgram
from simulator.sim.record import KernelRun
from simulator.sim.stream import replay

# Above this many waves one-shot CTAs merge into jobs (``_jobs``). Each wave unmerged is
# about four events per slot, and an event costs in proportion to the slots (naive QK at
# 62 waves on the H200, 1,056 slots: 266 k events, 7.6 s; merged four a job, 1.3 s). At
# 16, merging moved no kernel's time against the full engine by more than 2.3 points
# (3.9 at 8; BENCHMARKS.md, "Accuracy of the aggregation": measured 2026-12-07; 64 before).
MAX_JOBS_PER_SLOT = 16
# When a merged job of one-shot CTAs is one phase (``_fold_merged``): its SM holds more
# than FOLD_MAX_ALONE CTAs, or HBM is oversubscribed FOLD_MIN_HBM_DEMAND times; across
# FOLD_BLEND of that (a fraction either side) the job's phases blend into one.
FOLD_MAX_ALONE = 2
FOLD_MIN_HBM_DEMAND = 2.5
FOLD_BLEND = 0.1
REFINE_TOLERANCE = 0.02
# Aggregated against full engine, per kernel, asserted by tests/test_sim_aggregate.py.
# Time was 7% until HBM's bytes in flight (2026-12-02) took naive P·V, HBM-bound, from
# +6.3% to +7.2% (BENCHMARKS.md, "Accuracy of the aggregation").
ERROR_BOUND = {"time": 0.08, "dram_bytes": 0.08}


@dataclass(frozen=True)
class Jobs:
    """CTAs grouped into the fluid's jobs: job ``i`` runs CTAs ``order[first[i]:first[i +
    1]]`` back to back in one slot (``order`` None: the grid's order, and then one CTA a
    job)."""

    order: np.ndarray | None
    first: np.ndarray

    def in_job_order(self, x: np.ndarray) -> np.ndarray:
        """Per-CTA ``x`` (grid order) in job order."""
        return x if self.order is None else x[self.order]

    def in_grid_order(self, x: np.ndarray) -> np.ndarray:
        """Per-CTA ``x`` in job order, back in grid order."""
        if self.order is None:
            return x
        y = np.empty_like(x)
        y[self.order] = x
        return y


def _jobs(grid: int, slots: int, loopless: bool) -> Jobs:
    """The CTAs of each job: one CTA each, except in kernels without a loop (one-shot CTAs
    such as naive attention's) with more than ``MAX_JOBS_PER_SLOT`` waves, where a job is
    ``m = ceil(waves / MAX_JOBS_PER_SLOT)`` CTAs a wave apart. The grid is cut into rounds
    of ``m`` waves, and in each round job ``s`` runs CTAs ``s``, ``s + slots``, ``s + 2
    slots``, ...: what slot ``s`` gets when the waves run in step. So at any time the
    resident CTAs are neighbours in launch order, as on the GPU, and L2 sees the tiles they
    share together (jobs of ``m`` consecutive CTAs, as before 2026-12-07, held CTAs ``m``
    apart: their DRAM bytes were up to 4.5% above the full engine's where ``m`` was 32;
    BENCHMARKS.md, "Accuracy of the aggregation"). CTAs that loop share tiles with the
    CTAs resident with them over their lifetime, so they are never merged."""
    per_job = -(-grid // (MAX_JOBS_PER_SLOT * slots)) if loopless else 1
    if per_job <= 1:
        return Jobs(None, np.arange(grid, dtype=np.int64))
    cta = np.arange(grid, dtype=np.int64)
    span = slots * per_job
    start = cta - cta % span  # the first CTA of each CTA's round
    width = np.minimum(slots, grid - start)  # a short last round has fewer jobs
    key = start // span * slots + (cta - start) % width  # round, then job in the round
    order = np.argsort(key, kind="stable")  # a job's CTAs stay in launch order
    sizes = np.bincount(key)
    sizes = sizes[sizes > 0]
    return Jobs(order, np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64))


class FluidEngine:
    """Runs every kernel of a schedule through passes A, B and C (module docstring)."""

    def __init__(self, programs: list[KernelProgram], hw: Hardware, cache: L2Cache,
                 num_stages: int):
        self.programs, self.hw, self.cache, self.stages = programs, hw, cache, num_stages
        self.env = simpy.Environment()
        self.runs: list[KernelRun] = []

    def run(self) -> list[KernelRun]:
        self.env.process(self._kernels())
        self.env.run()
        return self.runs

    def _kernels(self):
        for prog in self.programs:
            launch = self.env.now
            yield self.env.timeout(self.hw.kernel_launch_overhead_s)
            yield from self._kernel(prog, launch)

    def _kernel(self, prog: KernelProgram, launch: float):
        hw, cache = self.hw, self.cache
        costs = CtaCosts(prog, hw, self.stages, cache.layout.rows.size)
        slots = min(hw.sm_count * prog.residency.ctas_per_sm, prog.grid)
        loopless = prog.iterations == 0  # one-shot CTAs: merged jobs, queued bodies
        jobs = _jobs(prog.grid, slots, loopless)
        saved, stats_before = cache.snapshot(), cache.stats.copy()
        # Pass A: each CTA one phase, compulsory misses only.
        miss, written, miss_cost = costs.compulsory_misses(cache.layout.tensor_bytes)
        fraction = np.divide(miss, costs.load, out=np.zeros(prog.grid), where=costs.load > 0)
        cost_fraction = np.divide(miss_cost, costs.load, out=np.zeros(prog.grid),
                                  where=costs.load > 0)
        burst = np.zeros(prog.grid, dtype=np.bool_)  # CTAs that start the first wave
        burst[jobs.in_job_order(np.arange(prog.grid))[jobs.first[:slots]]] = True
        # The HBM capacity a missed byte takes (``costs.miss_occupancy``), at the mean
        # latency factor (1: per CTA, the jobs of one-shot CTAs would all end apart, an
        # event each), but the first wave's first loads: their latency is a phase of its own.
        charge = np.full((prog.grid, 4), miss_occupancy(hw, costs.inflight_bytes(slots)))
        charge[burst, 1] = 1.0

        def charged(phases):
            # Any other CTA's first misses pay their latency inside the charge (as in the
            # full engine): their latency phase joins their transfer's critical path.
            B, M, K, CP, W, moved = phases
            inside = ~burst & (M[:, 1] > 0)
            CP = CP.copy()
            CP[inside, 1] += CP[inside, 0]
            CP[inside, 0] = 0.0
            return B, M + moved * (charge - 1.0), K, CP, W, moved

        phases = costs.phases(miss, costs.first_load * fraction, written, fraction, burst,
                              miss_cost, costs.first_load * cost_fraction)
        timed = self._fluid(slots, jobs,
                            *(p.sum(axis=1, keepdims=True) for p in charged(phases)))
        events, tiles = timed.events, 0
        for attempt in range(2):
            start, loop_start, end, _ = _cta_times(timed, jobs, phases[3].sum(axis=1))
            if attempt:
                cache.restore(saved)
            (hit, miss, written, first_miss, steps, missed, looked_up, miss_cost,
             first_cost) = replay(cache, prog, start, loop_start, end, costs.ahead)
            tiles += int(looked_up[0])
            phases = costs.phases(miss.astype(np.float64), first_miss.astype(np.float64),
                                  written.astype(np.float64),
                                  np.divide(missed, steps, out=np.zeros(prog.grid),
                                            where=steps > 0), burst, miss_cost, first_cost)
            final = self._fluid(slots, jobs, *charged(phases), queued_body=loopless)
            events += final.events
            if loopless or abs(final.span_s - timed.span_s) <= REFINE_TOLERANCE * final.span_s:
                break  # one-shot CTAs: their order hardly depends on timing
            timed = final
        start, _, end, slot = _cta_times(final, jobs, phases[3].sum(axis=1))
        begin = self.env.now
        # The write-backs of the blocks its CTAs evicted finish within the kernel: they are
        # bytes it moved (the flow lags the CTAs, as a fair share of HBM among all of them;
        # ended at its last CTA, an HBM-bound kernel that writes as much as it reads would
        # end with most of its writes unmoved). What it leaves dirty stays in L2
        # (record.KernelRun).
        ran = float(end.max()) if prog.grid else 0.0
        yield self.env.timeout(max(ran, final.drained_s))
        segments = final.segments[: final.counters[1]] + [begin, begin, 0.0, 0.0]
        traffic, foreign = cache.traffic_since(stats_before)
        self.runs.append(KernelRun(
            name=prog.name, launch_s=launch, start_s=begin, end_s=self.env.now,
            ctas_per_sm=prog.residency.ctas_per_sm, slots=slots,
            sram_bytes_per_cta=prog.sram_bytes, cta_start=start + begin, cta_end=end + begin,
            cta_slot=slot, tensor_bytes=traffic, dirty_bytes=cache.dirty_bytes(),
            foreign_writeback_bytes=foreign, events=events, tile_accesses=tiles,
            mode="aggregated", hbm_segments=segments[:, [0, 1, 3]],
            l2_segments=segments[:, [0, 1, 2]], unit_s=prog.totals()["unit_s"].sum(axis=1),
            issued=prog.totals()["work"].sum(axis=1),
            hbm_line_extra_bytes=float(miss_cost.sum() - miss.sum()),
        ))

    def _fluid(self, slots: int, jobs: Jobs, B, M, K, CP, W, moved,
               queued_body: bool = False) -> FluidKernel:
        """Time the kernel's ``jobs`` on a scratch environment;
        ``M`` is the HBM capacity their misses take, ``moved`` their bytes (``FluidKernel``).

        A job of several CTAs has each phase summed over them: its latencies, then its
        first loads, its bodies, its last stores; or, where its SM can hide their
        latency and compute (``_fold_merged``), one phase of all of them.
        """
        summed = [np.add.reduceat(jobs.in_job_order(x), jobs.first, axis=0)
                  for x in (B, M, K, CP, W, moved)]
        return FluidKernel(self.hw, slots,
                           *_fold_merged(summed, jobs.first, B.shape[0], slots, self.hw),
                           queued_body=queued_body).run()


def _fold_merged(jobs: list[np.ndarray], first: np.ndarray, grid: int, slots: int,
                 hw: Hardware) -> list[np.ndarray]:
    """Jobs of several CTAs with all their phases in the body, where their SM can hide
    them (below).

    Summed phase by phase, a job of ``m`` CTAs loads for all of them, then computes for
    all, then stores: identical jobs that start together then load together and compute
    together, and HBM idles while they compute, wave after wave (naive softmax at B = 2,
    H = 16, N = 8k on the H200, 7 CTAs a job: 1.34x the HBM time of its bytes, where the
    full engine, whose slots drift apart, gives 1.00x). As one phase the job's loads,
    compute and stores proceed together at their shared rates, no faster than the sum of
    its CTAs' critical paths: what the slots of an SM achieve between them when their CTAs
    are out of step and cover each other's latency and compute. That needs company: with
    at most ``FOLD_MAX_ALONE`` CTAs on an SM and HBM not ``FOLD_MIN_HBM_DEMAND`` times
    oversubscribed (the slots' HBM bytes at their critical paths' pace against its rate),
    a slot's own latency and compute add to its transfers, and folding was 20-35% faster
    than the full engine where the summed phases were 14-15% slower, so such jobs keep
    their phases. Both thresholds are read off ten cases measured against the full engine
    (BENCHMARKS, "Accuracy of the aggregation"). Jobs of one CTA and pass A's single
    phases are kept.

    The HBM threshold is a ramp, not a switch: within ``FOLD_BLEND`` of it (2.25-2.75
    times oversubscribed) a fraction ``fold_weight`` of each phase moves into the body, so
    the time moves steeply but continuously with the rates there (as a switch, the
    validation plan's naive N = 16k jumped 35% where a calibrated exp rate crossed it, and
    a finite-difference derivative across it was meaningless).
    """
    if jobs[0].shape[1] <= BODY or first.size == grid:
        return jobs
    B, M, K, CP, W = jobs[:5]
    merged = np.diff(np.append(first, grid)) > 1
    # One decision for the kernel (its merged jobs' bytes over their paths), not one per
    # job: jobs of one kernel differ in their misses, and a kernel of mixed jobs would be
    # neither.
    path = CP[merged].sum()
    demand = slots * (M[merged].sum() + W[merged].sum()) / path if path > 0 else 0.0
    weight = fold_weight(slots > FOLD_MAX_ALONE * hw.sm_count,
                         demand / hw.hbm_effective_bytes_per_s)
    if weight == 0.0:
        return jobs
    folded = []
    for x in jobs:
        x = x.copy()
        total = x[merged].sum(axis=1)
        x[merged] *= 1.0 - weight
        x[merged, BODY] += weight * total
        folded.append(x)
    return folded


def fold_weight(crowded: bool, oversubscription: float) -> float:
    """How much of a merged job becomes one phase (``_fold_merged``): all where its SM is
    ``crowded`` (more than ``FOLD_MAX_ALONE`` CTAs), else rising linearly from 0 to 1 as
    HBM's ``oversubscription`` crosses ``FOLD_MIN_HBM_DEMAND`` +- ``FOLD_BLEND`` of it."""
    if crowded:
        return 1.0
    low = FOLD_MIN_HBM_DEMAND * (1.0 - FOLD_BLEND)
    high = FOLD_MIN_HBM_DEMAND * (1.0 + FOLD_BLEND)
    return float(min(max((oversubscription - low) / (high - low), 0.0), 1.0))


def _cta_times(fluid: FluidKernel, jobs: Jobs, path: np.ndarray):
    """Start, loop start, end and slot of every CTA (``path``: each CTA's critical path;
    all in grid order).

    A job of several CTAs has its span cut in proportion to its CTAs' paths (their loops
    start when they start); a job of one CTA starts its loop with its body phase.
    """
    grid, first = path.shape[0], jobs.first
    path = jobs.in_job_order(path)
    job = np.repeat(np.arange(first.size), np.diff(np.append(first, grid)))
    before = np.cumsum(path) - path
    job_total = np.add.reduceat(path, first)[job]
    span = (fluid.job_end - fluid.job_start)[job]
    share = np.divide(span, job_total, out=np.zeros(grid), where=job_total > 0)
    start = fluid.job_start[job] + (before - before[first][job]) * share
    # A CTA ends where the next of its job starts (exactly: slots must not overlap).
    end = np.append(start[1:], 0.0)
    last = np.append(first[1:], grid) - 1
    end[last] = fluid.job_end
    body = fluid.phase_start[:, BODY] if fluid.phase_start.shape[1] > BODY else fluid.job_start
    alone = np.diff(np.append(first, grid)) == 1
    loop_start = np.where(alone[job], body[job], start)
    return tuple(jobs.in_grid_order(x) for x in (start, loop_start, end, fluid.job_slot[job]))
