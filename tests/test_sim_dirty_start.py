"""A run that starts with L2 full of another program's dirty lines (``l2_start="dirty"``).

``triton.testing.do_bench`` zeroes a 256 MiB buffer before every timed run, so each starts
with L2 full of dirty zeros; the run's first allocations evict them and write them to
DRAM. The model keeps them as a foreign tensor older than everything the run touches
(``simulator.sim.l2``): for the same order of accesses the run's own hits, misses and DRAM
bytes are exactly those of a cold start, the foreign write-backs are counted apart, and
they cost HBM time. A measured call is predicted as each measurement saw L2
(``predict_as_timed``): its kernels cold, as Nsight Compute profiles them (a kernel that
re-reads what an earlier one stored also alone, ``profiled``), its time with the dirty
start that ``do_bench`` gave it.
"""

from __future__ import annotations

import json
from collections import OrderedDict

import numpy as np
import pytest

from simulator.cli import main
from simulator.hardware import load_hardware
from simulator.sim import predict, predict_as_timed, run
from simulator.sim.l2 import FOREIGN_BLOCK_BYTES, TILE_FIELDS, WRITEBACK, BlockLayout, L2Cache
from traces.problem import AttentionProblem, ProblemError
from traces.tiling import Tiling
from validation.predict import l2_start_of, predict_record

H200 = load_hardware("h200-sxm")
ROW = 32  # bytes of one row of the test tensor: one sector


def _layout(rows: int) -> BlockLayout:
    """One tensor of ``rows`` rows of 8 fp32, one row a block."""
    one = lambda v: np.array([v], dtype=np.int64)  # noqa: E731
    return BlockLayout(one(rows), one(8), one(4), one(1), one(8), one(rows), one(1), one(0),
                       one(1), rows)


def _reads(rows: np.ndarray, store: np.ndarray | None = None) -> np.ndarray:
    tiles = np.zeros((rows.size, TILE_FIELDS), dtype=np.int64)
    tiles[:, 2] = rows
    tiles[:, 4], tiles[:, 5] = 1, 8
    if store is not None:
        tiles[:, 6] = store
    return tiles


def test_fill_holds_whole_blocks_dirty_of_no_tensor_of_the_run():
    capacity = 5 * FOREIGN_BLOCK_BYTES + 100  # the remainder holds no whole block
    cache = L2Cache(capacity, _layout(1000).with_foreign(capacity))
    assert cache.fill_foreign() == 5 * FOREIGN_BLOCK_BYTES
    assert cache.used_bytes == 5 * FOREIGN_BLOCK_BYTES
    assert not cache.stats.any()  # filling is no traffic of the run's
    assert list(cache.dirty_bytes()) == [0]  # dirty, but not the run's tensor's
    with pytest.raises(ValueError, match="already has a foreign tensor"):
        cache.layout.with_foreign(capacity)
    with pytest.raises(ValueError, match="no foreign tensor"):
        L2Cache(capacity, _layout(10)).fill_foreign()


