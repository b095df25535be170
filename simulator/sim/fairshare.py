"""Fair rates of fluid jobs that share L2, HBM and their SMs' compute units and ports.

The aggregated engine treats each resident CTA phase as a job that must move ``B`` bytes
through L2 and through its SM's port, ``M`` bytes through HBM, keep its SM's units busy
``K`` seconds, and that cannot finish faster than its own critical path ``CP`` (latencies
and dependent steps when it runs alone). Running at rate ``r`` (fraction of the job per
second) it draws ``r B`` bytes/s from L2 and from its SM's port, ``r M`` from HBM and
``r K`` of its SM's compute time.

Each resource divides its capacity max-min fairly among the jobs that use it, as the full
engine's processor sharing (memory) and first-come-first-served issue (SMs) do: a job that
wants less than an equal share gets what it wants, the rest split the remainder evenly.
A resource's share ("water level") depends on what the jobs want, which depends on the
shares of the other resources; the levels are found by visiting L2, HBM and every SM's
compute and port in turn until no level moves (each visit is one water-filling).

Most of the time L2 and HBM have room (compute-bound kernels): then every SM is a problem
of its own, and an event that changes the jobs of one SM only needs that SM solved again
and the total draw on L2 and HBM checked. When L2 or HBM limited the last answer
(memory-bound kernels), they most likely limit the next one too: then the joint solve
runs first, and the every-SM-alone solve only if neither limits any more (the answers are
the same as solving in the other order; only the work thrown away differs).
``fair_rates``' ``state`` and work arrays keep what that takes between events.

An SM whose jobs, all at their own critical paths' pace, want no more than its compute and
its port can give is *free*: none of its levels can be finite whatever L2 and HBM allow
(they only lower what the jobs want). Memory-bound kernels of one-shot CTAs (naive
attention) have nearly every SM free, often all of them. The joint solve skips the free
SMs' visits, and with every SM free it is L2 and HBM alone, and it skips a round that
would only repeat the one before (``_all_levels``). Each skip leaves every number as the
full visit computes it, bit for bit (``tests/test_sim_fairshare.py`` checks against a
transcription of the full visit), and so do the passes' other economies: totals summed
as the values are gathered, and water levels found without branches.

Jobs sit in slots; slot ``s`` is on SM ``s % n_sm``. Arrays are indexed by slot; a slot
with ``CP == inf`` is empty.
"""

from __future__ import annotations

import numpy as np
from numba import njit

MAX_ROUNDS = 50
_TOL = 1e-12
LIMIT_PATH, LIMIT_SM, LIMIT_L2, LIMIT_HBM, LIMIT_PORT = range(5)
# Rows of the per-slot work array: cap = 1/CP, the rate each bound allows, draws, scratch.
_CAP, _BY_SM, _BY_L2, _BY_PORT, _BY_HBM, _DRAW_L2, _DRAW_HBM, _WORK, _VALUES = range(9)
ROWS = 9


@njit(cache=True)
def _water(values, n, capacity, total):  # pragma: no cover - numba
    """Level ``x`` with ``sum(min(values[:n], x)) == capacity``; ``inf`` if they fit
    (``total``: the values summed in their order, which the caller gathering them does).

    Starts from the equal share and lifts it past the demands below it until the set of
    those stops growing (no sort: the level only rises, usually in two or three passes).
    """
    if total <= capacity:
        return np.inf
    level = capacity / n
    below = -1
    while True:
        small, count = 0.0, 0
        for i in range(n):  # without a branch (adding 0.0 leaves the sum as it was)
            under = values[i] < level
            small += values[i] if under else 0.0
            count += under
        if count == below:
            return level
        below = count
        level = (capacity - small) / (n - count)


@njit(cache=True)
def _change(old, new):  # pragma: no cover - numba
    if old == new:
        return 0.0
    if np.isinf(old) or np.isinf(new):
        return 1.0
    return abs(new - old) / max(abs(old), abs(new))


