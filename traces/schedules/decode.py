"""Split-KV flash-decoding for short query lengths (Nq <= 16).

With few query rows, one CTA per Q block would leave most SMs idle. Flash-decoding cuts the
K/V sequence into ``split_kv`` chunks: one CTA per (batch, kv head, chunk) handles all query
heads of the group (their rows form one tile, so K/V are read once per group), writes a
partial output and its log-sum-exp in fp32; a reduce kernel rescales and sums the partials.
"""

from __future__ import annotations

import numpy as np

from traces.problem import STATS_BYTES, AttentionProblem, ProblemError
from traces.schedules.base import (
    LOAD,
    STORE,
    Access,
    Compute,
    Kernel,
    Tensor,
    causal_last_block,
    cdiv,
    grid_coords,
    pow2_at_least,
    tile_compute,
    valid_extent,
)
from traces.schedules.mma_layout import Dot
from traces.tiling import Tiling

MAX_SEQ_Q = 16
PARTIAL_BYTES = 4  # partial outputs and LSEs are fp32


def check(p: AttentionProblem, t: Tiling) -> None:
    if p.seq_q > MAX_SEQ_Q:
        raise ProblemError(
            f"the decode schedule is for short queries (seq_q <= {MAX_SEQ_Q}), got {p.seq_q}"
        )
    tc = cdiv(p.seq_kv, t.block_n)
    if t.split_kv > tc:
        raise ProblemError(
            f"split_kv={t.split_kv} exceeds the {tc} K/V blocks of {t.block_n} rows"
        )
    chunk = cdiv(tc, t.split_kv)
    if cdiv(tc, chunk) != t.split_kv:
        raise ProblemError(
            f"split_kv={t.split_kv} leaves empty chunks for {tc} K/V blocks; "
            f"use {cdiv(tc, chunk)} or fewer"
        )


def group_rows(p: AttentionProblem) -> int:
    """Query rows one CTA processes: every head of the group, every query position."""
    return p.group_size * p.seq_q


def tensors_for(p: AttentionProblem, t: Tiling) -> list[Tensor]:
    s, bkv, rows = p.elem_bytes, p.batch * p.kv_heads, group_rows(p)
    return [
        Tensor("q", bkv, rows, p.head_dim, s),  # [B, H, Nq, d] seen as [B*Hkv, G*Nq, d]
        Tensor("k", bkv, p.seq_kv, p.head_dim, s),
        Tensor("v", bkv, p.seq_kv, p.head_dim, s),
        Tensor("o_partial", bkv * t.split_kv, rows, p.head_dim, PARTIAL_BYTES),
        Tensor("lse_partial", bkv * t.split_kv, rows, 1, STATS_BYTES),
        Tensor("o", p.batch * p.heads, p.seq_q, p.head_dim, s),
    ]


def forward(p: AttentionProblem, t: Tiling, tensors: dict[str, Tensor]) -> list[Kernel]:
    bn, d, s, n_split = t.block_n, p.head_dim, p.elem_bytes, t.split_kv
    rows, tc = group_rows(p), cdiv(p.seq_kv, bn)
    chunk = cdiv(tc, n_split)
    ctas = grid_coords(("sp", n_split), ("bkv", p.batch * p.kv_heads))
    begin = ctas["sp"] * chunk
    end = np.minimum(begin + chunk, tc)
    if p.causal:  # every query position shares the same visible range in the group tile
        end = np.minimum(end, causal_last_block(np.zeros(1, dtype=np.int64), p.seq_q, bn,
                                                p.seq_q, p.seq_kv))
    ctas["begin"] = begin

    def group(c):
        return c["bkv"], 0, 0

    def kv(c):
        return c["bkv"], c["begin"] + c["t"], 0

    def partial(c):
        return c["bkv"] * n_split + c["sp"], 0, 0

    def step(rows, cols):
        return 4 * rows * cols * d, rows * cols + rows, 4 * rows * cols + rows * d

    def finish(rows):
        return 0, rows, rows * d + rows

    padded = pow2_at_least(rows, 16)  # the twin's BLOCK_R

    split = Kernel(
        name="decode_split",
        ctas=ctas,
        loop_count=np.maximum(end - begin, 0),
        pre=[Access(LOAD, "q", rows, d, group)],
        loop=[Access(LOAD, "k", bn, d, kv), Access(LOAD, "v", bn, d, kv),
              tile_compute(step, lambda c: rows,
                           lambda c: valid_extent(c["begin"] + c["t"], bn, p.seq_kv),
                           padded, bn)],
        post=[Compute(lambda c: finish(rows), issued=lambda c: finish(padded)),
              Access(STORE, "o_partial", rows, d, partial),
              Access(STORE, "lse_partial", rows, 1, partial)],
        sram_bytes=rows * d * s + t.num_stages * 2 * bn * d * s,
        tensors=tensors,
        mma_rows=padded,
        dots=(Dot(padded, bn, d, feeds_dot=True, row_reductions=2),  # FA2's forward loop
              Dot(padded, d, bn, a="result")),
    )

    heads = grid_coords(("h", p.heads), ("b", p.batch))
    nq = p.seq_q
    nq_padded = pow2_at_least(nq)  # the twin's BLOCK_Q

    def combine(n):
        return 0, n, 3 * n * d + n

    def partial_rows(c):
        kvh, g = np.divmod(c["h"], p.group_size)
        return (c["b"] * p.kv_heads + kvh) * n_split + c["t"], g, 0

    def out(c):
        return c["b"] * p.heads + c["h"], 0, 0

    reduce = Kernel(
        name="decode_reduce",
        ctas=heads,
        loop_count=np.full(p.batch * p.heads, n_split, dtype=np.int64),
        pre=[],
        loop=[Access(LOAD, "lse_partial", nq, 1, partial_rows),
              Access(LOAD, "o_partial", nq, d, partial_rows),
              Compute(lambda c: combine(nq), issued=lambda c: combine(nq_padded))],
        post=[Access(STORE, "o", nq, d, out)],
        sram_bytes=t.num_stages * (nq * d + nq) * PARTIAL_BYTES,
        tensors=tensors,
    )
    return [split, reduce]