def test_each_allocation_evicts_foreign_blocks_oldest_first():
    """A foreign block goes when the run's blocks no longer fit beside it: after ``n``
    distinct rows, ``ceil((n * 32 - free) / 4096)`` blocks, until none is left."""
    blocks = 4
    capacity = blocks * FOREIGN_BLOCK_BYTES
    cache = L2Cache(capacity, _layout(2000).with_foreign(capacity))
    cache.fill_foreign()
    before = cache.stats.copy()
    per_block = FOREIGN_BLOCK_BYTES // ROW  # rows that take a foreign block's room
    for n in (1, per_block, per_block + 1, 3 * per_block + 7, blocks * per_block, 1500):
        start = cache.stats.copy()
        cache.access(_reads(np.arange(n)))  # rows already resident hit: no new room taken
        evicted = min(blocks, -(-min(n, 1500) * ROW // FOREIGN_BLOCK_BYTES))
        own, foreign = cache.traffic_since(before)
        assert foreign == evicted * FOREIGN_BLOCK_BYTES, n
        assert own.shape == (1, 4) and own[0, WRITEBACK] == 0
        assert cache.stats[0].sum() - start[0].sum() == n * ROW  # every byte hit or missed


@pytest.mark.parametrize("seed", range(3))
def test_the_runs_own_traffic_is_that_of_a_cold_cache(seed):
    """Reads and writes of the run's own tensor, hits, misses and its write-backs, access by
    access, equal a cold cache's; the foreign bytes written back equal a textbook LRU's
    that starts full of the same dirty blocks."""
    rng = np.random.default_rng(seed)
    capacity = 6 * FOREIGN_BLOCK_BYTES  # 768 rows; the stream touches 1200
    rows = rng.integers(0, 1200, 20_000) // rng.integers(1, 3, 20_000)
    store = rng.random(20_000) < 0.3
    cold = L2Cache(capacity, _layout(1200))
    dirty = L2Cache(capacity, _layout(1200).with_foreign(capacity))
    dirty.fill_foreign()
    out_cold, out_dirty = cold.access(_reads(rows, store)), dirty.access(_reads(rows, store))
    assert (out_cold[:, :2] == out_dirty[:, :2]).all()
    own, foreign = dirty.traffic_since(np.zeros_like(dirty.stats))
    assert (own == cold.stats).all()
    np.testing.assert_array_equal(cold.dirty_bytes(), dirty.dirty_bytes())
    # The same stream through an OrderedDict LRU that starts with the foreign blocks.
    lru = OrderedDict((("f", i), (FOREIGN_BLOCK_BYTES, True)) for i in range(6))
    used, foreign_written = capacity, 0
    for r, s in zip(rows.tolist(), store.tolist(), strict=True):
        if r in lru:
            lru.move_to_end(r)
            lru[r] = (ROW, lru[r][1] or s)
            continue
        lru[r] = (ROW, s)
        used += ROW
        while used > capacity:
            key, (size, was_dirty) = lru.popitem(last=False)
            used -= size
            if isinstance(key, tuple) and was_dirty:
                foreign_written += size
    assert foreign == foreign_written == capacity  # the stream outgrows the cache


@pytest.mark.parametrize("mode", ["full", "aggregated"])
def test_a_dirty_start_costs_hbm_time_and_no_bytes_of_the_runs(mode):
    """Decode's split kernel streams K and V, far more than L2: it evicts all of the
    foreign data (the preset's L2 in whole blocks) and, HBM-bound, pays for writing it
    back; its own DRAM bytes are a cold start's, exactly."""
    problem = AttentionProblem(batch=4, heads=32, seq_q=1, seq_kv=4096, head_dim=128,
                               kv_heads=8)  # K and V: 64 MiB
    tiling = Tiling(16, 64, 2, 4, 8)
    cold = run(problem, tiling, "decode", H200, mode)
    dirty = run(problem, tiling, "decode", H200, mode, l2_start="dirty")
    foreign = H200.l2_bytes // FOREIGN_BLOCK_BYTES * FOREIGN_BLOCK_BYTES
    assert sum(r.foreign_writeback_bytes for r in dirty.runs) == foreign
    assert dirty.runs[0].foreign_writeback_bytes == foreign  # the split kernel's misses
    for a, b in zip(cold.runs, dirty.runs, strict=True):
        assert (a.tensor_bytes == b.tensor_bytes).all(), a.name
        assert (a.dirty_bytes == b.dirty_bytes).all()
    # What the write-backs cost: about their time alone at HBM's rate, which they share
    # with the kernel's own misses (the full engine's misses take HBM's capacity with
    # their latency inside, ``costs.miss_occupancy``, so the sum is not exact).
    alone = foreign / H200.hbm_effective_bytes_per_s
    assert dirty.time_s - cold.time_s == pytest.approx(alone, rel=0.1)


def test_a_compute_bound_kernel_hides_the_write_backs():
    """FA2's forward at d = 128 computes for milliseconds; writing 60 MiB back takes 14 us
    of HBM time that its loads leave free."""
    problem = AttentionProblem(batch=2, heads=16, seq_q=4096, head_dim=128)
    tiling = Tiling(128, 64, 3, 8)
    cold, dirty = (run(problem, tiling, "fa2", H200, l2_start=s) for s in ("cold", "dirty"))
    assert sum(r.foreign_writeback_bytes for r in dirty.runs) > 0
    assert dirty.time_s == pytest.approx(cold.time_s, rel=2e-3)


def test_the_prediction_reports_the_start_and_the_foreign_bytes_apart():
    problem = AttentionProblem(batch=1, heads=8, seq_q=1024, head_dim=64)
    cold, _ = predict(problem, Tiling(64, 64), "naive", H200)
    dirty, _ = predict(problem, Tiling(64, 64), "naive", H200, l2_start="dirty")
    assert (cold["l2_start"], dirty["l2_start"]) == ("cold", "dirty")
    assert cold["bytes"]["foreign_dram_write"] == 0
    assert dirty["bytes"]["foreign_dram_write"] == sum(
        k["bytes"]["foreign_dram_write"] for k in dirty["kernels"]) > 0
    for key in ("dram_read", "dram_write"):
        assert dirty["bytes"][key] == cold["bytes"][key]
    assert dirty["per_tensor"] == cold["per_tensor"]
    assert dirty["time_s"] >= cold["time_s"]
    with pytest.raises(ProblemError, match='"l2_start" must be one of cold, dirty'):
        run(problem, Tiling(64, 64), "naive", H200, l2_start="warm")


def _record(timing: dict) -> dict:
    return {"problem": AttentionProblem(1, 2, 128, 64).to_dict(),
            "tiling": Tiling(64, 64).to_dict(), "schedule": "fa2", "timing": timing}


def test_records_timed_by_do_bench_start_dirty():
    do_bench = {"method": "triton.testing.do_bench", "l2_flushed": True}
    assert l2_start_of(_record(do_bench)) == "dirty"
    assert l2_start_of(_record({**do_bench, "l2_flushed": False})) == "cold"
    assert l2_start_of(_record({"method": "cuda events", "l2_flushed": True})) == "cold"
    assert l2_start_of({"problem": {}}) == "cold"
    seen = []

    def spy(problem, tiling, schedule, hw, compiled=None, l2_start="cold"):
        seen.append(l2_start)
        return {}

    predict_record(spy, _record(do_bench), H200)
    predict_record(spy, _record({**do_bench, "l2_flushed": False}), H200)
    assert seen == ["dirty", "cold"]


@pytest.mark.parametrize("schedule, problem, tiling", [
    ("decode", AttentionProblem(batch=4, heads=32, seq_q=1, seq_kv=1024, head_dim=64,
                                kv_heads=8), Tiling(16, 64, 2, 4, 4)),
    ("fa2", AttentionProblem(batch=1, heads=4, seq_q=1024, head_dim=64, pass_="bwd"),
     Tiling(64, 64)),
])
def test_a_timed_call_is_the_cold_run_plus_what_its_first_kernel_pays(schedule, problem,
                                                                     tiling):
    """``predict_as_timed``: kernels and bytes as Nsight Compute sees them (cold), the
    call's time as ``do_bench`` does: plus the first kernel's dirty start, timed alone in
    the cold run's mode."""
    cold, cold_sim = predict(problem, tiling, schedule, H200)
    timed, _ = predict_as_timed(problem, tiling, schedule, H200, l2_start="dirty")
    first = run(problem, tiling, schedule, H200, cold_sim.mode, l2_start="dirty", kernels=1)
    assert len(first.runs) == 1 and first.runs[0].name == cold["kernels"][0]["name"]
    extra = first.runs[0].time_s - cold_sim.runs[0].time_s
    assert extra > 0
    assert timed["time_s"] == pytest.approx(cold["time_s"] + extra, rel=1e-12)
    assert timed["dirty_start"] == {"kernel": first.runs[0].name, "time_s": extra,
                                    "foreign_dram_write": first.runs[0].foreign_writeback_bytes}
    assert timed["bytes"]["foreign_dram_write"] == first.runs[0].foreign_writeback_bytes > 0
    assert [k["time_s"] for k in timed["kernels"]] == [k["time_s"] for k in cold["kernels"]]
    assert timed["bytes"]["dram_read"] == cold["bytes"]["dram_read"]
    same, _ = predict_as_timed(problem, tiling, schedule, H200)
    assert same["time_s"] == cold["time_s"] and "dirty_start" not in same
    with pytest.raises(ProblemError, match='"kernels" must be 1 to'):
        run(problem, tiling, schedule, H200, kernels=0)


def test_simulate_takes_the_start_from_the_command_line(capsys):
    argv = ["simulate", "--hardware", "h200-sxm", "--schedule", "decode", "--batch", "4",
            "--heads", "32", "--kv-heads", "8", "--seq", "1", "--kv-seq", "4096",
            "--head-dim", "128", "--block-m", "16", "--block-n", "64", "--split-kv", "4",
            "--json"]
    assert main(argv) == 0
    cold = json.loads(capsys.readouterr().out)
    assert main([*argv, "--l2-start", "dirty"]) == 0
    dirty = json.loads(capsys.readouterr().out)
    assert (cold["l2_start"], dirty["l2_start"]) == ("cold", "dirty")
    foreign = H200.l2_bytes // FOREIGN_BLOCK_BYTES * FOREIGN_BLOCK_BYTES
    assert dirty["bytes"]["foreign_dram_write"] == foreign  # K and V: 64 MiB
    assert dirty["time_s"] > cold["time_s"]
    assert main([*argv[:-1], "--l2-start", "dirty"]) == 0
    assert "L2 started dirty: 62.9 MB of another program's data" in " ".join(
        capsys.readouterr().out.split())


def test_a_kernel_that_rereads_what_an_earlier_one_stored_is_profiled_alone():
    """decode's reduce reads the partials the split has just stored: in the call L2 holds
    them (no DRAM read), while Nsight Compute invalidates L2 before each kernel, so under
    it every byte of them comes from DRAM: B x Hq x splits x (d + 1) fp32 (O's partial rows
    and their LSE). ``predict_as_timed(profiled=True)``, as reconciliation asks, gives the
    reduce those numbers apart (``profiled``, ``run(alone=...)``) and leaves the split,
    the first kernel, as it is."""
    from simulator.sim import carried_bytes

    problem = AttentionProblem(batch=4, heads=32, seq_q=1, seq_kv=1024, head_dim=64,
                               kv_heads=8)
    tiling = Tiling(16, 64, 2, 4, 4)  # split 4
    plain, _ = predict_as_timed(problem, tiling, "decode", H200)
    assert not any("profiled" in k for k in plain["kernels"])  # only when asked
    timed, sim = predict_as_timed(problem, tiling, "decode", H200, profiled=True)
    split, reduce = timed["kernels"]
    partials = 4 * 32 * 4 * (64 + 1) * 4
    assert "profiled" not in split and carried_bytes(sim, 0) == 0
    assert reduce["bytes"]["dram_read"] == 0
    assert carried_bytes(sim, 1) == partials
    alone = run(problem, tiling, "decode", H200, sim.mode, alone=1)
    assert [r.name for r in alone.runs] == ["decode_reduce"]
    (r,) = alone.runs
    assert r.dram_read == partials
    assert reduce["profiled"] == {"time_s": r.time_s, "dram_read": partials,
                                  "dram_write": r.dram_write, "left_dirty": r.left_dirty}
    assert reduce["profiled"]["time_s"] > reduce["time_s"]  # its loads now go to HBM
    json.dumps(timed)  # plain numbers
    with pytest.raises(ProblemError, match='"alone" must be 0 to 1'):
        run(problem, tiling, "decode", H200, alone=2)
    with pytest.raises(ProblemError, match="not both"):
        run(problem, tiling, "decode", H200, kernels=1, alone=1)
