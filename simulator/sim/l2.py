"""The L2 cache: a least-recently-used cache of the preset's capacity, with write-back.

Granularity. The cache holds *blocks*: a block is a rectangle of one tensor plane of
``R x C`` elements, where ``R`` and ``C`` are the greatest common divisors of the tile
heights and widths with which the schedule's kernels access that tensor (tiles that span
its whole height or width, which start at 0, left out: ``BlockLayout.from_schedule``).
For most tensors that is exactly one tile (all FA2 accesses to K are ``BN x d`` tiles),
so an access is one lookup; where kernels use different shapes (naive attention writes S
as ``BM x BN`` tiles and reads it back by rows) a tile covers several blocks and every byte
keeps its identity across kernels, so a small S written by one kernel hits when the next
reads it.

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
Dirty blocks are written to DRAM when they are evicted, whichever kernel evicts them: what
a kernel leaves dirty stays in the cache for the next kernel to hit or to evict
(``dirty_bytes`` says how much of each tensor is dirty). Reads are counted in DRAM bytes
when they miss; writes when they are written back (``record.KernelRun`` attributes them to
the kernel that stored them, and what is still dirty after the last kernel).

**Foreign dirty data** (``L2Cache.fill_foreign``). A run can start with the cache full of
another program's dirty lines, as Triton's ``do_bench`` leaves it: before every timed run
it zeroes a 256 MiB buffer, so the last ``l2_bytes`` of those zeros are still in L2, dirty,
when the kernel starts (L2 is write-back). They are one extra tensor after the schedule's
(``BlockLayout.with_foreign``), older than anything the run touches, so LRU evicts them
first: each byte the run allocates evicts a foreign byte and writes it to DRAM, until none
is left; for the same order of accesses the run's own hits, misses and write-backs are
those of an empty cache (``dirty_bytes`` leaves them out: they are no tensor of the run's).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

import numpy as np
from numba import njit

from simulator.hardware import L2_SECTOR_BYTES
from traces.schedules import Schedule

SECTOR_BYTES = L2_SECTOR_BYTES  # presets must agree (simulator.hardware checks)
HIT, MISS, WRITE, WRITEBACK = range(4)  # columns of the per-tensor statistics (bytes)
# Scalars of the cache state (``meta``): the capacity, the clock, the queue ring (first
# record, records), bytes in use, then the pools' counters (pages taken, freed pages,
# freed buckets, buckets taken; taking starts at 1, entry 0 means none).
_CAPACITY, _CLOCK, _HEAD, _LENGTH, _USED, _PAGES, _FREE_PAGES, _FREE_BUCKETS, _BUCKETS = range(9)
# A bucket holds this many consecutive block numbers: eight int64 words fill one 64-byte
# CPU cache line.
GROUP_BITS = 3
GROUP = 1 << GROUP_BITS
_GROUP_MASK = GROUP - 1
# A directory page maps this many consecutive groups to their buckets (int32 entries,
# 256 bytes): large enough that the top level is small (4 bytes per 512 blocks), small
# enough that the worst case, a page per resident block, stays near 100 MB (the H200's
# 60 MiB of 128-byte blocks); naive attention at N = 8192 takes 17 000 pages, 4 MB.
PAGE_BITS = 6
PAGE = 1 << PAGE_BITS
_PAGE_MASK = PAGE - 1
PAGE_SHIFT = GROUP_BITS + PAGE_BITS
# A block's tag: (tensor * 4 + edges) * 2 + dirty, the low bits of its word (the stamp
# above them is at least 1, so a resident block's word is never 0).
TAG_BITS = 16
_TAG_MASK = (1 << TAG_BITS) - 1
DIRTY = 1
# Another program's data (``L2Cache.fill_foreign``) is held in blocks of this size: a
# multiple of every line, few enough blocks that filling 60 MiB is 15 360 lookups.
FOREIGN_BLOCK_BYTES = 4096


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
    foreign_tensor: int | None = None  # index of another program's data (``with_foreign``)

    @classmethod
    def from_schedule(cls, schedule: Schedule) -> BlockLayout:
        """Blocks of each tensor: the greatest common divisors of the heights and widths
        of the tiles that access it, leaving out tiles as high or as wide as the tensor
        (such a tile only ever starts at 0, where every block starts: naive attention's
        softmax reads whole rows of S, and a row of 513 keys must not make S's blocks one
        column wide). A tensor that only such tiles access is one block high or wide."""
        names = schedule.tensor_names
        tensors = [schedule.tensors[n] for n in names]
        block_rows, block_cols = [0] * len(names), [0] * len(names)
        for kernel in schedule.kernels:
            for access in kernel.accesses:
                i = names.index(access.tensor)
                if access.tile_rows < tensors[i].rows:
                    block_rows[i] = gcd(block_rows[i], access.tile_rows)
                if access.tile_cols < tensors[i].cols:
                    block_cols[i] = gcd(block_cols[i], access.tile_cols)
        rows = np.array([t.rows for t in tensors], dtype=np.int64)
        cols = np.array([t.cols for t in tensors], dtype=np.int64)
        # 0: only tiles as high (wide) as the tensor access it, one block high (wide)
        r = np.array([br or t.rows for br, t in zip(block_rows, tensors, strict=True)],
                     dtype=np.int64)
        c = np.array([bc or t.cols for bc, t in zip(block_cols, tensors, strict=True)],
                     dtype=np.int64)
        planes = np.array([t.planes for t in tensors], dtype=np.int64)
        per_tensor = planes * -(-rows // r) * -(-cols // c)
        base = np.concatenate([[0], np.cumsum(per_tensor)[:-1]]).astype(np.int64)
        return cls(rows, cols, np.array([t.elem_bytes for t in tensors], dtype=np.int64),
                   r, c, -(-rows // r), -(-cols // c), base, planes, int(per_tensor.sum()))

    def with_foreign(self, nbytes: int) -> BlockLayout:
        """This layout and one more tensor after the schedule's: ``nbytes`` (whole
        ``FOREIGN_BLOCK_BYTES`` blocks) of another program's data (``L2Cache.fill_foreign``)."""
        if self.foreign_tensor is not None:
            raise ValueError("the layout already has a foreign tensor.")
        rows = nbytes // FOREIGN_BLOCK_BYTES

        def grow(values: np.ndarray, value: int) -> np.ndarray:
            return np.append(values, np.int64(value))

        return BlockLayout(
            grow(self.rows, rows), grow(self.cols, FOREIGN_BLOCK_BYTES), grow(self.elem, 1),
            grow(self.block_rows, 1), grow(self.block_cols, FOREIGN_BLOCK_BYTES),
            grow(self.row_blocks, rows), grow(self.col_blocks, 1),
            grow(self.base, self.total_blocks), grow(self.planes, 1), self.total_blocks + rows,
            foreign_tensor=int(self.rows.size))

    @property
    def own_tensors(self) -> int:
        """How many tensors belong to the schedule (all but a foreign one)."""
        return int(self.rows.size) if self.foreign_tensor is None else self.foreign_tensor

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

    Where a block lives: a page table over block numbers, no hashing. Blocks are kept in
    *buckets* of ``GROUP`` consecutive block numbers (a row of S, tiles next to each other);
    bucket b holds one word per block, ``word[b, s] = stamp << TAG_BITS | tag`` (0: not
    resident), where ``stamp`` is the clock value of the block's last access and ``tag`` its
    tensor, whether the tensor's bottom or right edge cuts it (the bytes of each kind are in
    ``sizes``) and its dirty bit. ``PAGE`` consecutive groups share a directory page:
    ``top[block >> PAGE_SHIFT]`` is the block's page (0: none) and ``pages[page, group %
    PAGE]`` its bucket (0: none). Row 0 of ``pages`` and of ``word`` is never used and stays
    zero, so a lookup is three loads and no branch. Pages and buckets come from pools (a
    high-water mark and a stack of freed ones, ``free_pages``/``free_buckets``); a bucket is
    freed when its last resident block is evicted, a page when its last bucket is
    (``page_buckets`` counts them). Freed entries are all zero; those taken from above the
    high-water mark are cleared when taken (a ``restore`` leaves old contents there).

    Recency is kept by time stamps instead of a linked list: an access stamps the block
    with the next clock value and appends (block, stamp) to ``queue`` (a ring); the least
    recently used block is the one of the oldest record whose stamp is still the block's
    (a record is stale once its block is accessed again). Evictions pop records and skip
    stale ones; when the ring is full its stale records are squeezed out (``_compact``).
    That is exact LRU, the order a linked list would keep.

    Why this shape: naive attention streams hundreds of millions of 128-byte blocks of S and
    P through a cache that holds half a million, so nearly every access allocates a block
    and evicts another; the cost is the CPU cache misses of finding both. A linked list of
    per-block entries costs a miss per entry and neighbour; a hash table scatters
    neighbouring groups over a table larger than the CPU's caches. The page table keeps the
    directory of neighbouring blocks together (a tile's rows of S are neighbouring entries
    of a few pages), the pools keep the buckets in use dense (a freed bucket, still in the
    CPU's cache, is the next one taken), and the queue is read and written in order. On
    naive attention at N = 8192 that is 35-45 ns a block, against 100-210 ns for a hash
    table of the same buckets (whose probes for the block and its victim each missed).

    Memory: the pools are sized for their worst case (a bucket and a page per resident
    block), so they never overflow, but only what is taken is ever touched; ``top`` has one
    4-byte entry per ``PAGE * GROUP`` blocks.
    """

    def __init__(self, capacity_bytes: int, layout: BlockLayout):
        if layout.rows.shape[0] >= 1 << (TAG_BITS - 3):
            raise ValueError(f"the L2 model handles at most {(1 << (TAG_BITS - 3)) - 1} "
                             f"tensors, got {layout.rows.shape[0]}.")
        self.layout = layout
        # At most one block over the capacity is resident (before its victims leave).
        entries = min(layout.max_resident_blocks(capacity_bytes), layout.total_blocks) + 2
        directory = -(-layout.total_blocks // (PAGE * GROUP))
        page_rows = min(entries, directory) + 1  # row 0: none
        self.meta = np.array([capacity_bytes, 1, 0, 0, 0, 1, 0, 0, 1], dtype=np.int64)
        self.top = np.zeros(max(directory, 1), dtype=np.int32)
        self.pages = np.zeros((page_rows, PAGE), dtype=np.int32)
        self.page_buckets = np.zeros(page_rows, dtype=np.int64)
        self.free_pages = np.zeros(page_rows, dtype=np.int64)
        self.word = _aligned_zeros((entries + 1, GROUP))
        self.free_buckets = np.zeros(entries + 1, dtype=np.int64)
        # A ring of twice the resident blocks: after a compaction at least half is free.
        self.queue = np.zeros((2, 2 * entries), dtype=np.int64)  # block, stamp
        self.sizes = np.zeros((layout.rows.shape[0], 4, 2), dtype=np.int64)  # bytes, sectors
        self.stats = np.zeros((layout.rows.shape[0], 4), dtype=np.int64)

    def state(self) -> tuple:
        return (self.meta, self.top, self.pages, self.page_buckets, self.free_pages, self.word,
                self.free_buckets, self.queue, self.sizes, self.stats)

    def access(self, tiles: np.ndarray) -> np.ndarray:
        """Access the tiles (rows of ``TILE_FIELDS`` columns) in order; ``[n, 3]`` bytes out."""
        out = np.zeros((tiles.shape[0], 3), dtype=np.int64)
        touch_tiles(self.state(), self.layout.arrays(), tiles, tiles.shape[0], out)
        return out

    def fill_foreign(self) -> int:
        """Fill the cache with the layout's foreign tensor, every block dirty (module
        docstring), before anything else is accessed; returns the bytes it holds."""
        t = self.layout.foreign_tensor
        if t is None:
            raise ValueError("the layout has no foreign tensor (BlockLayout.with_foreign).")
        rows, cols = int(self.layout.rows[t]), int(self.layout.cols[t])
        before = self.stats[t].copy()
        self.access(np.array([[t, 0, 0, 0, rows, cols, 1]], dtype=np.int64))
        self.stats[t] = before  # filling is not traffic of the run
        return rows * cols

    def dirty_bytes(self) -> np.ndarray:
        """Bytes of each of the schedule's tensors that the cache holds dirty (not yet
        written back); a foreign tensor's are left out. Nothing changes."""
        out = np.zeros(self.layout.own_tensors, dtype=np.int64)
        count_dirty(self.state(), out)
        return out

    def traffic_since(self, before: np.ndarray) -> tuple[np.ndarray, int]:
        """The statistics since ``before`` (a copy of ``stats``): ``[own tensors, 4]``
        bytes of the schedule's tensors, and the foreign bytes written back."""
        delta = self.stats - before
        own = self.layout.own_tensors
        return delta[:own], int(delta[own:, WRITEBACK].sum())

    @property
    def used_bytes(self) -> int:
        return int(self.meta[_USED])

    @property
    def pools_taken(self) -> tuple[int, int]:
        """Directory pages and buckets taken from the pools so far (high-water marks, row 0
        included): what the largest resident set needed, not what is resident now."""
        return int(self.meta[_PAGES]), int(self.meta[_BUCKETS])

    def snapshot(self) -> tuple:
        """A copy of the state; of the pools only the part in use (the rest is never read:
        what is taken from above a high-water mark is cleared first)."""
        meta = self.meta
        in_use = (None, None, meta[_PAGES], meta[_PAGES], meta[_FREE_PAGES], meta[_BUCKETS],
                  meta[_FREE_BUCKETS], None, None, None)
        return tuple(a.copy() if n is None else a[:int(n)].copy()
                     for a, n in zip(self.state(), in_use, strict=True))

    def restore(self, saved: tuple) -> None:
        for current, old in zip(self.state(), saved, strict=True):
            current[:old.shape[0]] = old