@njit(cache=True)
def _refresh_caps(s, n_sm, B, K, CP, w, port_rate):  # pragma: no cover - numba
    """Set the caps (``1 / CP``) of SM ``s``'s slots and return whether it is free: its
    jobs at their caps want no more than its compute and port give. The sums run as
    ``_sm_level``'s do, over the same slots in the same order, so a free SM's levels there
    are inf bit for bit: what they sum never exceeds these sums (rates below the caps,
    rounding monotone)."""
    compute, port = 0.0, 0.0
    for i in range(s, B.shape[0], n_sm):
        w[_CAP, i] = 1.0 / CP[i] if np.isfinite(CP[i]) else 0.0
        if w[_CAP, i] > 0:
            if K[i] > 0:
                compute += K[i] * w[_CAP, i]
            if B[i] > 0:
                port += B[i] * w[_CAP, i]
    return compute <= 1.0 and port <= port_rate


@njit(cache=True)
def _sm_level(s, n_sm, weight, other, w, capacity, values):  # pragma: no cover - numba
    """Level of SM ``s`` for one of its resources: slot ``i`` wants ``weight[i] * other[i]``."""
    count = 0
    total = 0.0
    for i in range(s, weight.shape[0], n_sm):
        if weight[i] > 0 and w[_CAP, i] > 0:
            d = weight[i] * other[i]
            values[count] = d
            total += d
            count += 1
    if total <= capacity:
        return np.inf
    if count == 1:
        return capacity
    if count == 2:
        low = min(values[0], values[1])
        return capacity / 2 if 2 * low >= capacity else capacity - low
    return _water(values, count, capacity, total)


@njit(cache=True)
def _all_sm_levels(weight, other, w, n_sm, capacity, level, free,
                   moved):  # pragma: no cover - numba
    """``_sm_level`` for every SM but the free ones in one pass over the slots; returns the
    largest change.

    NOTE: one call for all SMs, for performance (a call per SM costs more than its work).
    """
    n = weight.shape[0]
    sms = min(n_sm, n)
    values = w[_VALUES]
    for s in range(sms):
        if free[s]:
            continue
        count = 0
        total = 0.0
        low = np.inf
        for i in range(s, n, n_sm):
            if weight[i] > 0 and w[_CAP, i] > 0:
                d = weight[i] * other[i]
                values[count] = d
                total += d
                low = min(low, d)
                count += 1
        if total <= capacity:
            new = np.inf
        elif count == 1:
            new = capacity
        elif count == 2:
            new = capacity / 2 if 2 * low >= capacity else capacity - low
        else:
            new = _water(values, count, capacity, total)
        moved = max(moved, _change(level[s], new))
        level[s] = new
    return moved


@njit(cache=True)
def _busy_sm_levels(B, K, w, n_sm, port_rate, level_sm, level_port, free,
                    moved):  # pragma: no cover - numba
    """Each SM's compute level, then its port level, against its slots' other bounds; sets
    its slots' bounds and returns the largest change (``moved`` or more). Free SMs are
    skipped: their levels stay inf, and so do their slots' bounds."""
    n = B.shape[0]
    work = w[_WORK]
    s = 0  # slot i's SM, counted: a division (i % n_sm) per slot costs as much as the pass
    for i in range(n):
        if not free[s]:
            work[i] = min(w[_CAP, i], w[_BY_PORT, i], w[_BY_L2, i], w[_BY_HBM, i])
        s = s + 1 if s + 1 < n_sm else 0
    moved = _all_sm_levels(K, work, w, n_sm, 1.0, level_sm, free, moved)
    s = 0
    for i in range(n):
        if not free[s]:
            w[_BY_SM, i] = level_sm[s] / K[i] if K[i] > 0 else np.inf
            work[i] = min(w[_CAP, i], w[_BY_SM, i], w[_BY_L2, i], w[_BY_HBM, i])
        s = s + 1 if s + 1 < n_sm else 0
    moved = _all_sm_levels(B, work, w, n_sm, port_rate, level_port, free, moved)
    s = 0
    for i in range(n):
        if not free[s]:
            w[_BY_PORT, i] = level_port[s] / B[i] if B[i] > 0 else np.inf
        s = s + 1 if s + 1 < n_sm else 0
    return moved


