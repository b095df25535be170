"""Replay a kernel's tile accesses through L2 in the order a timing pass says they happen.

The aggregated engine times CTAs as fluid jobs, so it knows when each CTA starts, when its
loop starts and when it ends, but not when each loop iteration happens. This module puts
every tile access of the kernel on that timeline — the prologue's accesses when the CTA
starts, the epilogue's when it ends, the loop's iterations evenly spaced from the loop's
start to the CTA's end — and feeds them to the L2 cache in time order, merging the
concurrently resident CTAs with a heap (ties: lower CTA index first). Within a step, loads
come before stores. Every tile is looked up; nothing is sampled. Above ``MAX_STEPS`` loop
iterations per kernel, ``g`` consecutive iterations of a CTA are taken together (one heap
step), ``g`` the smallest that brings the count under it.

Results are per CTA: load bytes that hit, that missed, bytes written back by the evictions
the CTA's accesses caused, the missed bytes of its prologue and first ``ahead`` iterations
(whose loads the pipeline issues up front), and how many of its steps loaded anything and
how many of those missed at least one block (such a step waits for HBM's latency).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from simulator.sim.l2 import TILE_FIELDS, L2Cache, touch_tiles
from simulator.sim.program import KernelProgram
from traces.schedules.base import STORE

BUFFER_TILES = 1 << 16
MAX_STEPS = 2_000_000


def _combined(prog: KernelProgram) -> tuple:
    """The three phases in one table: static step arrays ``[4, 3, k]`` (kind, tensor, tile
    rows, tile cols per phase) and ``[3, k]`` (the HBM capacity a missed byte of the step
    takes, ``program.hbm_line_cost``), per-unit arrays ``[.., k, units]`` with the
    prologue's CTAs, the loop's units and the epilogue's CTAs side by side (rows beyond a
    phase's steps are masked off), and the first unit of each phase."""
    phases = (prog.pre, prog.loop, prog.post)
    k = max(max(p.kind.size for p in phases), 1)
    static = np.zeros((4, 3, k), dtype=np.int64)
    cost = np.ones((3, k))
    units = sum(p.units for p in phases)
    mask = np.zeros((k, units), dtype=bool)
    coords = np.zeros((3, k, units), dtype=np.int64)  # plane, row block, col block
    at = 0
    for i, p in enumerate(phases):
        rows = p.kind.size
        order = np.argsort(p.kind == STORE, kind="stable")  # loads first, then stores
        for j, values in enumerate((p.kind, p.tensor, p.tile_rows, p.tile_cols)):
            static[j, i, :rows] = values[order]
        cost[i, :rows] = p.hbm_cost[order]
        mask[:rows, at:at + p.units] = p.mask[order]
        for j, values in enumerate((p.plane, p.row_block, p.col_block)):
            coords[j, :rows, at:at + p.units] = values[order]
        at += p.units
    return (static, cost, mask, coords,
            np.array([0, prog.pre.units, prog.pre.units + prog.loop.units]))


def _loop_order(prog: KernelProgram) -> np.ndarray:
    """The loop's step rows in the order ``_combined`` puts them (for the plane offsets)."""
    return np.argsort(prog.loop.kind == STORE, kind="stable")