def _aligned_zeros(shape: tuple) -> np.ndarray:
    """int64 zeros starting on a 64-byte boundary, so that a bucket is one CPU cache line
    (large arrays otherwise start 16 bytes past a page boundary)."""
    count = int(np.prod(shape))
    raw = np.zeros(count + 8, dtype=np.int64)
    skip = (-raw.ctypes.data % 64) // 8
    return raw[skip:skip + count].reshape(shape)


@njit(cache=True, inline="always")
def _find(top, pages, block):  # pragma: no cover - numba
    """(page, bucket) of ``block``'s group, 0 where there is none."""
    page = top[block >> PAGE_SHIFT]
    return page, pages[page, (block >> GROUP_BITS) & _PAGE_MASK]


@njit(cache=True, inline="always")
def _take(free, n_free, n_taken):  # pragma: no cover - numba
    """An entry from a pool: the last freed one, else the next above the high-water mark
    (``fresh``: its contents may be stale, after a ``restore``, and must be cleared).
    Returns (entry, freed left, taken so far, fresh)."""
    if n_free:
        return free[n_free - 1], n_free - 1, n_taken, False
    return n_taken, n_free, n_taken + 1, True


@njit(cache=True)
def cursor(meta):  # pragma: no cover - numba
    """The clock, queue ring (first record, records), bytes in use and the pools' counters
    (pages taken, freed pages, freed buckets, buckets taken) as local scalars.

    Hot loops keep these in locals and write them back with ``save_cursor``: kept in the
    ``meta`` array, every update would be a store the compiler must reload (the arrays may
    alias), which costs several times the lookup itself.
    """
    return (meta[_CLOCK], meta[_HEAD], meta[_LENGTH], meta[_USED], meta[_PAGES],
            meta[_FREE_PAGES], meta[_FREE_BUCKETS], meta[_BUCKETS])