@njit(cache=True)
def _solve_sm(s, n_sm, B, K, port_rate, w, level_sm, level_port):  # pragma: no cover - numba
    """Compute and port levels of SM ``s`` with L2 and HBM unlimited; sets its slots' bounds."""
    n = B.shape[0]
    values = w[_VALUES]
    other = w[_WORK]
    sm, port = np.inf, np.inf
    for _ in range(MAX_ROUNDS):
        for i in range(s, n, n_sm):
            other[i] = min(w[_CAP, i], port / B[i] if B[i] > 0 else np.inf)
        new_sm = _sm_level(s, n_sm, K, other, w, 1.0, values)
        for i in range(s, n, n_sm):
            other[i] = min(w[_CAP, i], new_sm / K[i] if K[i] > 0 else np.inf)
        new_port = _sm_level(s, n_sm, B, other, w, port_rate, values)
        moved = max(_change(sm, new_sm), _change(port, new_port))
        sm, port = new_sm, new_port
        if moved <= _TOL:
            break
    level_sm[s], level_port[s] = sm, port
    for i in range(s, n, n_sm):
        w[_BY_SM, i] = sm / K[i] if K[i] > 0 else np.inf
        w[_BY_PORT, i] = port / B[i] if B[i] > 0 else np.inf


@njit(cache=True)
def _finish(i, B, M, w, rate, limit):  # pragma: no cover - numba
    """Slot ``i``'s rate: the tightest of its bounds, and which bound that is."""
    r = w[_CAP, i]
    which = LIMIT_PATH
    if w[_BY_SM, i] < r:
        r = w[_BY_SM, i]
        which = LIMIT_SM
    if w[_BY_PORT, i] < r:
        r = w[_BY_PORT, i]
        which = LIMIT_PORT
    if w[_BY_L2, i] < r:
        r = w[_BY_L2, i]
        which = LIMIT_L2
    if w[_BY_HBM, i] < r:
        r = w[_BY_HBM, i]
        which = LIMIT_HBM
    rate[i] = r
    limit[i] = which
    w[_DRAW_L2, i] = B[i] * r
    w[_DRAW_HBM, i] = M[i] * r


@njit(cache=True)
def fair_rates(B, M, K, CP, n_sm, l2_rate, hbm_rate, port_rate, level_sm, level_port, w,
               rate, limit, dirty, free, state):  # pragma: no cover - numba
    """Fill ``rate`` (and ``limit``: ``LIMIT_*``) for every slot.

    ``w`` is ``[ROWS, slots]`` of work space kept between calls; ``dirty[s]`` marks the SMs
    whose jobs changed since the last call (cleared here); ``free[s]`` whether SM ``s`` is
    free (module docstring; kept here for the SMs not dirty); ``state`` is ``[last, L2
    draw, HBM draw]``: ``last`` is 1 when the last answer had L2 and HBM unconstrained
    (only the dirty SMs need solving again, and the draws are that answer's), -1 when L2
    or HBM limited it (the joint solve goes first), 0 before the first call.
    """
    n = B.shape[0]
    sms = min(n_sm, n)
    if state[0] > 0:
        # Incremental: re-solve the dirty SMs alone; done if L2 and HBM still have room.
        for s in range(sms):
            if dirty[s]:
                for i in range(s, n, n_sm):
                    state[1] -= w[_DRAW_L2, i]
                    state[2] -= w[_DRAW_HBM, i]
                free[s] = _refresh_caps(s, n_sm, B, K, CP, w, port_rate)
                _solve_sm(s, n_sm, B, K, port_rate, w, level_sm, level_port)
                for i in range(s, n, n_sm):
                    _finish(i, B, M, w, rate, limit)
                    state[1] += w[_DRAW_L2, i]
                    state[2] += w[_DRAW_HBM, i]
        dirty[:] = False
        if state[1] <= l2_rate and state[2] <= hbm_rate:
            return
    else:  # the caps of the SMs that changed (of all, at the first call)
        for s in range(sms):
            if dirty[s] or state[0] == 0:
                free[s] = _refresh_caps(s, n_sm, B, K, CP, w, port_rate)
        dirty[:] = False
    busy = not free[:sms].all()
    # The last answer had L2 or HBM limiting: most likely this one too, and then the
    # every-SM-alone solution below would be thrown away. If L2 or HBM still limits, this
    # is the answer the path below reaches (``_all_levels`` depends only on the inputs);
    # if neither does, the answer is every SM alone, found below.
    if state[0] < 0 and _all_levels(B, M, K, n_sm, l2_rate, hbm_rate, port_rate, level_sm,
                                    level_port, w, free, busy):
        for i in range(n):
            _finish(i, B, M, w, rate, limit)
        return
    # From scratch: every SM alone first; if L2 and HBM have room, that is the answer.
    for i in range(n):
        w[_BY_SM, i] = w[_BY_L2, i] = w[_BY_PORT, i] = w[_BY_HBM, i] = np.inf
    level_sm[:] = np.inf
    level_port[:] = np.inf
    for _ in range(MAX_ROUNDS if busy else 0):
        if _busy_sm_levels(B, K, w, n_sm, port_rate, level_sm, level_port, free,
                           0.0) <= _TOL:
            break
    state[1] = state[2] = 0.0
    for i in range(n):
        _finish(i, B, M, w, rate, limit)
        state[1] += w[_DRAW_L2, i]
        state[2] += w[_DRAW_HBM, i]
    if state[1] <= l2_rate and state[2] <= hbm_rate:
        state[0] = 1.0
        return
    state[0] = -1.0
    _all_levels(B, M, K, n_sm, l2_rate, hbm_rate, port_rate, level_sm, level_port, w, free,
                busy)
    for i in range(n):
        _finish(i, B, M, w, rate, limit)