def replay(cache: L2Cache, prog: KernelProgram, start: np.ndarray, loop_start: np.ndarray,
           end: np.ndarray, ahead: int) -> tuple[np.ndarray, ...]:
    """Run the kernel's accesses through ``cache``.

    Returns per-CTA arrays: hit, miss, written-back and early-miss bytes, steps that load,
    steps that missed; a one-element array with the number of tiles looked up; then per
    CTA the HBM capacity its misses and its early misses take (``program.hbm_line_cost``,
    before ``costs.miss_occupancy``).
    """
    grid = prog.grid
    results = (tuple(np.zeros(grid, dtype=np.int64) for _ in range(6))
               + (np.zeros(1, np.int64), np.zeros(grid), np.zeros(grid)))
    group = max(1, -(-prog.iterations // MAX_STEPS))
    room = BUFFER_TILES + max(prog.pre.kind.size, group * prog.loop.kind.size,
                              prog.post.kind.size, 1)
    buffer = np.zeros((room, TILE_FIELDS), dtype=np.int64)
    owner = np.zeros((room, 2), dtype=np.int64)  # tag, step serial
    out = np.zeros((room, 3), dtype=np.int64)
    weight = np.ones(room)  # per tile: HBM capacity per missed byte
    order = np.argsort(start, kind="stable").astype(np.int64)
    _replay(cache.state(), cache.layout.arrays(), order, start.astype(np.float64),
            loop_start.astype(np.float64), end.astype(np.float64), prog.loop_count,
            prog.period, prog.loop_first, prog.plane_offset[_loop_order(prog)],
            *_combined(prog), ahead, group,
            buffer, owner, out, weight, *results)
    return results


@njit(cache=True)
def _drain(state, layout, buffer, owner, out, weight, count, hit, miss, written, early, steps,
           missed, tiles, cost, early_cost):  # pragma: no cover - numba
    touch_tiles(state, layout, buffer, count, out)
    tiles[0] += count
    loaded = False
    any_miss = False
    for j in range(count):
        c = owner[j, 0]
        if c < 0:
            c = -1 - c
            early[c] += out[j, 1]
            early_cost[c] += out[j, 1] * weight[j]
        hit[c] += out[j, 0]
        miss[c] += out[j, 1]
        cost[c] += out[j, 1] * weight[j]
        written[c] += out[j, 2]
        if buffer[j, 6] == 0:
            loaded = True
            any_miss = any_miss or out[j, 1] > 0
        # A step's tiles are consecutive: count the step at its last tile.
        if j + 1 == count or owner[j + 1, 1] != owner[j, 1]:
            if loaded:
                steps[c] += 1
                if any_miss:
                    missed[c] += 1
            loaded = False
            any_miss = False


@njit(cache=True)
def _replay(state, layout, order, start, loop_start, end, loop_count, period, loop_first,
            offsets, static, cost_of, mask, coords, base, ahead, group, buffer, owner, out,
            weight, hit, miss, written, early, steps, missed, tiles, cost,
            early_cost):  # pragma: no cover - numba
    """Merge the CTAs' steps by time (a heap of the resident CTAs) and look them up.

    A CTA's stations: 0 the prologue, 1 .. last - 1 ``group`` loop iterations each, ``last``
    the epilogue. NOTE: emission and heap operations are written out here for performance:
    helpers that take arrays cost more in reference counting than the work they do.
    """
    grid = start.shape[0]
    ht = np.empty(grid, dtype=np.float64)  # heap of resident CTAs by time of next station
    hc = np.empty(grid, dtype=np.int64)
    station = np.zeros(grid, dtype=np.int64)
    size = 0
    nxt = 0
    count = 0
    serial = 0
    while size > 0 or nxt < grid:
        if nxt < grid and (size == 0 or start[order[nxt]] <= ht[0]):
            c = order[nxt]
            nxt += 1
            i = size
            size += 1
            t = start[c]
            while i > 0:  # sift up
                parent = (i - 1) // 2
                if ht[parent] < t or (ht[parent] == t and hc[parent] < c):
                    break
                ht[i], hc[i] = ht[parent], hc[parent]
                i = parent
            ht[i], hc[i] = t, c
            continue
        c = hc[0]
        st = station[c]
        n = loop_count[c]
        last = (n + group - 1) // group + 1
        if st == 0:
            first_it, end_it = -1, 0  # -1: the prologue
        elif st < last:
            first_it, end_it = (st - 1) * group, min(st * group, n)
        else:
            first_it, end_it = -2, -1  # -2: the epilogue
        for it in range(first_it, end_it):
            serial += 1
            if it == -1:
                ph, unit = 0, c
            elif it == -2:
                ph, unit = 2, base[2] + c
            else:
                ph, unit = 1, base[1] + loop_first[c % period] + it
            tag = -1 - c if it == -1 or 0 <= it < ahead else c
            for k in range(static.shape[2]):  # loads first, then stores
                if mask[k, unit]:
                    buffer[count, 0] = static[1, ph, k]
                    buffer[count, 1] = coords[0, k, unit] + (offsets[k, c] if ph == 1 else 0)
                    buffer[count, 2] = coords[1, k, unit]
                    buffer[count, 3] = coords[2, k, unit]
                    buffer[count, 4] = static[2, ph, k]
                    buffer[count, 5] = static[3, ph, k]
                    buffer[count, 6] = static[0, ph, k] == STORE
                    weight[count] = cost_of[ph, k]
                    owner[count, 0] = tag
                    owner[count, 1] = serial
                    count += 1
        # Next station of CTA c, or retire it; then restore the heap from the root.
        if st < last:
            station[c] = st + 1
            t = loop_start[c] + (end[c] - loop_start[c]) * (st + 1) / last
        else:
            size -= 1
            t, c = ht[size], hc[size]
        i = 0
        while True:  # sift down
            child = 2 * i + 1
            if child >= size:
                break
            if child + 1 < size and (ht[child + 1] < ht[child]
                                     or (ht[child + 1] == ht[child] and hc[child + 1] < hc[child])):
                child += 1
            if ht[child] < t or (ht[child] == t and hc[child] < c):
                ht[i], hc[i] = ht[child], hc[child]
                i = child
            else:
                break
        if size > 0:
            ht[i], hc[i] = t, c
        if count >= BUFFER_TILES:
            _drain(state, layout, buffer, owner, out, weight, count, hit, miss, written, early,
                   steps, missed, tiles, cost, early_cost)
            count = 0
    _drain(state, layout, buffer, owner, out, weight, count, hit, miss, written, early, steps,
           missed, tiles, cost, early_cost)
