"""The L2 cache: a least-recently-used cache of the preset's capacity, with write-back.

Granularity. The cache holds *blocks*: a block is a rectangle of one tensor plane of
``R x C`` elements, where ``R`` and ``C`` are the greatest common divisors of the tile
heights and widths with which the schedule's kernels access that tensor. For most tensors
that is exactly one tile (all FA2 accesses to K are ``BN x d`` tiles), so an access is one
lookup; where kernels use different shapes (naive attention writes S as ``BM x BN`` tiles
and reads it back by rows) a tile covers several blocks and every byte keeps its identity
across kernels, so a small S written by one kernel hits when the next reads it.

Why blocks and not 32-byte sectors: the schedules move whole tiles, a tile is resident or
not as a unit in LRU order (all its sectors are touched together, so they age together), and
one lookup per tile instead of per sector is what makes tens of millions of accesses a
matter of a second. What tiles cannot show — partial sector reuse between overlapping
tiles of different shapes — the common-divisor blocks keep.

Capacity counts each block as the 32-byte sectors it occupies (a block of short rows
occupies a sector per row), so thin tensors (LSE) do not look smaller than they are.

Policy: fully associative LRU over blocks (the real L2 is highly associative with hashed
set indexing, which LRU over the whole capacity approximates); loads allocate on a miss;
stores allocate and mark the block dirty without reading it (whole tiles are written).
Dirty blocks are written to DRAM when they are evicted; ``flush`` writes back what is
still dirty at the end of a kernel and leaves the data resident (clean), so the next
kernel can still hit it. Reads are counted in DRAM bytes when they miss; writes when they
are written back (eviction or end of kernel).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

import numpy as np
from numba import njit

from traces.schedules import Schedule
from traces.schedules.base import Access

SECTOR_BYTES = 32
HIT, MISS, WRITE, WRITEBACK = range(4)  # columns of the per-tensor statistics (bytes)
_HEAD, _TAIL, _USED, _CAPACITY, _NFREE, _SHIFT, _MASK = range(7)
# Fields of an entry, one row of 8 int64 (one CPU cache line: lookups touch one line).
KEY, BYTES, SIZE, TENSOR, DIRTY, PREV, NEXT, SLOT = range(8)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class BlockLayout:
    """Block shape and numbering of every tensor of a schedule (arrays indexed by tensor)."""

    rows: np.ndarray
    cols: np.ndarray
    elem: np.ndarray
    block_rows: np.ndarray  # R
    block_cols: np.ndarray  # C
    row_blocks: np.ndarray  # ceil(rows / R)
    col_blocks: np.ndarray  # ceil(cols / C)
    base: np.ndarray  # first block number of the tensor
    planes: np.ndarray
    total_blocks: int

    @classmethod
    def from_schedule(cls, schedule: Schedule) -> BlockLayout:
        names = schedule.tensor_names
        block_rows, block_cols = [0] * len(names), [0] * len(names)
        for kernel in schedule.kernels:
            for step in kernel.pre + kernel.loop + kernel.post:
                if isinstance(step, Access):
                    i = names.index(step.tensor)
                    block_rows[i] = gcd(block_rows[i], step.tile_rows)
                    block_cols[i] = gcd(block_cols[i], step.tile_cols)
        tensors = [schedule.tensors[n] for n in names]
        rows = np.array([t.rows for t in tensors], dtype=np.int64)
        cols = np.array([t.cols for t in tensors], dtype=np.int64)
        r = np.maximum(np.array(block_rows, dtype=np.int64), 1)
        c = np.maximum(np.array(block_cols, dtype=np.int64), 1)
        planes = np.array([t.planes for t in tensors], dtype=np.int64)
        per_tensor = planes * -(-rows // r) * -(-cols // c)
        base = np.concatenate([[0], np.cumsum(per_tensor)[:-1]]).astype(np.int64)
        return cls(rows, cols, np.array([t.elem_bytes for t in tensors], dtype=np.int64),
                   r, c, -(-rows // r), -(-cols // c), base, planes, int(per_tensor.sum()))

    @property
    def full_block_bytes(self) -> np.ndarray:
        """Bytes a full block of each tensor occupies in the cache (whole sectors)."""
        return _sectors(self.block_rows, np.minimum(self.block_cols, self.cols) * self.elem,
                        self.block_cols == self.cols)

    def max_resident_blocks(self, capacity_bytes: int) -> int:
        """An upper bound on the blocks ``capacity_bytes`` can hold at once.

        Full blocks are at least the smallest tensor's full block; smaller blocks exist only
        along the bottom edge (rows not a multiple of the block height) and the right edge
        of each plane, and all of those may be resident too.
        """
        full = self.full_block_bytes
        bottom = np.where(self.rows % self.block_rows > 0, self.col_blocks, 0)
        right = np.where(self.cols % self.block_cols > 0, self.row_blocks, 0)
        edges = int((self.planes * (bottom + right)).sum())
        return int(capacity_bytes // max(int(full.min()), SECTOR_BYTES)) + edges

    @property
    def tensor_bytes(self) -> np.ndarray:
        return (self.planes * self.rows * self.cols * self.elem).astype(np.float64)

    def arrays(self) -> tuple:
        return (self.rows, self.cols, self.elem, self.block_rows, self.block_cols,
                self.row_blocks, self.col_blocks, self.base)


def _sectors(rows, row_bytes, contiguous):
    """Bytes a block occupies in the cache: its 32-byte sectors (rows of a block are apart
    in memory unless the block spans the tensor's full width)."""
    whole = -(-(rows * row_bytes) // SECTOR_BYTES) * SECTOR_BYTES
    by_row = rows * (-(-row_bytes // SECTOR_BYTES) * SECTOR_BYTES)
    return np.where(contiguous, whole, by_row)


class L2Cache:
    """LRU state in flat arrays, driven by compiled functions (one call per access list).

    ``table`` is an open-addressing hash table (linear probing) from block number to entry;
    ``entries`` rows hold each resident block's fields and its place in the LRU list.
    """

    def __init__(self, capacity_bytes: int, layout: BlockLayout):
        self.layout = layout
        entries = min(layout.max_resident_blocks(capacity_bytes), layout.total_blocks) + 2
        # The table has room for twice the entries, but only a prefix of it is in use: it
        # starts small and doubles when half full (``_grow``), so that the part in use stays
        # in the CPU's caches (a few thousand tiles are resident in a typical run).
        bits = max(4, int(2 * entries - 1).bit_length())
        start = min(bits, 10)
        self.meta = np.array([-1, -1, 0, capacity_bytes, entries, 64 - start, (1 << start) - 1],
                             dtype=np.int64)
        self.table = np.zeros(1 << bits, dtype=np.int64)  # entry + 1, 0 = empty
        self.entries = np.zeros((entries, 8), dtype=np.int64)
        self.free = np.arange(entries - 1, -1, -1, dtype=np.int64)  # a stack of free entries
        self.stats = np.zeros((layout.rows.shape[0], 4), dtype=np.int64)

    def state(self) -> tuple:
        return self.meta, self.table, self.entries, self.free, self.stats

    def access(self, tiles: np.ndarray) -> np.ndarray:
        """Access the tiles (rows of ``TILE_FIELDS`` columns) in order; ``[n, 3]`` bytes out."""
        out = np.zeros((tiles.shape[0], 3), dtype=np.int64)
        touch_tiles(self.state(), self.layout.arrays(), tiles, tiles.shape[0], out)
        return out

    def flush(self) -> int:
        """Write back every dirty block (counted per tensor); returns the bytes written."""
        return int(flush(self.state()))

    @property
    def used_bytes(self) -> int:
        return int(self.meta[_USED])

    def snapshot(self) -> tuple:
        return tuple(a.copy() for a in self.state())

    def restore(self, saved: tuple) -> None:
        for current, old in zip(self.state(), saved, strict=True):
            current[...] = old


@njit(cache=True, inline="always")
def _hash(key, shift):  # pragma: no cover - numba
    return np.int64((np.uint64(key) * _GOLDEN) >> np.uint64(shift))


@njit(cache=True)
def _find(table, ent, key, mask, shift):  # pragma: no cover - numba
    """(table slot, entry) of ``key``; entry -1 and the free slot to use when absent."""
    i = _hash(key, shift)
    while True:
        e = table[i]
        if e == 0:
            return i, -1
        if ent[e - 1, KEY] == key:
            return i, e - 1
        i = (i + 1) & mask


@njit(cache=True)
def cursor(meta):  # pragma: no cover - numba
    """The LRU list ends, bytes in use and free-entry count as local scalars.

    Hot loops keep these in locals and write them back with ``save_cursor``: kept in the
    ``meta`` array, every update would be a store the compiler must reload (the arrays may
    alias), which costs several times the lookup itself.
    """
    return meta[_HEAD], meta[_TAIL], meta[_USED], meta[_NFREE]


@njit(cache=True)
def save_cursor(meta, cur):  # pragma: no cover - numba
    meta[_HEAD], meta[_TAIL], meta[_USED], meta[_NFREE] = cur


@njit(cache=True, inline="always")
def _unlink(ent, head, tail, e):  # pragma: no cover - numba
    p, n = ent[e, PREV], ent[e, NEXT]
    if p >= 0:
        ent[p, NEXT] = n
    else:
        head = n
    if n >= 0:
        ent[n, PREV] = p
    else:
        tail = p
    return head, tail


@njit(cache=True, inline="always")
def _push_front(ent, head, tail, e):  # pragma: no cover - numba
    ent[e, PREV] = -1
    ent[e, NEXT] = head
    if head >= 0:
        ent[head, PREV] = e
    else:
        tail = e
    return e, tail


@njit(cache=True)
def _grow(meta, table, ent, head):  # pragma: no cover - numba
    """Double the part of the table in use and re-insert every entry (from the LRU list)."""
    size = 2 * (meta[_MASK] + 1)
    meta[_MASK] = size - 1
    meta[_SHIFT] -= 1
    table[:size] = 0
    e = head
    while e >= 0:
        i, _ = _find(table, ent, ent[e, KEY], meta[_MASK], meta[_SHIFT])
        table[i] = e + 1
        ent[e, SLOT] = i
        e = ent[e, NEXT]


# Columns of a tile list (``touch_tiles``).
T_TENSOR, T_PLANE, T_ROW_BLOCK, T_COL_BLOCK, T_ROWS, T_COLS, T_STORE = range(7)
TILE_FIELDS = 7


@njit(cache=True)
def touch_tiles(state, layout, tiles, n, out):  # pragma: no cover - numba
    """Access the first ``n`` tiles of ``tiles`` (one row each, columns ``T_*``) in order.

    Each tile is cut into its blocks and every block is looked up, allocated on a miss
    (evicting from the LRU end until it fits) and, for a store, marked dirty. ``out[j]``
    receives tile j's (hit, miss, written-back) bytes; stores count neither hit nor miss.

    NOTE: the whole lookup is written out in this one function for performance: a call that
    passes the cache arrays costs more in reference counting than the lookup itself.
    """
    meta, table, ent, free, stats = state
    rows, cols, elem, block_rows, block_cols, row_blocks, col_blocks, base = layout
    head, tail, used, nfree = cursor(meta)
    capacity = meta[_CAPACITY]
    mask, shift = meta[_MASK], meta[_SHIFT]
    entries = ent.shape[0]
    for j in range(n):
        tensor, plane = tiles[j, T_TENSOR], tiles[j, T_PLANE]
        tile_rows, tile_cols, store = tiles[j, T_ROWS], tiles[j, T_COLS], tiles[j, T_STORE]
        n_rows, n_cols, r, c = rows[tensor], cols[tensor], block_rows[tensor], block_cols[tensor]
        # Blocks covered; a tile of the block's own shape (the common case) needs no division.
        if tile_rows == r:
            br0 = tiles[j, T_ROW_BLOCK]
            br1 = br0 + 1
        else:
            r0 = tiles[j, T_ROW_BLOCK] * tile_rows
            br0, br1 = r0 // r, (min(r0 + tile_rows, n_rows) + r - 1) // r
        if tile_cols == c:
            bc0 = tiles[j, T_COL_BLOCK]
            bc1 = bc0 + 1
        else:
            c0 = tiles[j, T_COL_BLOCK] * tile_cols
            bc0, bc1 = c0 // c, (min(c0 + tile_cols, n_cols) + c - 1) // c
        hit = miss = written = 0
        for br in range(br0, br1):
            valid_rows = min(r, n_rows - br * r)
            for bc in range(bc0, bc1):
                row_bytes = min(c, n_cols - bc * c) * elem[tensor]
                nbytes = valid_rows * row_bytes
                if c == n_cols:  # the block is contiguous in memory
                    size = (nbytes + SECTOR_BYTES - 1) // SECTOR_BYTES * SECTOR_BYTES
                else:
                    size = valid_rows * ((row_bytes + SECTOR_BYTES - 1) // SECTOR_BYTES
                                         * SECTOR_BYTES)
                key = base[tensor] + (plane * row_blocks[tensor] + br) * col_blocks[tensor] + bc
                i, e = _find(table, ent, key, mask, shift)
                if e >= 0:  # hit: move to the MRU end
                    if e != head:
                        head, tail = _unlink(ent, head, tail, e)
                        head, tail = _push_front(ent, head, tail, e)
                    if store:
                        ent[e, DIRTY] = 1
                        stats[tensor, WRITE] += nbytes
                    else:
                        stats[tensor, HIT] += nbytes
                        hit += nbytes
                    continue
                if store:
                    stats[tensor, WRITE] += nbytes
                else:
                    stats[tensor, MISS] += nbytes
                    miss += nbytes
                if size > capacity:  # larger than the whole cache: streams through
                    if store:
                        stats[tensor, WRITEBACK] += nbytes
                        written += nbytes
                    continue
                # Insert at the MRU end, then evict from the LRU end until it fits (the new
                # block is never the victim: it is at the other end).
                if 2 * (entries - nfree + 1) > mask + 1 and mask + 1 < table.shape[0]:
                    _grow(meta, table, ent, head)
                    mask, shift = meta[_MASK], meta[_SHIFT]
                    i, _ = _find(table, ent, key, mask, shift)
                nfree -= 1
                e = free[nfree]
                ent[e, KEY], ent[e, BYTES], ent[e, SIZE] = key, nbytes, size
                ent[e, TENSOR], ent[e, DIRTY], ent[e, SLOT] = tensor, store, i
                table[i] = e + 1
                head, tail = _push_front(ent, head, tail, e)
                used += size
                while used > capacity:
                    v = tail
                    # Empty v's table slot, shifting later entries of its cluster back
                    # (linear probing without tombstones).
                    hole = ent[v, SLOT]
                    k = hole
                    moved = 1
                    while moved:
                        table[hole] = 0
                        while True:
                            k = (k + 1) & mask
                            moved = table[k]
                            if moved == 0:
                                break
                            home = _hash(ent[moved - 1, KEY], shift)
                            # The entry at k stays if its home lies cyclically in (hole, k].
                            if ((hole < k and hole < home <= k)
                                    or (hole > k and (home > hole or home <= k))):
                                continue
                            table[hole] = moved
                            ent[moved - 1, SLOT] = hole
                            hole = k
                            break
                    head, tail = _unlink(ent, head, tail, v)
                    used -= ent[v, SIZE]
                    if ent[v, DIRTY]:
                        stats[ent[v, TENSOR], WRITEBACK] += ent[v, BYTES]
                        written += ent[v, BYTES]
                    free[nfree] = v
                    nfree += 1
        out[j, 0] = hit
        out[j, 1] = miss
        out[j, 2] = written
    save_cursor(meta, (head, tail, used, nfree))


@njit(cache=True)
def flush(state):  # pragma: no cover - numba
    """Write back every dirty block, leaving it resident (clean)."""
    meta, table, ent, free, stats = state
    written = 0
    e = meta[_HEAD]
    while e >= 0:
        if ent[e, DIRTY]:
            ent[e, DIRTY] = 0
            stats[ent[e, TENSOR], WRITEBACK] += ent[e, BYTES]
            written += ent[e, BYTES]
        e = ent[e, NEXT]
    return written
