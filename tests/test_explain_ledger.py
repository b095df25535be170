"""The online-softmax ledger: exact agreement, ledger invariants, and the no-rescale failure."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simulator.explain.ledger import SPIKE_ABOVE_MAX, demo_row, ledger, plot
from traces.problem import ProblemError

SHAPES = [(64, 16), (2, 1), (17, 16), (100, 7), (1024, 16), (4096, 64)]


@pytest.mark.parametrize(("seq", "tile"), SHAPES)
@pytest.mark.parametrize("seed", [0, 1, 7, 12345])
def test_agreement_and_silent_failure(seq, tile, seed):
    r = ledger(seq, tile, seed)
    s, v = np.array(r["scores"]), np.array(r["values"])
    # Reference computed here, independently of the module.
    p = np.exp(s - s.max())
    p /= p.sum()
    assert np.abs(np.array(r["online"]["weights"]) - p).max() <= 1e-12
    assert abs(r["online"]["output"] - p @ v) <= 1e-12
    assert r["agreement"]["ok"]
    assert r["agreement"]["weights_max_abs_diff"] <= 1e-12
    assert r["agreement"]["output_abs_diff"] <= 1e-12

    nr = r["no_rescale"]
    assert nr["weights_sum"] == pytest.approx(1.0, abs=1e-12)  # nothing looks wrong...
    assert nr["weights_rel_err"] > 0.01  # ...but the weights are
    assert nr["output_rel_err"] > 0.01  # ...and so is the output
    assert abs(nr["output"] - p @ v) / abs(p @ v) == pytest.approx(nr["output_rel_err"])


@pytest.mark.parametrize(("seq", "tile"), SHAPES)
def test_ledger_invariants(seq, tile):
    r = ledger(seq, tile, seed=3)
    s = np.array(r["scores"])
    tiles = r["tiles"]
    assert len(tiles) == r["n_tiles"] == math.ceil(seq / tile)
    assert [t["start"] for t in tiles] == list(range(0, seq, tile))
    assert tiles[-1]["stop"] == seq
    running_max = [t["m_new"] for t in tiles]
    assert all(b >= a for a, b in zip(running_max, running_max[1:], strict=False))
    for t in tiles:
        assert t["m_new"] == s[: t["stop"]].max()  # the prefix max, exactly
        assert t["tile_max"] == s[t["start"]: t["stop"]].max()
        if t["tile"] == 0:
            assert t["m_old"] is None and t["rescale"] is None
        else:
            assert t["rescale"] == pytest.approx(math.exp(t["m_old"] - t["m_new"]), rel=1e-15)
            assert 0.0 < t["rescale"] <= 1.0
        # The running sum is the sum of the prefix against the running max.
        prefix = s[: t["stop"]]
        assert t["running_sum"] == pytest.approx(np.exp(prefix - t["m_new"]).sum(), rel=1e-12)
    assert tiles[-1]["running_sum"] == pytest.approx(np.exp(s - s.max()).sum(), rel=1e-12)
    assert r["online"]["sum"] == pytest.approx(r["full"]["sum"], rel=1e-12)


@pytest.mark.parametrize("seed", range(20))
def test_demo_row_puts_a_clearly_larger_max_in_a_later_tile(seed):
    seq, tile = 64, 16
    s, v, spike = demo_row(seq, tile, seed)
    assert spike // tile >= 1
    others = np.delete(s, spike)
    assert s[spike] >= others.max() + SPIKE_ABOVE_MAX
    r = ledger(seq, tile, seed)
    spike_row = r["tiles"][spike // tile]
    assert spike_row["m_new"] - spike_row["m_old"] >= SPIKE_ABOVE_MAX - 1e-12
    assert spike_row["rescale"] <= math.exp(-SPIKE_ABOVE_MAX) * (1 + 1e-12)
    assert np.array_equal(s, demo_row(seq, tile, seed)[0])  # deterministic from the seed


def test_seeds_give_different_rows():
    assert not np.array_equal(demo_row(64, 16, 0)[0], demo_row(64, 16, 1)[0])


@pytest.mark.parametrize(("seq", "tile", "seed"), [
    (0, 16, 0), (64, 0, 0), (16, 32, 0), (16, 16, 0), (64, 16, -1), (64, 16, True),
])
def test_bad_input(seq, tile, seed):
    with pytest.raises(ProblemError):
        ledger(seq, tile, seed)


def test_plot_png(tmp_path):
    path = tmp_path / "ledger.png"
    plot(ledger(64, 16, 0), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_long_ledger_table_shows_where_the_max_moves():
    """Thousands of tiles: the table keeps the first and last tiles, the spike and every
    rescale, and says how many tiles each gap hides; short ledgers show every tile."""
    from simulator.explain.ledger import MAX_ROWS, shown_tiles

    result = ledger(seq=20000, tile=16, seed=1)
    rows = shown_tiles(result)
    index = [r["tile"] for r in rows]
    assert len(rows) <= MAX_ROWS < len(result["tiles"])
    assert index == sorted(index) and index[0] == 0 and index[-1] == len(result["tiles"]) - 1
    assert result["spike"]["tile"] in index
    moved = [r["tile"] for r in result["tiles"] if r["rescale"] is not None
             and r["rescale"] < 1.0]
    assert set(moved) <= set(index)
    short = ledger(seq=64, tile=16, seed=1)
    assert shown_tiles(short) == short["tiles"]
