"""FlashAttention-2: forward (one CTA per Q block) and backward (Triton tutorial style).

Forward: each CTA loads its Q block once, streams every K/V block it needs (causal: skips
fully masked blocks), keeps the running max/sum and the output accumulator on chip, and
writes O and LSE once. Backward: a preprocess kernel computes D = rowsum(dO∘O); a dK/dV
kernel per K/V block loops over Q blocks (recomputing P from LSE); a dQ kernel per Q block
loops over K/V blocks. See docs/schedules.md for the exact definition.
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
    causal_last_block,
    cdiv,
    grid_coords,
    kv_blocks_unmasked,
    q_blocks_unmasked,
    tile_compute,
    valid_extent,
)
from traces.schedules.mma_layout import Dot
from traces.tiling import Tiling


def forward_tensors(p: AttentionProblem) -> list[Tensor]:
    s = p.elem_bytes
    return [
        Tensor("q", p.batch * p.heads, p.seq_q, p.head_dim, s),
        Tensor("k", p.batch * p.kv_heads, p.seq_kv, p.head_dim, s),
        Tensor("v", p.batch * p.kv_heads, p.seq_kv, p.head_dim, s),
        Tensor("o", p.batch * p.heads, p.seq_q, p.head_dim, s),
        Tensor("lse", p.batch * p.heads, p.seq_q, 1, STATS_BYTES),
    ]


def backward_tensors(p: AttentionProblem) -> list[Tensor]:
    s = p.elem_bytes
    return [
        Tensor("do", p.batch * p.heads, p.seq_q, p.head_dim, s),
        Tensor("dq", p.batch * p.heads, p.seq_q, p.head_dim, s),
        Tensor("dk", p.batch * p.kv_heads, p.seq_kv, p.head_dim, s),
        Tensor("dv", p.batch * p.kv_heads, p.seq_kv, p.head_dim, s),
        Tensor("delta", p.batch * p.heads, p.seq_q, 1, STATS_BYTES),
    ]


def kv_plane(p: AttentionProblem, bh: np.ndarray) -> np.ndarray:
    """K/V plane (batch*kv_heads index) of a Q plane (batch*heads index)."""
    b, h = np.divmod(bh, p.heads)
    return b * p.kv_heads + h // p.group_size


def forward(p: AttentionProblem, t: Tiling, tensors: dict[str, Tensor]) -> Kernel:
    bm, bn, d, s = t.block_m, t.block_n, p.head_dim, p.elem_bytes
    tr, tc = cdiv(p.seq_q, bm), cdiv(p.seq_kv, bn)
    ctas = grid_coords(("i", tr), ("bh", p.batch * p.heads))
    if p.causal:
        count = causal_last_block(ctas["i"], bm, bn, p.seq_q, p.seq_kv)
    else:
        count = np.full(ctas["i"].shape, tc, dtype=np.int64)

    def q_tile(c):
        return c["bh"], c["i"], 0

    def kv_tile(c):
        return kv_plane(p, c["bh"]), c["t"], 0

    def q_rows(c):
        return valid_extent(c["i"], bm, p.seq_q)

    def kv_cols(c):
        return valid_extent(c["t"], bn, p.seq_kv)

    def step(rows, cols):
        # QK^T and PV; one exp per score plus one rescale exp per row;
        # scale, max, subtract, row-sum per score, accumulator rescale per output element.
        return 4 * rows * cols * d, rows * cols + rows, 4 * rows * cols + rows * d

    def finish(rows):
        return 0, rows, rows * d + rows  # O /= l, LSE = m + log(l)

    def masked(c):  # the K/V blocks past the unmasked prefix: the masked loop's
        return c["t"] >= kv_blocks_unmasked(c["i"], bm, bn, p.seq_q, p.seq_kv, p.causal)

    sram = bm * d * s + t.num_stages * 2 * bn * d * s
    return Kernel(
        name="fa2_fwd",
        ctas=ctas,
        loop_count=count,
        pre=[Access(LOAD, "q", bm, d, q_tile)],
        loop=[Access(LOAD, "k", bn, d, kv_tile), Access(LOAD, "v", bn, d, kv_tile),
              tile_compute(step, q_rows, kv_cols, bm, bn)],
        post=[Compute(lambda c: finish(q_rows(c)), issued=lambda c: finish(bm)),
              Access(STORE, "o", bm, d, q_tile),
              Access(STORE, "lse", bm, 1, q_tile)],
        sram_bytes=sram,
        tensors=tensors,
        mma_rows=bm,
        dots=(Dot(bm, bn, d, feeds_dot=True, row_reductions=2),  # S: its row max and sum
              Dot(bm, d, bn, a="result")),
        loop_masked=masked,
    )


def backward(p: AttentionProblem, t: Tiling, tensors: dict[str, Tensor]) -> list[Kernel]:
    bm, bn, d, s = t.block_m, t.block_n, p.head_dim, p.elem_bytes
    tr, tc, g = cdiv(p.seq_q, bm), cdiv(p.seq_kv, bn), p.group_size

    # Preprocess: D_i = rowsum(dO_i * O_i).
    pre_ctas = grid_coords(("i", tr), ("bh", p.batch * p.heads))

    def q_tile(c):
        return c["bh"], c["i"], 0

    def rowsum(rows):
        return 0, 0, 2 * rows * d

    preprocess = Kernel(
        name="fa2_bwd_preprocess",
        ctas=pre_ctas,
        loop_count=np.zeros(tr * p.batch * p.heads, dtype=np.int64),
        pre=[Access(LOAD, "o", bm, d, q_tile), Access(LOAD, "do", bm, d, q_tile),
             Compute(lambda c: rowsum(valid_extent(c["i"], bm, p.seq_q)),
                     issued=lambda c: rowsum(bm)),
             Access(STORE, "delta", bm, 1, q_tile)],
        loop=[], post=[], sram_bytes=2 * bm * d * s, tensors=tensors,
    )

    # dK/dV: one CTA per K/V block of a kv head; loop over (group head, Q block).
    kv_ctas = grid_coords(("j", tc), ("bkv", p.batch * p.kv_heads))
    if p.causal:
        first = causal_first_row_block(kv_ctas["j"], bm, bn, p.seq_q, p.seq_kv)
    else:
        first = np.zeros(kv_ctas["j"].shape, dtype=np.int64)
    kv_ctas["first"] = first
    per_head = tr - first

    def kv_own(c):
        return c["bkv"], c["j"], 0

    def q_of_loop(c):
        span = np.maximum(tr - c["first"], 1)
        head_in_group, offset = np.divmod(c["t"], span)
        b, kvh = np.divmod(c["bkv"], p.kv_heads)
        return b * p.heads + kvh * g + head_in_group, c["first"] + offset, 0

    def loop_rows(c):
        return valid_extent(q_of_loop(c)[1], bm, p.seq_q)

    def own_cols(c):
        return valid_extent(c["j"], bn, p.seq_kv)

    def dkdv_masked(c):  # the Q blocks before the unmasked run, or from its end on
        mid, tail = q_blocks_unmasked(c["j"], bm, bn, p.seq_q, p.seq_kv, p.causal)
        block = q_of_loop(c)[1]
        return (block < mid) | (block >= tail)

    def dkdv_step(rows, cols):
        # S = QK^T, dV += P^T dO, dP = dO V^T, dK += dS^T Q: four matmuls (S recomputed).
        return 8 * rows * cols * d, rows * cols, 4 * rows * cols

    dkdv = Kernel(
        name="fa2_bwd_dkdv",
        ctas=kv_ctas,
        loop_count=g * per_head,
        pre=[Access(LOAD, "k", bn, d, kv_own), Access(LOAD, "v", bn, d, kv_own)],
        loop=[Access(LOAD, "q", bm, d, q_of_loop), Access(LOAD, "do", bm, d, q_of_loop),
              Access(LOAD, "lse", bm, 1, q_of_loop), Access(LOAD, "delta", bm, 1, q_of_loop),
              tile_compute(dkdv_step, loop_rows, own_cols, bm, bn)],
        post=[Access(STORE, "dk", bn, d, kv_own), Access(STORE, "dv", bn, d, kv_own)],
        sram_bytes=2 * bn * d * s + t.num_stages * (2 * bm * d * s + 2 * bm * STATS_BYTES),
        tensors=tensors,
        mma_rows=bn,  # every product of this kernel has the K/V block's rows: dK, dV, S^T
        dots=(Dot(bn, bm, d, feeds_dot=True), Dot(bn, d, bm, a="result"),  # S^T, dV
              Dot(bn, bm, d, feeds_dot=True), Dot(bn, d, bm, a="result")),  # dP^T, dK
        loop_masked=dkdv_masked,
    )

    # dQ: one CTA per Q block; loop over K/V blocks.
    q_ctas = grid_coords(("i", tr), ("bh", p.batch * p.heads))
    if p.causal:
        count = causal_last_block(q_ctas["i"], bm, bn, p.seq_q, p.seq_kv)
    else:
        count = np.full(q_ctas["i"].shape, tc, dtype=np.int64)

    def kv_tile(c):
        return kv_plane(p, c["bh"]), c["t"], 0

    def own_rows(c):
        return valid_extent(c["i"], bm, p.seq_q)

    def loop_cols(c):
        return valid_extent(c["t"], bn, p.seq_kv)

    def dq_masked(c):
        return c["t"] >= kv_blocks_unmasked(c["i"], bm, bn, p.seq_q, p.seq_kv, p.causal)

    def dq_step(rows, cols):
        # S = QK^T, dP = dO V^T, dQ += dS K: three matmuls (S and dP recomputed).
        return 6 * rows * cols * d, rows * cols, 4 * rows * cols

    dq = Kernel(
        name="fa2_bwd_dq",
        ctas=q_ctas,
        loop_count=count,
        pre=[Access(LOAD, "q", bm, d, q_tile), Access(LOAD, "do", bm, d, q_tile),
             Access(LOAD, "lse", bm, 1, q_tile), Access(LOAD, "delta", bm, 1, q_tile)],
        loop=[Access(LOAD, "k", bn, d, kv_tile), Access(LOAD, "v", bn, d, kv_tile),
              tile_compute(dq_step, own_rows, loop_cols, bm, bn)],
        post=[Access(STORE, "dq", bm, d, q_tile)],
        sram_bytes=2 * bm * d * s + 2 * bm * STATS_BYTES + t.num_stages * 2 * bn * d * s,
        tensors=tensors,
        mma_rows=bm,
        dots=(Dot(bm, bn, d, feeds_dot=True), Dot(bm, bn, d, feeds_dot=True),  # S, dP
              Dot(bm, d, bn, a="result")),  # dQ
        loop_masked=dq_masked,
    )
    return [preprocess, dkdv, dq]
