"""The L2 model: exact LRU with write-back, blocks shared across tile shapes."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

from simulator.sim.l2 import HIT, MISS, TILE_FIELDS, WRITE, WRITEBACK, BlockLayout, L2Cache
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
    cache, used, hit, miss, written = OrderedDict(), 0, 0, 0, 0
    for key, nbytes, store in stream:
        if key in cache:
            cache.move_to_end(key)
            size, dirty = cache[key]
            cache[key] = (size, dirty or store)
            hit += 0 if store else nbytes
            continue
        miss += 0 if store else nbytes
        cache[key] = (nbytes, store)
        used += nbytes
        while used > capacity:
            _, (size, dirty) = cache.popitem(last=False)
            used -= size
            written += size if dirty else 0
    return hit, miss, written, cache


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
    hit, miss, written, resident = _reference(
        [(int(r), 32, bool(s)) for r, s in zip(rows, store, strict=True)], 150 * 32)
    assert (out[:, 0].sum(), out[:, 1].sum(), out[:, 2].sum()) == (hit, miss, written)
    assert cache.used_bytes == 32 * len(resident)
    dirty_left = 32 * sum(1 for _, d in resident.values() if d)
    assert cache.flush() == dirty_left
    assert cache.flush() == 0  # clean after a flush, and still resident:
    again = cache.access(_tiles(np.array(list(resident)[-5:]), np.zeros(5, dtype=bool)))
    assert again[:, 0].sum() == 5 * 32
    stats = cache.stats[0]
    assert stats[HIT] + stats[MISS] == 32 * int((~store).sum()) + 5 * 32
    assert stats[WRITE] == 32 * int(store.sum())
    assert stats[WRITEBACK] == written + dirty_left


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


def test_snapshot_and_restore():
    cache = L2Cache(10 * 32, _layout(100, 8, 4, 1, 8))
    cache.access(_tiles(np.arange(5), np.zeros(5, dtype=bool)))
    saved = cache.snapshot()
    cache.access(_tiles(np.arange(50, 60), np.ones(10, dtype=bool)))
    cache.restore(saved)
    again = cache.access(_tiles(np.arange(5), np.zeros(5, dtype=bool)))
    assert again[:, 0].sum() == 5 * 32