@njit(cache=True)
def save_cursor(meta, cur):  # pragma: no cover - numba
    (meta[_CLOCK], meta[_HEAD], meta[_LENGTH], meta[_USED], meta[_PAGES], meta[_FREE_PAGES],
     meta[_FREE_BUCKETS], meta[_BUCKETS]) = cur


@njit(cache=True)
def _compact(meta, top, pages, word, queue):  # pragma: no cover - numba
    """Drop the ring's stale records, keeping the order of the others."""
    ring = queue.shape[1]
    r = w = meta[_HEAD]
    kept = 0
    for _ in range(meta[_LENGTH]):
        block = queue[0, r]
        _, b = _find(top, pages, block)
        if word[b, block & _GROUP_MASK] >> TAG_BITS == queue[1, r]:
            queue[0, w], queue[1, w] = block, queue[1, r]
            w = w + 1 if w + 1 < ring else 0
            kept += 1
        r = r + 1 if r + 1 < ring else 0
    meta[_LENGTH] = kept


# Columns of a tile list (``touch_tiles``).
T_TENSOR, T_PLANE, T_ROW_BLOCK, T_COL_BLOCK, T_ROWS, T_COLS, T_STORE = range(7)
TILE_FIELDS = 7


@njit(cache=True)
def touch_tiles(state, layout, tiles, n, out):  # pragma: no cover - numba
    """Access the first ``n`` tiles of ``tiles`` (one row each, columns ``T_*``) in order.

    Each tile is cut into its blocks and every block is looked up, allocated on a miss
    (evicting least recently used blocks until it fits) and, for a store, marked dirty.
    ``out[j]`` receives tile j's (hit, miss, written-back) bytes; stores count neither hit
    nor miss.

    NOTE: the whole lookup is written out in this one function (helpers are inlined) for
    performance: a call that passes the cache arrays costs more in reference counting than
    the lookup itself.
    """
    meta, top, pages, page_buckets, free_pages, word, free_buckets, queue, sizes, stats = state
    rows, cols, elem, block_rows, block_cols, row_blocks, col_blocks, base = layout
    clock, head, length, used, n_pages, n_free_pages, n_free_buckets, n_buckets = cursor(meta)
    capacity = meta[_CAPACITY]
    ring = queue.shape[1]
    for j in range(n):
        t, plane = tiles[j, T_TENSOR], tiles[j, T_PLANE]
        tile_rows, tile_cols, store = tiles[j, T_ROWS], tiles[j, T_COLS], tiles[j, T_STORE]
        n_rows, n_cols, r, c = rows[t], cols[t], block_rows[t], block_cols[t]
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
                valid_cols = min(c, n_cols - bc * c)
                row_bytes = valid_cols * elem[t]
                valid = valid_rows * row_bytes
                block = base[t] + (plane * row_blocks[t] + br) * col_blocks[t] + bc
                s = block & _GROUP_MASK
                page, b = _find(top, pages, block)
                w = word[b, s]
                if w:
                    if store:
                        w |= DIRTY
                        stats[t, WRITE] += valid
                    else:
                        stats[t, HIT] += valid
                        hit += valid
                    if w >> TAG_BITS == clock - 1:  # already the most recent
                        word[b, s] = w
                        continue
                else:
                    if store:
                        stats[t, WRITE] += valid
                    else:
                        stats[t, MISS] += valid
                        miss += valid
                    if c == n_cols:  # the block is contiguous in memory
                        sectors = (valid + SECTOR_BYTES - 1) // SECTOR_BYTES * SECTOR_BYTES
                    else:
                        sectors = valid_rows * ((row_bytes + SECTOR_BYTES - 1) // SECTOR_BYTES
                                                * SECTOR_BYTES)
                    if sectors > capacity:  # larger than the whole cache: streams through
                        if store:
                            stats[t, WRITEBACK] += valid
                            written += valid
                        continue
                    if b == 0:  # take a bucket (and a page) from the pools
                        if page == 0:
                            page, n_free_pages, n_pages, fresh = _take(free_pages,
                                                                       n_free_pages, n_pages)
                            if fresh:
                                pages[page] = 0
                                page_buckets[page] = 0
                            top[block >> PAGE_SHIFT] = page
                        b, n_free_buckets, n_buckets, fresh = _take(free_buckets,
                                                                    n_free_buckets, n_buckets)
                        if fresh:
                            word[b] = 0
                        pages[page, (block >> GROUP_BITS) & _PAGE_MASK] = b
                        page_buckets[page] += 1
                    # The block's bytes by the edges that cut it (the same for all such).
                    edge = 2 * (valid_rows < r) + (valid_cols < c)
                    sizes[t, edge, 0], sizes[t, edge, 1] = valid, sectors
                    w = ((4 * t + edge) << 1) | store
                    used += sectors
                word[b, s] = (clock << TAG_BITS) | (w & _TAG_MASK)
                if length == ring:
                    save_cursor(meta, (clock, head, length, used, n_pages, n_free_pages,
                                       n_free_buckets, n_buckets))
                    _compact(meta, top, pages, word, queue)
                    length = meta[_LENGTH]
                at = head + length
                at = at - ring if at >= ring else at
                queue[0, at], queue[1, at] = block, clock
                length += 1
                clock += 1
                # Evict from the front of the queue until the new block fits (it is never
                # the victim: its record is the newest).
                while used > capacity:
                    victim, when = queue[0, head], queue[1, head]
                    head = head + 1 if head + 1 < ring else 0
                    length -= 1
                    vs = victim & _GROUP_MASK
                    vp, v = _find(top, pages, victim)
                    kind = word[v, vs]
                    if kind >> TAG_BITS != when:
                        continue  # stale: the block was accessed since (or is gone)
                    kind &= _TAG_MASK
                    vt, vedge = kind >> 3, (kind >> 1) & 3
                    used -= sizes[vt, vedge, 1]
                    if kind & DIRTY:
                        stats[vt, WRITEBACK] += sizes[vt, vedge, 0]
                        written += sizes[vt, vedge, 0]
                    word[v, vs] = 0
                    empty = True
                    for k in range(GROUP):
                        if word[v, k]:
                            empty = False
                            break
                    if empty:  # give the bucket back, and its page if that was its last
                        pages[vp, (victim >> GROUP_BITS) & _PAGE_MASK] = 0
                        free_buckets[n_free_buckets] = v
                        n_free_buckets += 1
                        page_buckets[vp] -= 1
                        if page_buckets[vp] == 0:
                            top[victim >> PAGE_SHIFT] = 0
                            free_pages[n_free_pages] = vp
                            n_free_pages += 1
        out[j, 0] = hit
        out[j, 1] = miss
        out[j, 2] = written
    save_cursor(meta, (clock, head, length, used, n_pages, n_free_pages, n_free_buckets,
                       n_buckets))


@njit(cache=True)
def count_dirty(state, out):  # pragma: no cover - numba
    """Add the bytes of every resident dirty block of tensor ``t < out.size`` to ``out[t]``."""
    meta, _, _, _, _, word, _, _, sizes, _ = state
    for b in range(1, meta[_BUCKETS]):  # freed buckets are all zero
        for s in range(GROUP):
            w = word[b, s]
            kind = w & _TAG_MASK
            if w & DIRTY and kind >> 3 < out.size:
                out[kind >> 3] += sizes[kind >> 3, (kind >> 1) & 3, 0]
