"""The CPU race: equal outputs, exact allocation counts, naive >= N^2 * 8 bytes."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.explain.cpu_attention import (
    naive_attention,
    tile_buffer_bytes,
    tiled_attention,
    traced_peak_bytes,
    tracemalloc_sees_numba,
)
from simulator.explain.race import race, race_one
from traces.problem import ProblemError


def _reference(q, k, v):
    s = q @ k.T / np.sqrt(q.shape[1])
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v


@pytest.mark.parametrize(("seq", "head_dim", "tile"), [(128, 64, 64), (100, 16, 32), (37, 8, 5)])
def test_tiled_equals_reference(seq, head_dim, tile):
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((seq, head_dim)) for _ in range(3))
    out_tiled, out_naive = np.empty((seq, head_dim)), np.empty((seq, head_dim))
    tiled_attention(q, k, v, out_tiled, tile)
    naive_attention(q, k, v, out_naive)
    ref = _reference(q, k, v)
    assert np.abs(out_tiled - ref).max() <= 1e-10
    assert np.abs(out_naive - ref).max() <= 1e-10


def test_tile_buffer_accounting_literal():
    # s_tile 64x64 + acc 64x64 + m_i 64 + l_i 64, float64
    assert tile_buffer_bytes(64, 64) == 8 * (4096 + 4096 + 64 + 64) == 66_560


@pytest.fixture(scope="module")
def small_race():
    return race([128, 256], head_dim=64, tile=64, repeats=2, seed=0)


def test_race_outputs_equal(small_race):
    for row in small_race["rows"]:
        assert row["max_abs_diff"] <= 1e-10


def test_race_bytes(small_race):
    rows = {row["seq"]: row for row in small_race["rows"]}
    for seq, row in rows.items():
        assert row["naive_bytes"] >= seq * seq * 8
        assert row["score_matrix_bytes"] == seq * seq * 8
        # The tile buffers are at least what the accounting names, whichever method counts.
        assert row["tiled_bytes"] >= row["tiled_bytes_accounted"] == tile_buffer_bytes(64, 64)
    assert rows[256]["tiled_bytes"] < 256 * 256 * 8 / 4
    # The tiled footprint does not grow with N (a few bytes of Python-side noise allowed).
    assert abs(rows[256]["tiled_bytes"] - rows[128]["tiled_bytes"]) < 1024
    assert rows[256]["naive_bytes"] - rows[128]["naive_bytes"] >= (256**2 - 128**2) * 8


def test_numba_allocations_are_the_accounted_buffers(small_race):
    counts = {row["tiled_numba_allocations"] for row in small_race["rows"]}
    if counts == {None}:
        pytest.skip("this numba does not expose its runtime allocation statistics")
    assert counts == {small_race["rows"][0]["tiled_numba_allocations_accounted"]} == {8}


def test_tracemalloc_probe_agrees_with_the_race(small_race):
    for row in small_race["rows"]:
        assert row["tracemalloc_sees_numba"] == tracemalloc_sees_numba()
        if row["tracemalloc_sees_numba"]:
            # tracemalloc sees the buffers: accounting + small headers and argument wrappers.
            assert 0 <= row["tiled_bytes_tracemalloc"] - row["tiled_bytes_accounted"] < 4096


def test_traced_peak_counts_a_known_allocation():
    assert traced_peak_bytes(lambda: np.ones(1 << 16)) >= (1 << 16) * 8


def test_race_times_and_methods(small_race):
    assert small_race["repeats"] == 2
    for row in small_race["rows"]:
        assert len(row["naive_times_s"]) == len(row["tiled_times_s"]) == 2
        assert row["naive_time_s"] > 0 and row["tiled_time_s"] > 0
        assert row["flops"] == 4 * row["seq"] ** 2 * 64
    assert "warm-up" in small_race["methods"]["time"]
    assert any("no HBM/SRAM split" in note for note in small_race["notes"])


@pytest.mark.parametrize("kwargs", [
    {"seq": 0}, {"seq": 64, "tile": 128}, {"seq": 64, "repeats": 0}, {"seq": 64, "seed": -1},
    {"seq": 1 << 16},  # the naive matrix alone would need 32 GiB: refused before running
])
def test_bad_input(kwargs):
    with pytest.raises(ProblemError):
        race_one(**kwargs)


def test_plot_png(tmp_path, small_race):
    from simulator.explain.race import plot

    plot(small_race, tmp_path / "race.png")
    assert (tmp_path / "race.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
