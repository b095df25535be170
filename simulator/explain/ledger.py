"""The online-softmax ledger: one score row streamed tile by tile, every number on the books.

A tiled attention kernel never sees a whole row of scores ``s`` at once. It keeps, per row, a
running max ``m``, a running sum ``l = sum(exp(s_j - m))`` and a running output accumulator
``acc = sum(exp(s_j - m) * v_j)``. When a tile brings a larger max ``m_new``, everything
summed so far was measured against the old max and is multiplied by the rescale factor
``exp(m_old - m_new)`` (Milakov & Gimelshein 2018; FlashAttention). At the end
``o = acc / l`` equals ``softmax(s) . v`` exactly up to float64 rounding.

Beside it runs the streamer that skips the rescale: it tracks the max too, but leaves old
terms measured against the old max. Its weights still sum to one, so nothing looks wrong —
yet every tile before a larger max is overweighted by ``exp(m_new - m_old)``. The demo row is
built from the seed so that a later tile holds a clearly larger max, which makes that silent
failure visible (error far above 1%).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text

from simulator.explain.common import check_positive, check_seed, new_figure, save_figure
from traces.problem import ProblemError

SCHEMA = "tilesim.ledger/1"
AGREEMENT_TOLERANCE = 1e-12
# The spike sits this far above every earlier score: without the rescale, the tiles before it
# come out e^4 ~ 55x overweighted.
SPIKE_ABOVE_MAX = 4.0
SPIKE_VALUE = 2.0  # outside the [-1, 1] of the other values: the output cannot hide the failure


def demo_row(seq: int, tile: int, seed: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Scores ``s`` and values ``v`` of one row, and the index of the spike.

    ``s`` is standard normal and ``v`` uniform in [-1, 1], drawn from ``seed``; then one
    position in a tile of the second half (never the first tile) is raised to
    ``max(s) + SPIKE_ABOVE_MAX`` and given the value ``SPIKE_VALUE``.
    """
    rng = np.random.default_rng(seed)
    scores = rng.standard_normal(seq)  # s: [N]
    values = rng.uniform(-1.0, 1.0, seq)  # v: [N]
    n_tiles = math.ceil(seq / tile)
    spike_tile = int(rng.integers(max(1, n_tiles // 2), n_tiles))
    start, stop = spike_tile * tile, min((spike_tile + 1) * tile, seq)
    spike = int(rng.integers(start, stop))
    scores[spike] = scores.max() + SPIKE_ABOVE_MAX
    values[spike] = SPIKE_VALUE
    return scores, values, spike


# The ledger keeps every column's score and three weights as Python numbers (its JSON
# prints them): about 160 bytes a column, 160 MB and a few seconds at this length.
MAX_SEQ = 1_000_000


def _check_inputs(seq: int, tile: int, seed: int) -> None:
    check_positive(seq, "seq")
    check_positive(tile, "tile")
    check_seed(seed)
    if seq > MAX_SEQ:
        raise ProblemError(f'"seq" {seq} is too long for the ledger, which keeps every '
                           f"column's weights: at most {MAX_SEQ:,} (one score row; the "
                           "rescale works alike at any length).")
    if tile > seq:
        raise ProblemError(f'"tile" ({tile}) must be smaller than "seq" ({seq}): pass a '
                           f"smaller --tile (at most {seq // 2}, two tiles).")
    if tile == seq:
        raise ProblemError(
            f'"tile" ({tile}) must be smaller than "seq" ({seq}): the ledger needs at least '
            "two tiles so that a later tile can bring a larger max; pass a smaller --tile "
            f"(at most {seq // 2})."
        )


def ledger(seq: int = 64, tile: int = 16, seed: int = 0) -> dict:
    """Stream the demo row through the online softmax and the no-rescale streamer.

    Raises ``AssertionError`` if the online result disagrees with the full softmax by more
    than ``AGREEMENT_TOLERANCE`` (it cannot, in float64, unless the algorithm is broken).
    """
    _check_inputs(seq, tile, seed)
    scores, values, spike = demo_row(seq, tile, seed)

    # The reference: the whole row at once.
    full_max = float(scores.max())
    full_exp = np.exp(scores - full_max)
    full_sum = float(full_exp.sum())
    full_weights = full_exp / full_sum
    full_output = float(full_weights @ values)

    m = -math.inf  # online: running max, sum, output accumulator
    l = 0.0
    acc = 0.0
    m_nr = -math.inf  # no-rescale streamer: same max tracking, old terms never rescaled
    l_nr = 0.0
    acc_nr = 0.0
    numer_nr = np.empty(seq)  # exp(s_j - m at the time j was streamed)
    tiles = []
    for t, start in enumerate(range(0, seq, tile)):
        stop = min(start + tile, seq)
        s_blk, v_blk = scores[start:stop], values[start:stop]
        tile_max = float(s_blk.max())

        m_new = max(m, tile_max)
        rescale = math.exp(m - m_new)  # exp(-inf) = 0 on the first tile: nothing to rescale
        p_blk = np.exp(s_blk - m_new)
        l = l * rescale + float(p_blk.sum())
        acc = acc * rescale + float(p_blk @ v_blk)

        m_nr = max(m_nr, tile_max)
        e_blk = np.exp(s_blk - m_nr)
        numer_nr[start:stop] = e_blk
        l_nr += float(e_blk.sum())
        acc_nr += float(e_blk @ v_blk)

        tiles.append({
            "tile": t, "start": start, "stop": stop, "tile_max": tile_max,
            "m_old": None if t == 0 else m, "m_new": m_new,
            "rescale": None if t == 0 else rescale,
            "running_sum": l, "running_output": acc / l,
            "no_rescale_sum": l_nr, "no_rescale_output": acc_nr / l_nr,
        })
        m = m_new

    online_weights = np.exp(scores - m) / l
    online_output = acc / l
    weights_diff = float(np.abs(online_weights - full_weights).max())
    output_diff = abs(online_output - full_output)
    ok = weights_diff <= AGREEMENT_TOLERANCE and output_diff <= AGREEMENT_TOLERANCE
    if not ok:
        raise AssertionError(
            f"online softmax disagrees with the full softmax: weights {weights_diff:.3e}, "
            f"output {output_diff:.3e} (tolerance {AGREEMENT_TOLERANCE:.0e})"
        )

    nr_weights = numer_nr / l_nr
    nr_output = acc_nr / l_nr
    return {
        "schema": SCHEMA,
        "seq": seq, "tile": tile, "seed": seed, "n_tiles": len(tiles),
        "spike": {"index": spike, "tile": spike // tile, "above_prior_max": SPIKE_ABOVE_MAX,
                  "value": SPIKE_VALUE},
        "scores": scores.tolist(),
        "values": values.tolist(),
        "tiles": tiles,
        "full": {"max": full_max, "sum": full_sum, "output": full_output,
                 "weights": full_weights.tolist()},
        "online": {"max": m, "sum": l, "output": online_output,
                   "weights": online_weights.tolist()},
        "agreement": {"weights_max_abs_diff": weights_diff, "output_abs_diff": output_diff,
                      "tolerance": AGREEMENT_TOLERANCE, "ok": ok},
        "no_rescale": {
            "sum": l_nr, "output": nr_output, "weights": nr_weights.tolist(),
            "weights_sum": float(nr_weights.sum()),
            # L1 error relative to the L1 norm of the true weights (which is 1).
            "weights_rel_err": float(np.abs(nr_weights - full_weights).sum()
                                     / np.abs(full_weights).sum()),
            "output_rel_err": abs(nr_output - full_output) / abs(full_output),
        },
    }


MAX_ROWS = 48  # a longer ledger shows the tiles where something happens


def shown_tiles(result: dict) -> list[dict]:
    """The ledger rows a table shows: all of them up to ``MAX_ROWS``; beyond, the first and
    last tiles, the spike's and those that moved the running max (the rescales)."""
    tiles = result["tiles"]
    if len(tiles) <= MAX_ROWS:
        return tiles
    ends = MAX_ROWS // 4
    keep = set(range(ends)) | set(range(len(tiles) - ends, len(tiles)))
    keep.add(result["spike"]["tile"])
    moved = [i for i, row in enumerate(tiles) if row["rescale"] is not None
             and row["rescale"] < 1.0 and i not in keep]
    keep.update(moved[: MAX_ROWS - len(keep)])
    return [tiles[i] for i in sorted(keep)]


def render(result: dict) -> Group:
    """The per-tile ledger, the summary against the full softmax, and what it means."""
    ledger_table = Table(
        title=f"Online-softmax ledger — N={result['seq']}, tile={result['tile']}, "
        f"seed={result['seed']} (spike at column {result['spike']['index']})",
    )
    for name in ("tile", "columns", "tile max", "m_old → m_new", "rescale exp(m_old−m_new)",
                 "running sum l", "running o", "no-rescale l", "no-rescale o"):
        ledger_table.add_column(name, justify="right")
    rows = shown_tiles(result)
    for row, hidden in zip(rows, [*(b["tile"] - a["tile"] - 1 for a, b in
                                    zip(rows, rows[1:], strict=False)), 0], strict=True):
        moved = row["rescale"] is not None and row["rescale"] < 1.0
        ledger_table.add_row(
            str(row["tile"]), f"{row['start']}..{row['stop'] - 1}", f"{row['tile_max']:.4f}",
            "—" if row["m_old"] is None else f"{row['m_old']:.4f} → {row['m_new']:.4f}",
            "— (first tile)" if row["rescale"] is None else f"{row['rescale']:.6g}",
            f"{row['running_sum']:.6f}", f"{row['running_output']:+.6f}",
            f"{row['no_rescale_sum']:.6f}", f"{row['no_rescale_output']:+.6f}",
            style="bold yellow" if row["tile"] == result["spike"]["tile"] else
            ("yellow" if moved else None),
        )
        if hidden:
            ledger_table.add_row("…", f"{hidden} tiles", *[""] * 7, style="dim")
    if len(rows) < len(result["tiles"]):
        ledger_table.caption = (f"{len(rows)} of {len(result['tiles'])} tiles shown: the "
                                "first and last, and every tile that moved the running max; "
                                "--json has them all")

    full, online, nr, agree = (result[k] for k in ("full", "online", "no_rescale", "agreement"))
    summary = Table(title="Against the full softmax (float64)")
    for name in ("", "max", "sum exp(s − max)", "o = softmax(s)·v", "error"):
        summary.add_column(name, justify="right")
    summary.add_row("full softmax", f"{full['max']:.6f}", f"{full['sum']:.12f}",
                    f"{full['output']:+.12f}", "reference")
    summary.add_row(
        "online (rescaled)", f"{online['max']:.6f}", f"{online['sum']:.12f}",
        f"{online['output']:+.12f}",
        f"max |Δp| {agree['weights_max_abs_diff']:.1e}, |Δo| {agree['output_abs_diff']:.1e} "
        f"(≤ {agree['tolerance']:.0e} {'✓' if agree['ok'] else '✗'})",
        style="green",
    )
    summary.add_row(
        "no rescale", f"{online['max']:.6f}", f"{nr['sum']:.12f}", f"{nr['output']:+.12f}",
        f"weights {100 * nr['weights_rel_err']:.1f}% (L1), output "
        f"{100 * nr['output_rel_err']:.1f}%",
        style="red",
    )
    notes = Text(
        "Without the rescale the weights still sum to "
        f"{nr['weights_sum']:.12f}: nothing looks wrong, but every tile before the spike is "
        f"overweighted by exp(m_new − m_old) ≥ e^{result['spike']['above_prior_max']:g}. "
        "The rescale factor is what keeps the books straight.",
        style="dim",
    )
    return Group(ledger_table, summary, notes)


def plot(result: dict, path: str | Path) -> None:
    """Top: the row, tile edges and the running max. Bottom: weights, exact vs no-rescale."""
    seq, tile = result["seq"], result["tile"]
    cols = np.arange(seq)
    fig = new_figure(10, 6.5)
    top, bottom = fig.subplots(2, 1, sharex=True)

    top.bar(cols, result["scores"], width=0.8, color="0.7", label="scores s")
    edges = [row["start"] for row in result["tiles"]] + [seq]
    running_max = [row["m_new"] for row in result["tiles"]]
    top.stairs(running_max, np.array(edges) - 0.5, baseline=None, color="C0", linewidth=2,
               label="running max m")
    for row in result["tiles"]:
        top.axvline(row["start"] - 0.5, color="0.5", linewidth=0.6, linestyle=":")
        if row["rescale"] is not None:
            top.annotate(f"×{row['rescale']:.3g}", ((row["start"] + row["stop"] - 1) / 2,
                         row["m_new"]), xytext=(0, 4), textcoords="offset points",
                         ha="center", fontsize=7, color="C0")
    low, high = min(result["scores"]), max(result["scores"])
    top.set_ylim(min(low, 0.0) - 0.05 * (high - low), high + 0.15 * (high - low))
    top.set_ylabel("score")
    top.set_title(f"online softmax, N={seq}, tile={tile}: running max and rescale "
                  "exp(m_old − m_new) per tile")
    top.legend(fontsize=8, loc="upper left")

    agree, nr = result["agreement"], result["no_rescale"]
    bottom.bar(cols, result["full"]["weights"], width=0.8, color="0.7",
               label="full softmax")
    bottom.plot(cols, result["online"]["weights"], "o", markersize=3, color="C2",
                label=f"online, max |Δ| {agree['weights_max_abs_diff']:.1e}")
    bottom.plot(cols, nr["weights"], "x", markersize=4, color="C3",
                label=f"no rescale, error {100 * nr['weights_rel_err']:.0f}% (L1)")
    bottom.set_yscale("log")
    bottom.set_xlabel("column j")
    bottom.set_ylabel("weight p_j")
    bottom.set_title(f"o = softmax(s)·v: exact {result['full']['output']:+.4f}, "
                     f"no rescale {nr['output']:+.4f}")
    bottom.legend(fontsize=8, loc="upper left")
    save_figure(fig, path)
