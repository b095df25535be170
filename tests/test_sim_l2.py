"""The L2 model: exact LRU with write-back, blocks shared across tile shapes."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

from simulator.sim.l2 import (
    GROUP,
    HIT,
    MISS,
    PAGE,
    TILE_FIELDS,
    WRITE,
    WRITEBACK,
    BlockLayout,
    L2Cache,
)
from traces.problem import AttentionProblem
from traces.schedules import build_schedule
from traces.tiling import Tiling


def _layout(rows: int, cols: int, elem: int, block_rows: int, block_cols: int,
            planes: int = 1) -> BlockLayout:
    one = lambda v: np.array([v], dtype=np.int64)  # noqa: E731
    return BlockLayout(one(rows), one(cols), one(elem), one(block_rows), one(block_cols),
                       one(-(-rows // block_rows)), one(-(-cols // block_cols)), one(0),
                       one(planes), planes * -(-rows // block_rows) * -(-cols // block_cols))


def _reference(stream, capacity):
    """Textbook LRU over (key, bytes, store) with byte capacity and write-back on eviction."""
    return _reference_sized([(key, n, n, store) for key, n, store in stream], capacity)


def _reference_sized(stream, capacity):
    """The same over (key, valid bytes, bytes occupied, store); per access (hit, miss,
    written back) and the cache left (key: (valid bytes, occupied, dirty))."""
    cache, used, counts = OrderedDict(), 0, []
    for key, nbytes, size, store in stream:
        if key in cache:
            cache.move_to_end(key)
            valid, occupied, dirty = cache[key]
            cache[key] = (valid, occupied, dirty or store)
            counts.append((0 if store else nbytes, 0, 0))
            continue
        written = 0
        if size <= capacity:
            cache[key] = (nbytes, size, store)
            used += size
        elif store:  # larger than the cache: streams through
            written = nbytes
        while used > capacity:
            _, (valid, occupied, dirty) = cache.popitem(last=False)
            used -= occupied
            written += valid if dirty else 0
        counts.append((0, 0 if store else nbytes, written))
    hit, miss, written = (sum(c[i] for c in counts) for i in range(3))
    return hit, miss, written, cache, counts


def _tiles(rows: np.ndarray, store: np.ndarray, tile_rows: int = 1, tile_cols: int = 8):
    tiles = np.zeros((rows.size, TILE_FIELDS), dtype=np.int64)
    tiles[:, 2] = rows
    tiles[:, 4] = tile_rows
    tiles[:, 5] = tile_cols
    tiles[:, 6] = store
    return tiles


@pytest.mark.parametrize("seed", range(4))
def test_lru_matches_reference_with_writeback(seed):
    rng = np.random.default_rng(seed)
    # 400 rows of 8 fp32 (32 bytes: one sector each); the cache holds 150 of them.
    cache = L2Cache(150 * 32, _layout(400, 8, 4, 1, 8))
    rows = rng.integers(0, 400, 30_000) // rng.integers(1, 4, 30_000)  # skewed reuse
    store = rng.random(30_000) < 0.3
    out = cache.access(_tiles(rows, store))
    hit, miss, written, resident, _ = _reference(
        [(int(r), 32, bool(s)) for r, s in zip(rows, store, strict=True)], 150 * 32)
    assert (out[:, 0].sum(), out[:, 1].sum(), out[:, 2].sum()) == (hit, miss, written)
    assert cache.used_bytes == 32 * len(resident)
    dirty_left = 32 * sum(1 for *_, d in resident.values() if d)
    assert list(cache.dirty_bytes()) == [dirty_left]
    assert list(cache.dirty_bytes()) == [dirty_left]  # counting changes nothing:
    again = cache.access(_tiles(np.array(list(resident)[-5:]), np.zeros(5, dtype=bool)))
    assert again[:, 0].sum() == 5 * 32
    stats = cache.stats[0]
    assert stats[HIT] + stats[MISS] == 32 * int((~store).sum()) + 5 * 32
    assert stats[WRITE] == 32 * int(store.sum())
    assert stats[WRITEBACK] == written


def test_table_grows_past_its_initial_size():
    cache = L2Cache(1 << 20, _layout(100_000, 8, 4, 1, 8))
    first = cache.access(_tiles(np.arange(20_000), np.zeros(20_000, dtype=bool)))
    assert first[:, 1].sum() == 20_000 * 32  # all compulsory misses
    second = cache.access(_tiles(np.arange(20_000), np.zeros(20_000, dtype=bool)))
    assert second[:, 0].sum() == 20_000 * 32  # 640 KB fits in 1 MiB: all hit


def test_tile_covers_blocks_and_bytes_are_kept():
    """S written as 4x8 tiles, read back by single rows: bytes match block by block."""
    cache = L2Cache(1 << 20, _layout(16, 8, 2, 1, 8))  # rows of 16 bytes
    writes = cache.access(_tiles(np.arange(4), np.ones(4, dtype=bool), tile_rows=4))
    assert writes.sum() == 0
    assert cache.stats[0, WRITE] == 16 * 8 * 2
    reads = cache.access(_tiles(np.arange(16), np.zeros(16, dtype=bool)))
    assert reads[:, 0].sum() == 16 * 8 * 2 and reads[:, 1].sum() == 0
    # 16-byte rows occupy a 32-byte sector each: capacity counts sectors.
    assert cache.used_bytes == 16 * 32


def test_partial_tiles_count_valid_bytes_only():
    cache = L2Cache(1 << 20, _layout(100, 64, 2, 64, 64))
    out = cache.access(_tiles(np.array([1]), np.zeros(1, dtype=bool), tile_rows=64,
                              tile_cols=64))
    assert out[0, 1] == 36 * 64 * 2  # rows 64..99 of 100


def test_block_layout_of_naive_attention():
    p = AttentionProblem(batch=1, heads=2, seq_q=256, head_dim=64)
    layout = BlockLayout.from_schedule(build_schedule(p, Tiling(64, 32), "naive"))
    names = build_schedule(p, Tiling(64, 32), "naive").tensor_names
    s = names.index("s")
    # S is stored as 64x32 tiles and read as 1x256 rows: blocks of one row, 32 columns.
    assert (layout.block_rows[s], layout.block_cols[s]) == (1, 32)
    q = names.index("q")
    assert (layout.block_rows[q], layout.block_cols[q]) == (64, 64)


@pytest.mark.parametrize("seq_kv", [513, 1000])
def test_whole_rows_leave_blocks_as_wide_as_the_tiles(seq_kv):
    """Naive attention's softmax reads whole rows of S, of any key length: those tiles
    start at column 0 and so need no narrower blocks than QK's 64 x 32 tiles do (with
    the row's width in the divisor S's blocks were a column wide at 513 keys, each
    taking a 32-byte sector for its 2 bytes). Tiles higher or wider than a tensor
    (64-row tiles over 16 queries) make it one block high."""
    p = AttentionProblem(batch=1, heads=2, seq_q=16, seq_kv=seq_kv, head_dim=64)
    schedule = build_schedule(p, Tiling(64, 32), "naive")
    layout = BlockLayout.from_schedule(schedule)
    names = schedule.tensor_names
    for name in ("s", "p"):
        i = names.index(name)
        assert (layout.block_rows[i], layout.block_cols[i]) == (1, 32)
    q = names.index("q")
    assert (layout.block_rows[q], layout.block_cols[q]) == (16, 64)


@pytest.mark.parametrize("seq_kv", [513, 1000, 1024])
def test_naive_forward_that_fits_in_l2_reads_only_its_inputs(seq_kv):
    """S and P of 8 x 1000 x seq_kv bf16 (16-33 MB together) fit in the H200's 60 MiB
    of L2 from a cold start: the softmax and PV find what QK and the softmax wrote, and
    DRAM reads are Q, K and V once, in both engines, whatever the key length."""
    from simulator.hardware import load_hardware
    from simulator.sim import predict

    problem = AttentionProblem(batch=1, heads=8, seq_q=1000, seq_kv=seq_kv, head_dim=64)
    inputs = sum(8 * rows * 64 * 2 for rows in (1000, seq_kv, seq_kv))
    for mode in ("full", "aggregated"):
        pred, _ = predict(problem, Tiling(64, 64), "naive", load_hardware("h200-sxm"),
                          mode=mode)
        assert pred["per_tensor"]["s"]["dram_read"] == pred["per_tensor"]["p"]["dram_read"] == 0
        assert pred["bytes"]["dram_read"] == inputs, mode


def test_snapshot_and_restore():
    cache = L2Cache(10 * 32, _layout(100, 8, 4, 1, 8))
    cache.access(_tiles(np.arange(5), np.zeros(5, dtype=bool)))
    saved = cache.snapshot()
    cache.access(_tiles(np.arange(50, 60), np.ones(10, dtype=bool)))
    cache.restore(saved)
    again = cache.access(_tiles(np.arange(5), np.zeros(5, dtype=bool)))
    assert again[:, 0].sum() == 5 * 32


def _blocks(tile, rows, cols, elem, block_rows, block_cols):
    """The model's cut of one tile into blocks, written out: (key, valid bytes, sectors)."""
    plane, tile_row, tile_col, tile_rows, tile_cols = tile
    row_blocks, col_blocks = -(-rows // block_rows), -(-cols // block_cols)
    r0, c0 = tile_row * tile_rows, tile_col * tile_cols
    out = []
    for br in range(r0 // block_rows, -(-min(r0 + tile_rows, rows) // block_rows)):
        for bc in range(c0 // block_cols, -(-min(c0 + tile_cols, cols) // block_cols)):
            valid_rows = min(block_rows, rows - br * block_rows)
            row_bytes = min(block_cols, cols - bc * block_cols) * elem
            if block_cols == cols:
                sectors = -(-valid_rows * row_bytes // 32) * 32
            else:
                sectors = valid_rows * -(-row_bytes // 32) * 32
            key = (plane * row_blocks + br) * col_blocks + bc
            out.append((key, valid_rows * row_bytes, sectors))
    return out


@pytest.mark.parametrize(("seed", "capacity", "planes"),
                         [(0, 3000, 40), (1, 3000, 40), (2, 240_000, 1000), (3, 100, 40)])
def test_mixed_tiles_with_edges_match_reference_per_tile(seed, capacity, planes):
    """Tiles of several shapes over planes whose sizes are not multiples of the blocks
    (edge blocks are smaller), with stores and evictions; with a cache smaller than a full
    block (those stream through), and one whose table grows after the snapshot that is
    restored. Every tile's counts are exact."""
    rng = np.random.default_rng(seed)
    rows, cols, elem = 37, 50, 2
    shapes = [(4, 8), (8, 16), (4, 24), (12, 8), (36, 48)]  # blocks of 4 x 8
    cache = L2Cache(capacity, _layout(rows, cols, elem, 4, 8, planes))
    tiles = np.zeros((6000, TILE_FIELDS), dtype=np.int64)
    for j in range(tiles.shape[0]):
        tr, tc = shapes[rng.integers(len(shapes))]
        plane = rng.integers(planes) if j < 3000 else rng.integers(4)  # then hot planes
        tiles[j, 1:] = (plane, rng.integers(-(-rows // tr)), rng.integers(-(-cols // tc)), tr,
                        tc, rng.random() < 0.3)
    stream, owner = [], []
    for j, tile in enumerate(tiles):
        for key, nbytes, sectors in _blocks(tile[1:6], rows, cols, elem, 4, 8):
            stream.append((key, nbytes, sectors, bool(tile[6])))
            owner.append(j)
    *_, counts = _reference_sized(stream, capacity)
    expected = np.zeros((tiles.shape[0], 3), dtype=np.int64)
    np.add.at(expected, np.array(owner), np.array(counts))
    first = cache.access(tiles[:100])
    saved = cache.snapshot()
    mask = int(cache.meta[-1])
    rest = cache.access(tiles[100:])
    assert capacity < 100_000 or cache.meta[-1] > mask  # the table grew
    np.testing.assert_array_equal(np.vstack([first, rest]), expected)
    cache.restore(saved)
    np.testing.assert_array_equal(cache.access(tiles[100:]), expected[100:])


def _fresh_stream_counts(rows, store, capacity):
    """Per access (hit, miss, written back) of the textbook reference, rows of 32 bytes."""
    *_, counts = _reference([(int(r), 32, bool(s)) for r, s in zip(rows, store, strict=True)],
                            capacity)
    return np.array(counts, dtype=np.int64)


def test_streaming_gives_buckets_and_pages_back():
    """A stream over 100 000 blocks through a cache of 150: the pools never hold more than
    the resident blocks' groups and pages, and pages left behind are released."""
    cache = L2Cache(150 * 32, _layout(100_000, 8, 4, 1, 8))
    rng = np.random.default_rng(0)
    rows = np.concatenate([np.arange(100_000), np.arange(100_000)[::-1]])
    store = rng.random(rows.size) < 0.5
    np.testing.assert_array_equal(cache.access(_tiles(rows, store)),
                                  _fresh_stream_counts(rows, store, 150 * 32))
    pages, buckets = cache.pools_taken
    # 150 resident blocks (and the newcomer) span at most 21 groups, and pages of 512
    # blocks at most 2; row 0 of each pool is never taken.
    assert buckets <= 150 // GROUP + 3 and pages <= 3
    assert np.count_nonzero(cache.top) <= 2
    assert cache.used_bytes == 150 * 32


def test_one_block_per_page_fills_the_pools_exactly():
    """The worst case for the pools: every block in a page of its own. The pools are sized
    for it, take one page and one bucket per resident block (and the newcomer), and reuse
    what evictions free; counts stay exact."""
    stride = GROUP * PAGE
    cache = L2Cache(100 * 32, _layout(300 * stride, 8, 4, 1, 8))
    rng = np.random.default_rng(1)
    rows = stride * np.concatenate([np.arange(300), rng.integers(0, 300, 5000)])
    store = rng.random(rows.size) < 0.3
    np.testing.assert_array_equal(cache.access(_tiles(rows, store)),
                                  _fresh_stream_counts(rows, store, 100 * 32))
    assert cache.pools_taken == (102, 102)
    assert cache.pages.shape[0] >= 102 and cache.word.shape[0] >= 102


def test_restore_after_the_pools_grew():
    """A snapshot taken while the pools are small; the accesses after it take (and dirty)
    entries above the high-water mark, which a restore leaves behind. Replaying the same
    accesses from the restored state must give the same counts and the same flush."""
    stride = GROUP * PAGE
    cache = L2Cache(2000 * 32, _layout(3000 * stride, 8, 4, 1, 8))
    rng = np.random.default_rng(2)
    head = rng.integers(0, 3000, 50) * stride
    tail = np.concatenate([rng.integers(0, 3000, 3000) * stride + rng.integers(0, 8, 3000),
                           np.arange(20_000)])
    rows = np.concatenate([head, tail])
    store = rng.random(rows.size) < 0.3
    expected = _fresh_stream_counts(rows, store, 2000 * 32)
    np.testing.assert_array_equal(cache.access(_tiles(head, store[:50])), expected[:50])
    saved, small = cache.snapshot(), cache.pools_taken
    first = cache.access(_tiles(tail, store[50:]))
    grown = cache.pools_taken
    assert grown[0] > 10 * small[0] and grown[1] > 10 * small[1]
    dirty = cache.dirty_bytes()
    cache.restore(saved)
    assert cache.pools_taken == small
    np.testing.assert_array_equal(cache.access(_tiles(tail, store[50:])), first)
    np.testing.assert_array_equal(first, expected[50:])
    assert cache.pools_taken == grown
    np.testing.assert_array_equal(cache.dirty_bytes(), dirty)
