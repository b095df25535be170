"""FlashAttention-1, Algorithm 1 of the paper, literally.

One CTA per (batch, head). O, l and m live in HBM: they are initialised there, then the
outer loop walks the K/V blocks (each loaded once) and the inner loop walks the Q blocks,
re-reading Q_i, O_i, l_i, m_i and writing O_i, l_i, m_i back at every inner step. This is
the loop order whose traffic Theorem 2 bounds; FA2 swaps the loops and keeps O on chip.

The loop here is flattened: iteration ``t`` is the ``t``-th (K/V block, Q block) pair, and
the K/V loads happen at the first pair of each K/V block.
"""

from __future__ import annotations

import numpy as np

from traces.problem import STATS_BYTES, AttentionProblem
from traces.schedules.base import (
    LOAD,
    STORE,
    Access,
    Compute,
    Kernel,
    Tensor,
    causal_first_row_block,
    cdiv,
    grid_coords,
    valid_extent,
)
from traces.schedules.fa2 import kv_plane
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

    def q_block(c):
        return c["bh"], pair_i[c["t"]], 0

    def kv_block(c):
        return kv_plane(p, c["bh"]), pair_j[c["t"]], 0

    def step(c):
        i, j = pair_i[c["t"]], pair_j[c["t"]]
        rows = valid_extent(i, bm, p.seq_q)
        cols = valid_extent(j, bn, p.seq_kv)
        # S = QK^T and PV; exps of scores and two rescales per row (old and new O);
        # scale/max/sub/sum per score, O rescale and update per output element.
        return 4 * rows * cols * d, rows * cols + 2 * rows, 4 * rows * cols + 3 * rows * d

    def opens(c):
        return opens_block[c["t"]]

    def kv_load(name):
        # K_j, V_j are loaded once per K/V block, at the first pair of the block.
        return Access(LOAD, name, bn, d, kv_block, when=opens)

    init = []
    for i in range(tr):
        def init_tile(c, i=i):
            return c["bh"], i, 0
        init += [Access(STORE, "o", bm, d, init_tile), Access(STORE, "l", bm, 1, init_tile),
                 Access(STORE, "m", bm, 1, init_tile)]

    streamed = 2 * bm * d * s + 2 * bm * STATS_BYTES
    return [Kernel(
        name="fa1_fwd",
        ctas=ctas,
        loop_count=np.full(p.batch * p.heads, n_pairs, dtype=np.int64),
        pre=init,
        loop=[kv_load("k"), kv_load("v"),
              Access(LOAD, "q", bm, d, q_block), Access(LOAD, "o", bm, d, q_block),
              Access(LOAD, "l", bm, 1, q_block), Access(LOAD, "m", bm, 1, q_block),
              Compute(step),
              Access(STORE, "o", bm, d, q_block), Access(STORE, "l", bm, 1, q_block),
              Access(STORE, "m", bm, 1, q_block)],
        post=[],
        sram_bytes=2 * bn * d * s + t.num_stages * streamed,
        tensors=tensors,
    )]