@njit(cache=True)
def _all_levels(B, M, K, n_sm, l2_rate, hbm_rate, port_rate, level_sm, level_port,
                w, free, busy):  # pragma: no cover - numba
    """All levels together, visiting L2, HBM and each SM in turn until none moves; returns
    whether L2 or HBM limits (has a finite level).

    Only the SMs that are not ``free`` are visited; the others' levels stay inf. With
    every SM free (not ``busy``), L2's demands in a round depend only on HBM's level in
    the round before (inf before the first). So the next round would repeat this one, and
    is not run, when HBM's level is the same as in the round before, or when L2 came out
    unlimited and HBM's level did not rise: L2's demands then do not rise either and L2
    stays unlimited, and HBM's demands are this round's.
    """
    n = B.shape[0]
    work = w[_WORK]
    level_l2 = level_hbm = np.inf
    level_sm[:] = np.inf
    level_port[:] = np.inf
    for i in range(n):
        w[_BY_SM, i] = w[_BY_L2, i] = w[_BY_PORT, i] = w[_BY_HBM, i] = np.inf
    last_hbm = np.inf
    for _ in range(MAX_ROUNDS):
        # Each job with bytes there would draw B x (what everything but L2 allows) of L2;
        # without a branch: every job's draw is written, the next one kept overwrites it.
        count, total = 0, 0.0
        for i in range(n):
            d = B[i] * min(w[_CAP, i], w[_BY_SM, i], w[_BY_PORT, i], w[_BY_HBM, i])
            keep = (w[_CAP, i] > 0) & (B[i] > 0)
            work[count] = d
            total += d if keep else 0.0
            count += keep
        new = _water(work, count, l2_rate, total)
        moved = _change(level_l2, new)
        level_l2 = new
        count, total = 0, 0.0
        for i in range(n):  # HBM, against L2's new bounds
            w[_BY_L2, i] = level_l2 / B[i] if B[i] > 0 else np.inf
            d = M[i] * min(w[_CAP, i], w[_BY_SM, i], w[_BY_PORT, i], w[_BY_L2, i])
            keep = (w[_CAP, i] > 0) & (M[i] > 0)
            work[count] = d
            total += d if keep else 0.0
            count += keep
        new = _water(work, count, hbm_rate, total)
        moved = max(moved, _change(level_hbm, new))
        level_hbm = new
        for i in range(n):
            w[_BY_HBM, i] = level_hbm / M[i] if M[i] > 0 else np.inf
        if busy:
            moved = _busy_sm_levels(B, K, w, n_sm, port_rate, level_sm, level_port, free,
                                    moved)
        elif level_hbm == last_hbm or (np.isinf(level_l2) and level_hbm <= last_hbm):
            break  # the next round would repeat this one (docstring)
        last_hbm = level_hbm
        if moved <= _TOL:
            break
    return np.isfinite(level_l2) or np.isfinite(level_hbm)
