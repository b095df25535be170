"""FlashAttention-1, Algorithm 1 of the paper, literally.

One CTA per (batch, head). O, l and m live in HBM: they are initialised there, then the
outer loop walks the K/V blocks (each loaded once) and the inner loop walks the Q blocks,
re-reading Q_i, O_i, l_i, m_i and writing O_i, l_i, m_i back at every inner step. This is
the loop order whose traffic Theorem 2 bounds; FA2 swaps the loops and keeps O on chip.

The loops here are flattened into one: iterations ``0..Tr-1`` initialise O, l, m block by
block, then iteration ``Tr + k`` is the ``k``-th (K/V block, Q block) pair; the K/V loads
happen at the first pair of each K/V block.
"""

from __future__ import annotations

import numpy as np

from traces.problem import STATS_BYTES, AttentionProblem
from traces.schedules.base import (
    LOAD,
    STORE,
    Access,
    Kernel,
    Tensor,
    causal_first_row_block,
    cdiv,
    grid_coords,
    tile_compute,
    valid_extent,
)
from traces.schedules.fa2 import kv_plane
from traces.schedules.mma_layout import Dot
from traces.tiling import Tiling


def forward_tensors(p: AttentionProblem) -> list[Tensor]:
    s = p.elem_bytes
    return [
        Tensor("q", p.batch * p.heads, p.seq_q, p.head_dim, s),
        Tensor("k", p.batch * p.kv_heads, p.seq_kv, p.head_dim, s),
        Tensor("v", p.batch * p.kv_heads, p.seq_kv, p.head_dim, s),
        Tensor("o", p.batch * p.heads, p.seq_q, p.head_dim, s),
        Tensor("l", p.batch * p.heads, p.seq_q, 1, STATS_BYTES),
        Tensor("m", p.batch * p.heads, p.seq_q, 1, STATS_BYTES),
    ]


def pair_table(p: AttentionProblem, t: Tiling) -> tuple[np.ndarray, np.ndarray]:
    """The (K/V block j, Q block i) pairs one CTA visits, in order."""
    tr, tc = cdiv(p.seq_q, t.block_m), cdiv(p.seq_kv, t.block_n)
    j = np.arange(tc, dtype=np.int64)
    first = (causal_first_row_block(j, t.block_m, t.block_n, p.seq_q, p.seq_kv)
             if p.causal else np.zeros(tc, dtype=np.int64))
    counts = tr - first
    pair_j = np.repeat(j, counts)
    start = np.zeros(tc, dtype=np.int64)
    np.cumsum(counts[:-1], out=start[1:])
    pair_i = first[pair_j] + np.arange(pair_j.size) - start[pair_j]
    return pair_j, pair_i


def forward(p: AttentionProblem, t: Tiling, tensors: dict[str, Tensor]) -> list[Kernel]:
    bm, bn, d, s = t.block_m, t.block_n, p.head_dim, p.elem_bytes
    tr = cdiv(p.seq_q, bm)
    pair_j, pair_i = pair_table(p, t)
    opens_block = np.ones(pair_j.size, dtype=bool)
    opens_block[1:] = pair_j[1:] != pair_j[:-1]
    ctas = grid_coords(("bh", p.batch * p.heads))
    n_pairs = pair_j.size

    # Iterations 0..Tr-1 initialise O = 0, l = 0, m = -inf block by block; the rest walk
    # the (K/V block, Q block) pairs.
    def init(c):
        return c["t"] < tr

    def pair(c):
        return c["t"] >= tr

    def pair_index(c):
        return np.maximum(c["t"] - tr, 0)

    def init_block(c):
        return c["bh"], np.minimum(c["t"], tr - 1), 0

    def q_block(c):
        return c["bh"], pair_i[pair_index(c)], 0

    def kv_block(c):
        return kv_plane(p, c["bh"]), pair_j[pair_index(c)], 0

    def opens(c):
        return pair(c) & opens_block[pair_index(c)]

    def pair_rows(c):
        return valid_extent(pair_i[pair_index(c)], bm, p.seq_q)

    def pair_cols(c):
        return valid_extent(pair_j[pair_index(c)], bn, p.seq_kv)

    def step(rows, cols):
        # S = QK^T and PV; exps of scores and two rescales per row (old and new O);
        # scale/max/sub/sum per score, O rescale and update per output element.
        return 4 * rows * cols * d, rows * cols + 2 * rows, 4 * rows * cols + 3 * rows * d

    loop = [Access(STORE, "o", bm, d, init_block, when=init),
            Access(STORE, "l", bm, 1, init_block, when=init),
            Access(STORE, "m", bm, 1, init_block, when=init),
            # K_j, V_j are loaded once per K/V block, at the first pair of the block.
            Access(LOAD, "k", bn, d, kv_block, when=opens),
            Access(LOAD, "v", bn, d, kv_block, when=opens)]
    loop += [Access(LOAD, name, bm, cols, q_block, when=pair)
             for name, cols in (("q", d), ("o", d), ("l", 1), ("m", 1))]
    loop += [tile_compute(step, pair_rows, pair_cols, bm, bn, when=pair)]
    loop += [Access(STORE, name, bm, cols, q_block, when=pair)
             for name, cols in (("o", d), ("l", 1), ("m", 1))]

    streamed = 2 * bm * d * s + 2 * bm * STATS_BYTES
    return [Kernel(
        name="fa1_fwd",
        ctas=ctas,
        loop_count=np.full(p.batch * p.heads, tr + n_pairs, dtype=np.int64),
        pre=[],
        loop=loop,
        post=[],
        sram_bytes=2 * bn * d * s + t.num_stages * streamed,
        tensors=tensors,
        mma_rows=bm,
        dots=(Dot(bm, bn, d, feeds_dot=True, row_reductions=2),  # S: its row max and sum
              Dot(bm, d, bn, a="result")),
    )]
