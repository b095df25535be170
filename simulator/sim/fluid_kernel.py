"""One kernel's CTAs as fluid jobs on the GPU's slots, stepped from event to event.

The integrator of the aggregated engine (``fluid``, which builds the jobs and replays L2).
A job is up to four phases run back to back in a slot; each phase needs ``B`` bytes
through L2 and its SM's port, ``M`` of HBM's capacity, ``K`` seconds of its SM's compute,
and is no shorter than its critical path ``CP``. Between two events (a phase ending)
every resident phase progresses at the constant rate that max-min fair sharing of L2,
HBM and its SM's compute and port gives it (``fairshare``); when a phase ends its job
enters its next phase, or retires and the slot takes the next job in order. The
write-backs a phase causes (``W``) join one write-back flow per kernel that shares HBM
with the phases and that no phase waits for. A SimPy process steps from event to event,
each step one compiled call (``_step``).
"""

from __future__ import annotations

import numpy as np
import simpy
from numba import njit

from simulator.hardware import Hardware
from simulator.sim.bandwidth import sm_port_bytes_per_s
from simulator.sim.fairshare import ROWS, fair_rates
from simulator.sim.record import CountingEnvironment

BODY = 2  # index of the body among a CTA's phases
_FINISHED = 1e-9  # remaining fraction below which a phase is done


class FluidKernel:
    """Fluid timing of one kernel's jobs on the GPU's slots (one SimPy process).

    Job arrays are ``[jobs, phases]``; a phase with ``CP == 0`` is skipped. ``M`` is the
    HBM capacity a phase's misses take (``costs.miss_occupancy``), ``moved`` the bytes they
    are (the HBM timeline's). State lives in a few packed arrays so
    that each event is one compiled call with few arguments.
    """

    def __init__(self, hw: Hardware, slots: int, B, M, K, CP, W, moved,
                 queued_body: bool = False):
        self.hw, self.slots = hw, slots
        jobs, phases = B.shape
        self.job = np.ascontiguousarray(np.stack([B, M, K, CP, W, moved]), dtype=np.float64)
        # Per job: start, end, then when each phase began (skipped phases: when passed).
        self.times = np.zeros((jobs, 2 + phases))
        self.job_slot = np.zeros(jobs, dtype=np.int64)
        # Columns: the slots, then the write-back flow (column ``slots``): remaining, rate,
        # B, M, K, CP, moved of the phase (of the write-backs pending).
        self.slot_f = np.zeros((_SF, slots + 1))
        self.slot_f[_S_CP] = np.inf
        self.slot_i = np.zeros((_SI, slots + 1), dtype=np.int64)  # job, phase, limit
        self.slot_i[_S_JOB] = -1
        self.counters = np.zeros(2, dtype=np.int64)  # next job, segments recorded
        # queued_body: a body is one compute step that queues first come, first served on
        # its SM (``sm_free``: when the SM's units are next free), as the full engine's do.
        self.queued_body = queued_body
        self.sm_free = np.zeros(hw.sm_count)
        # t0, t1, L2, HBM per event: a phase ending or a write-back flow draining.
        self.segments = np.zeros((2 * (phases + 1) * jobs + 2 * slots + 4, 4))
        self.drained_s = 0.0
        self.limit_s = np.zeros(5)  # phase-seconds bound by each LIMIT_*
        self.work = np.zeros((ROWS, slots + 1))  # kept between events (fairshare)
        self.dirty = np.zeros(hw.sm_count, dtype=np.bool_)
        self.free = np.zeros(hw.sm_count, dtype=np.bool_)  # fairshare: SMs that are free
        self.share_state = np.zeros(3)
        self.levels = np.zeros((2, hw.sm_count))
        self.rates = np.array([hw.l2_effective_bytes_per_s, hw.hbm_effective_bytes_per_s,
                               sm_port_bytes_per_s(hw)])
        self.events = 0

    @property
    def job_start(self) -> np.ndarray:
        return self.times[:, 0]

    @property
    def job_end(self) -> np.ndarray:
        return self.times[:, 1]

    @property
    def phase_start(self) -> np.ndarray:
        return self.times[:, 2:]

    def process(self, env: simpy.Environment):
        dt = 0.0
        while True:
            dt = _step(env.now, dt, self.job, self.times, self.job_slot, self.slot_f,
                       self.slot_i, self.counters, self.segments, self.limit_s, self.levels,
                       self.work, self.dirty, self.free, self.share_state, self.rates,
                       self.queued_body, self.sm_free)
            if dt < 0:
                return
            yield env.timeout(dt)

    def run(self) -> FluidKernel:
        env = CountingEnvironment()
        env.process(self.process(env))
        env.run()
        self.events = env.events
        self.drained_s = env.now  # the last job ended and the last write-back moved
        return self

    @property
    def span_s(self) -> float:
        return float(self.job_end.max() - self.job_start.min()) if self.job_end.size else 0.0


_S_REM, _S_RATE, _S_B, _S_M, _S_K, _S_CP, _S_MOVED = range(7)  # rows of FluidKernel.slot_f
_SF = 7
_S_JOB, _S_PHASE, _S_LIMIT = range(3)  # rows of FluidKernel.slot_i
_SI = 3
_WRITING = -2  # slot_i[_S_JOB] of a write-back flow with bytes pending


