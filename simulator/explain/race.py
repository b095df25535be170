"""A real CPU race: naive attention holding N x N against tiled online softmax (numba).

For every N, both attentions run on the same float64 ``q, k, v [N, d]`` (standard normal,
drawn from the seed):

1. one warm-up call each (numba compiles, or loads its cache, here; BLAS threads start) —
   excluded from the times — and the outputs are checked equal to ``TOLERANCE``;
2. ``repeats`` timed calls each, alternating, without any memory tracing; the median is kept;
3. one more call each to count the bytes it allocates, with ``tracemalloc`` (peak over the
   call, above what was live before). numpy reports its buffers to tracemalloc. The numba
   kernel allocates through numba's runtime, which tracemalloc sees only when numba allocates
   with ``PyMem_RawMalloc`` (recent numba does); that is probed, not assumed. The tile
   buffers are also counted by explicit accounting (``tile_buffer_bytes``): it is the tiled
   number where tracemalloc is blind to numba, and a cross-check (traced >= accounted, plus a
   few hundred bytes of headers) where it is not. The count of allocations numba's runtime
   reports for the call is recorded too: constant in N, buffers plus one header per array
   argument.

What this does not show: a CPU has no HBM/SRAM split under program control. Caches are
managed by hardware, so the race measures memory footprint and arithmetic, not HBM traffic.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text

from simulator.explain.common import check_positive, check_seed, fmt_bytes, new_figure, save_figure
from simulator.explain.cpu_attention import (
    FLOAT64_BYTES,
    TILED_ARRAY_ARGS,
    TILED_BUFFERS,
    naive_attention,
    numba_allocations,
    tile_buffer_bytes,
    tiled_attention,
    traced_peak_bytes,
    tracemalloc_sees_numba,
)
from traces.problem import ProblemError

SCHEMA = "tilesim.race/1"
TOLERANCE = 1e-10
MAX_NAIVE_BYTES = 4 * 1024**3  # refuse N whose score matrix alone would need more than 4 GiB


def methods(numba_traced: bool) -> dict:
    """How each reported number is obtained, in words (part of the JSON)."""
    tiled = (
        "tracemalloc peak over one call; it includes the numba kernel's buffers because numba's "
        "runtime allocates with PyMem_RawMalloc (probed); explicit accounting of the tile "
        "buffers is reported beside it as a cross-check"
        if numba_traced else
        "tracemalloc peak over one call (Python side) + the numba kernel's tile buffers by "
        "explicit accounting (tracemalloc does not see this numba's allocations; probed)"
    )
    return {
        "time": "median wall time of the timed calls (time.perf_counter), after one warm-up "
                "call per function, so numba compilation is excluded; no tracing while timed",
        "naive_bytes": "tracemalloc peak over one call (numpy buffers are traced)",
        "tiled_bytes": tiled,
        "max_abs_diff": "max |O_naive - O_tiled| over all elements, float64",
    }


NOTES = [
    "A CPU has no HBM/SRAM split under program control: caches are managed by hardware, so "
    "this race shows memory footprint and arithmetic, not HBM traffic.",
    "The naive side runs numpy's BLAS (possibly multi-threaded); the tiled numba kernel is "
    "plain single-threaded loops.",
    "Both write into a preallocated output: bytes are the working memory of each call.",
]


def _check_inputs(seqs: list[int], head_dim: int, tile: int, repeats: int, seed: int) -> None:
    if not seqs:
        raise ProblemError('"seq" must list at least one sequence length.')
    for seq in seqs:
        check_positive(seq, "seq")
    check_positive(head_dim, "head_dim")
    check_positive(tile, "tile")
    check_positive(repeats, "repeats")
    check_seed(seed)
    for seq in seqs:
        if tile > seq:
            raise ProblemError(f'"tile" ({tile}) must not exceed "seq" ({seq}): pass a '
                               f"smaller --tile (at most {min(seqs)}).")
        if seq * seq * FLOAT64_BYTES > MAX_NAIVE_BYTES:
            raise ProblemError(
                f'"seq" {seq} is too large for the race: the naive N x N float64 matrix alone '
                f"would need {fmt_bytes(seq * seq * FLOAT64_BYTES)} "
                f"(limit {fmt_bytes(MAX_NAIVE_BYTES)})."
            )


def race_one(seq: int, head_dim: int = 64, tile: int = 64, repeats: int = 3,
             seed: int = 0) -> dict:
    """Race both attentions at one N; see the module docstring for what is measured how."""
    _check_inputs([seq], head_dim, tile, repeats, seed)
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((seq, head_dim)) for _ in range(3))  # [N, d] each
    out_naive = np.empty((seq, head_dim))
    out_tiled = np.empty((seq, head_dim))
    run_naive = lambda: naive_attention(q, k, v, out_naive)
    run_tiled = lambda: tiled_attention(q, k, v, out_tiled, tile)

    run_naive()  # warm-up, and the outputs to compare
    run_tiled()
    max_abs_diff = float(np.abs(out_naive - out_tiled).max())
    if not max_abs_diff <= TOLERANCE:
        raise AssertionError(
            f"tiled attention differs from naive by {max_abs_diff:.3e} at N={seq} "
            f"(tolerance {TOLERANCE:.0e})"
        )

    naive_times, tiled_times = [], []
    for _ in range(repeats):
        for call, times in ((run_naive, naive_times), (run_tiled, tiled_times)):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)

    naive_bytes = traced_peak_bytes(run_naive)
    tiled_traced = traced_peak_bytes(run_tiled)
    tiled_accounted = tile_buffer_bytes(tile, head_dim)
    numba_traced = tracemalloc_sees_numba()
    flops = 4 * seq * seq * head_dim
    naive_s, tiled_s = statistics.median(naive_times), statistics.median(tiled_times)
    return {
        "seq": seq,
        "flops": flops,
        "naive_time_s": naive_s,
        "tiled_time_s": tiled_s,
        "naive_times_s": naive_times,
        "tiled_times_s": tiled_times,
        "naive_flop_per_s": flops / naive_s,
        "tiled_flop_per_s": flops / tiled_s,
        "score_matrix_bytes": seq * seq * FLOAT64_BYTES,
        "naive_bytes": naive_bytes,
        "tiled_bytes": tiled_traced if numba_traced else tiled_traced + tiled_accounted,
        "tiled_bytes_tracemalloc": tiled_traced,
        "tiled_bytes_accounted": tiled_accounted,
        "tracemalloc_sees_numba": numba_traced,
        "tiled_numba_allocations": numba_allocations(run_tiled),
        "tiled_numba_allocations_accounted": TILED_BUFFERS + TILED_ARRAY_ARGS,
        "max_abs_diff": max_abs_diff,
    }


def race(seqs: list[int], head_dim: int = 64, tile: int = 64, repeats: int = 3,
         seed: int = 0, progress: Callable[[int], None] | None = None) -> dict:
    """Race at every N in ``seqs`` (all inputs checked before the first, possibly long, run).

    ``progress(seq)``, if given, is called before each N starts.
    """
    _check_inputs(seqs, head_dim, tile, repeats, seed)
    rows = []
    for seq in seqs:
        if progress is not None:
            progress(seq)
        rows.append(race_one(seq, head_dim, tile, repeats, seed))
    return {
        "schema": SCHEMA,
        "head_dim": head_dim, "tile": tile, "repeats": repeats, "seed": seed,
        "dtype": "fp64", "tolerance": TOLERANCE,
        "methods": methods(tracemalloc_sees_numba()),
        "notes": NOTES,
        "rows": rows,
    }


def _fmt_time(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.3f} s"


def render(result: dict) -> Group:
    """One row per N: times with GFLOP/s beside them, bytes with their method, the difference."""
    table = Table(
        title=f"CPU race — d={result['head_dim']}, tile={result['tile']}, float64, "
        f"median of {result['repeats']} after a warm-up call (numba compile excluded)",
    )
    for name in ("N", "naive time", "tiled time", "naive GFLOP/s", "tiled GFLOP/s",
                 "naive bytes¹", "tiled bytes²", "N²·8", "max |Δ|"):
        table.add_column(name, justify="right")
    for row in result["rows"]:
        table.add_row(
            f"{row['seq']:,}", _fmt_time(row["naive_time_s"]), _fmt_time(row["tiled_time_s"]),
            f"{row['naive_flop_per_s'] / 1e9:.2f}", f"{row['tiled_flop_per_s'] / 1e9:.2f}",
            fmt_bytes(row["naive_bytes"]), fmt_bytes(row["tiled_bytes"]),
            fmt_bytes(row["score_matrix_bytes"]),
            f"{row['max_abs_diff']:.1e}" + (" ✓" if row["max_abs_diff"] <= result["tolerance"]
                                           else " ✗"),
        )
    methods = result["methods"]
    lines = [f"¹ {methods['naive_bytes']}.", f"² {methods['tiled_bytes']}."]
    rows = result["rows"]
    if rows:
        seen = sorted({str(r["tiled_numba_allocations"]) for r in rows})
        lines.append(
            f"  tile buffers by explicit accounting: {fmt_bytes(rows[0]['tiled_bytes_accounted'])}"
            f" ({TILED_BUFFERS} arrays); numba's runtime reported {' / '.join(seen)} "
            f"allocations per tiled call (expected {rows[0]['tiled_numba_allocations_accounted']}"
            f": {TILED_BUFFERS} buffers + {TILED_ARRAY_ARGS} array-argument headers)"
            + (", the same at every N." if len(seen) == 1 else ".")
        )
    lines += result["notes"]
    return Group(table, Text("\n".join(lines), style="dim"))


def plot(result: dict, path: str | Path) -> None:
    """Log-log over N: wall time, and bytes allocated against the N²·8 of the score matrix."""
    from matplotlib.ticker import NullFormatter

    rows = sorted(result["rows"], key=lambda r: r["seq"])
    seqs = np.array([r["seq"] for r in rows], dtype=np.float64)
    fig = new_figure(11, 4.5)
    left, right = fig.subplots(1, 2)

    left.loglog(seqs, [r["naive_time_s"] for r in rows], "o-", color="C3",
                label="naive (numpy, N×N)")
    left.loglog(seqs, [r["tiled_time_s"] for r in rows], "s-", color="C0",
                label=f"tiled online softmax (numba, tile {result['tile']})")
    left.set_xlabel("sequence length N")
    left.set_ylabel("wall time, s (median, warm)")
    left.set_title(f"time, d={result['head_dim']}, float64")
    left.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=8)

    right.loglog(seqs, seqs * seqs * FLOAT64_BYTES, "--", color="0.5", label="N²·8 (one N×N)")
    right.loglog(seqs, [r["naive_bytes"] for r in rows], "o-", color="C3",
                 label="naive: tracemalloc peak")
    right.loglog(seqs, [r["tiled_bytes"] for r in rows], "s-", color="C0",
                 label="tiled online softmax (one tile at a time)")
    right.set_xlabel("sequence length N")
    right.set_ylabel("bytes allocated per call")
    right.set_title("memory footprint (a CPU has no HBM/SRAM split)")
    right.grid(True, which="both", alpha=0.3)
    right.legend(fontsize=8)
    for ax in (left, right):  # label the measured N only: log minor labels collide
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(seqs, labels=[f"{int(n):,}" for n in seqs])
    save_figure(fig, path)
