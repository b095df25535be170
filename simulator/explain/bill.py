"""The N^2 traffic bill: what the naive score matrix costs in bytes, against its FLOPs.

Per head, naive attention materialises the scores ``S = Q K^T`` (N x N) in global memory,
reads them back for the softmax, writes ``P = softmax(S)`` and reads ``P`` back for ``P V``:

- the S bill (S written and read back):           ``2 * N^2 * s`` bytes,
- the S+P total (S written, read; P written, read): ``4 * N^2 * s`` bytes,

with ``s`` bytes per element. The work is ``4 * N^2 * d`` FLOPs (forward: ``2 N^2 d`` for
``Q K^T`` and ``2 N^2 d`` for ``P V``), while Q, K, V and O cost ``4 * N * d * s`` bytes.

So the score bill per FLOP is a constant ``s / (2 d)``: what grows with N is the bill relative
to the unavoidable Q, K, V, O traffic (``N / (2 d)`` for the S bill) — the traffic a tiled
kernel keeps on chip instead. Everything here is closed form; nothing is simulated.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Group
from rich.table import Table
from rich.text import Text

from simulator.explain.common import fmt_bytes, fmt_flops, new_figure, save_figure
from traces.problem import AttentionProblem

SCHEMA = "tilesim.bill/1"


def bill_row(seq: int, head_dim: int, elem_bytes: int) -> dict:
    """The bill of one head at sequence length ``seq`` (query length = key length)."""
    s_bytes = 2 * seq * seq * elem_bytes  # S written + S read back
    sp_bytes = 4 * seq * seq * elem_bytes  # S written, read; P written, read
    flops = 4 * seq * seq * head_dim  # QK^T and PV, 2 FLOPs per multiply-add
    qkvo_bytes = 4 * seq * head_dim * elem_bytes  # Q, K, V read once, O written once
    return {
        "seq": seq,
        "s_bytes": s_bytes,
        "sp_bytes": sp_bytes,
        "flops": flops,
        "s_bytes_per_flop": s_bytes / flops,
        "sp_bytes_per_flop": sp_bytes / flops,
        "qkvo_bytes": qkvo_bytes,
        "s_over_qkvo": s_bytes / qkvo_bytes,
        "sp_over_qkvo": sp_bytes / qkvo_bytes,
        # FLOPs per byte if only Q, K, V, O move (tiled) vs also S and P (naive).
        "tiled_flop_per_byte": flops / qkvo_bytes,
        "naive_flop_per_byte": flops / (qkvo_bytes + sp_bytes),
    }


def bill(seqs: list[int], head_dim: int = 128, dtype: str = "fp16") -> dict:
    """The bill for every sequence length in ``seqs``, one head each.

    Inputs are validated as an ``AttentionProblem`` (batch 1, one head), so a bad head dim or
    dtype gives the same message as everywhere else in tilesim.
    """
    problems = [
        AttentionProblem(batch=1, heads=1, seq_q=seq, head_dim=head_dim, dtype=dtype)
        for seq in seqs
    ]
    elem_bytes = problems[0].elem_bytes if problems else 0
    return {
        "schema": SCHEMA,
        "head_dim": head_dim,
        "dtype": dtype,
        "elem_bytes": elem_bytes,
        "formulas": {
            "s_bytes": "2*N^2*s  (S written, S read back)",
            "sp_bytes": "4*N^2*s  (S written, read; P written, read)",
            "flops": "4*N^2*d  (forward, per head)",
            "qkvo_bytes": "4*N*d*s  (Q, K, V read; O written)",
        },
        "rows": [bill_row(p.seq_q, head_dim, elem_bytes) for p in problems],
    }


def render(result: dict) -> Group:
    """A table, one row per N, and the two sentences that explain it."""
    table = Table(
        title=f"N² traffic bill per head — d={result['head_dim']}, {result['dtype']} "
        f"({result['elem_bytes']} B/element)",
    )
    for name in ("N", "S bill 2·N²·s", "S+P total 4·N²·s", "FLOPs 4·N²·d",
                 "S B/FLOP", "S+P B/FLOP", "Q,K,V,O 4·N·d·s", "S bill / QKVO"):
        table.add_column(name, justify="right")
    for row in result["rows"]:
        table.add_row(
            f"{row['seq']:,}", fmt_bytes(row["s_bytes"]), fmt_bytes(row["sp_bytes"]),
            fmt_flops(row["flops"]), f"{row['s_bytes_per_flop']:.4f}",
            f"{row['sp_bytes_per_flop']:.4f}", fmt_bytes(row["qkvo_bytes"]),
            f"{row['s_over_qkvo']:.1f}x",
        )
    d, s = result["head_dim"], result["elem_bytes"]
    notes = Text(
        f"Bytes per FLOP of the score matrix stay at s/(2d) = {s}/{2 * d} for every N: both "
        "grow as N². What grows with N is the bill against the Q, K, V, O traffic "
        f"(N/(2d) = N/{2 * d} for S alone) — bytes a tiled kernel never sends to HBM.",
        style="dim",
    )
    return Group(table, notes)


def plot(result: dict, path: str | Path) -> None:
    """Log-log curves over N: bytes (S, S+P, Q/K/V/O) and FLOPs; and the two ratios."""
    import numpy as np

    rows = sorted(result["rows"], key=lambda r: r["seq"])
    seqs = np.array([r["seq"] for r in rows], dtype=np.float64)
    lo, hi = (seqs.min() / 2, seqs.max() * 2) if len(seqs) else (64.0, 65536.0)
    n = np.geomspace(lo, hi, 200)
    d, s = result["head_dim"], result["elem_bytes"]

    fig = new_figure(11, 4.5)
    left, right = fig.subplots(1, 2)
    curves = [
        ("S bill 2·N²·s (bytes)", 2 * n * n * s, "s_bytes", "C3"),
        ("S+P total 4·N²·s (bytes)", 4 * n * n * s, "sp_bytes", "C1"),
        ("Q,K,V,O 4·N·d·s (bytes)", 4 * n * d * s, "qkvo_bytes", "C0"),
        ("FLOPs 4·N²·d", 4 * n * n * d, "flops", "C2"),
    ]
    for label, values, key, color in curves:
        style = "--" if key == "flops" else "-"
        left.loglog(n, values, style, color=color, label=label)
        left.loglog(seqs, [r[key] for r in rows], "o", color=color)
    left.set_xlabel("sequence length N")
    left.set_ylabel("bytes / FLOPs per head")
    left.set_title(f"per head, d={d}, {result['dtype']}")
    left.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=8)

    right.loglog(n, np.full_like(n, s / (2 * d)), color="C3", label="S bill / FLOP = s/(2d)")
    right.loglog(n, n / (2 * d), color="C0", label="S bill / QKVO = N/(2d)")
    right.loglog(seqs, [r["s_bytes_per_flop"] for r in rows], "o", color="C3")
    right.loglog(seqs, [r["s_over_qkvo"] for r in rows], "o", color="C0")
    right.set_xlabel("sequence length N")
    right.set_ylabel("ratio")
    right.set_title("flat per FLOP, growing against Q,K,V,O")
    right.grid(True, which="both", alpha=0.3)
    right.legend(fontsize=8)
    save_figure(fig, path)