@njit(cache=True)
def _enter(s, j, phase, now, job, times, slot_f, slot_i, queued_body, sm_free, dirty,
           hbm_rate):  # pragma: no cover - numba
    """Put job ``j`` in slot ``s`` at its first phase >= ``phase`` with work; False if none.

    With ``queued_body`` the body's compute is not shared but queued on the slot's SM, first
    come, first served (the full engine's ``_compute``): it ends no earlier than its critical
    path and the SM's units being done with what was queued before it and with its own
    (later if its bytes are held up).

    The write-backs the phase causes join the kernel's write-back flow (the last column):
    HBM bytes that share HBM with everyone's and that no phase waits for, as the full
    engine's write-backs. Alone the flow would drain at HBM's rate.
    """
    phases = job.shape[2]
    while phase < phases and job[3, j, phase] <= 0:
        times[j, 2 + phase] = now
        phase += 1
    if phase == phases:
        return False
    times[j, 2 + phase] = now
    slot_i[_S_JOB, s], slot_i[_S_PHASE, s] = j, phase
    slot_f[_S_REM, s] = 1.0
    for f in range(4):
        slot_f[_S_B + f, s] = job[f, j, phase]
    slot_f[_S_MOVED, s] = job[5, j, phase]
    written = job[4, j, phase]
    if written > 0:
        w = slot_f.shape[1] - 1
        pending = written
        if slot_i[_S_JOB, w] == _WRITING:
            pending += slot_f[_S_REM, w] * slot_f[_S_M, w]
        slot_i[_S_JOB, w] = _WRITING
        slot_f[_S_REM, w] = 1.0
        slot_f[_S_B, w] = slot_f[_S_K, w] = 0.0
        slot_f[_S_M, w] = slot_f[_S_MOVED, w] = pending
        slot_f[_S_CP, w] = pending / hbm_rate
        dirty[w % dirty.shape[0]] = True
    if queued_body and phase == BODY and job[2, j, phase] > 0:
        sm = s % sm_free.shape[0]
        sm_free[sm] = max(now, sm_free[sm]) + job[2, j, phase]
        slot_f[_S_CP, s] = max(job[3, j, phase], sm_free[sm] - now)
        slot_f[_S_K, s] = 0.0
    return True


@njit(cache=True)
def _step(now, dt, job, times, job_slot, slot_f, slot_i, counters, segments, limit_s, levels,
          work, dirty, free, share_state, rates, queued_body,
          sm_free):  # pragma: no cover - numba
    """Advance the fluid by ``dt`` to ``now``, end phases, dispatch, set rates; next dt or -1.

    Columns ``0 .. slots - 1`` of the slot arrays are the slots, column ``slots`` the
    write-back flow (``_enter``); a drained flow is empty (job -1, ``CP`` inf) until the
    next write-backs."""
    n_cols = slot_f.shape[1]
    n_slots = n_cols - 1
    rem, rate = slot_f[_S_REM], slot_f[_S_RATE]
    sjob, limit = slot_i[_S_JOB], slot_i[_S_LIMIT]
    if dt > 0:
        l2 = 0.0
        hbm = 0.0
        for s in range(n_cols):
            if sjob[s] != -1:
                l2 += rate[s] * slot_f[_S_B, s]
                hbm += rate[s] * slot_f[_S_MOVED, s]
                if s < n_slots:
                    limit_s[limit[s]] += dt
                rem[s] -= rate[s] * dt
        k = counters[1]
        segments[k, 0], segments[k, 1], segments[k, 2], segments[k, 3] = now - dt, now, l2, hbm
        counters[1] += 1
    active = 0
    jobs = job.shape[1]
    n_sm = levels.shape[1]
    hbm_rate = rates[1]
    flow = n_slots  # the write-back flow's column: a drained flow empties first
    if sjob[flow] == _WRITING and rem[flow] <= _FINISHED:
        sjob[flow] = -1
        slot_f[_S_M, flow] = 0.0
        slot_f[_S_CP, flow] = np.inf
        dirty[flow % n_sm] = True
    for s in range(n_slots):
        j = sjob[s]
        if j >= 0 and rem[s] <= _FINISHED:
            dirty[s % n_sm] = True
            if not _enter(s, j, slot_i[_S_PHASE, s] + 1, now, job, times, slot_f, slot_i,
                          queued_body, sm_free, dirty, hbm_rate):
                times[j, 1] = now
                sjob[s] = -1
                slot_f[_S_B, s] = slot_f[_S_M, s] = slot_f[_S_K, s] = 0.0
                slot_f[_S_CP, s] = np.inf
        while sjob[s] < 0 and counters[0] < jobs:
            j = counters[0]
            counters[0] += 1
            times[j, 0], job_slot[j] = now, s
            dirty[s % n_sm] = True
            if not _enter(s, j, 0, now, job, times, slot_f, slot_i, queued_body, sm_free,
                          dirty, hbm_rate):
                times[j, 1] = now  # nothing to do at all
        if sjob[s] >= 0:
            active += 1
    if sjob[flow] == _WRITING:
        active += 1
    if active == 0:
        return -1.0
    fair_rates(slot_f[_S_B], slot_f[_S_M], slot_f[_S_K], slot_f[_S_CP], n_sm, rates[0],
               rates[1], rates[2], levels[0], levels[1], work, rate, limit, dirty, free,
               share_state)
    best = np.inf
    for s in range(n_cols):
        if sjob[s] != -1:
            best = min(best, rem[s] / rate[s])
    return best
