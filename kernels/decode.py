"""Split-KV flash-decoding for short queries (Nq <= 16): ``decode_split`` + ``decode_reduce``.

The K/V blocks are cut into ``S = tiling.split_kv`` chunks of ``C = ceil(Tc / S)`` blocks.
``decode_split`` runs one CTA per (chunk, batch, K/V head) over the whole query group of that
K/V head (G*Nq rows: q viewed as [B*Hkv, G*Nq, d], the same memory as [B, H, Nq, d]) and
writes a normalised partial output and its LSE; ``decode_reduce`` rescales and sums the
partials per query head. Schedule ``decode``, docs/schedules.md.
"""

import torch
import triton
import triton.language as tl

from kernels.common import alloc, cdiv, dot_fp32, kv_blocks_visible, mma_operand
from kernels.fa2 import attn_fwd_inner
from traces.schedules.base import pow2_at_least
from traces.tiling import Tiling

MAX_DECODE_QUERIES = 16


@triton.jit
def decode_split(Q, K, V, O_PARTIAL, LSE_PARTIAL, sm_scale, n_q, n_kv, group, n_split, chunk,
                 CAUSAL: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
                 HEAD_DIM: tl.constexpr, DOT_FP32: tl.constexpr):
    """Schedule: decode, kernel decode_split, docs/schedules.md. Grid (S, B*Hkv).

    O_PARTIAL: [B, Hkv, S, G*Nq, d] fp32 (normalised per split), LSE_PARTIAL: [B, Hkv, S, G*Nq]
    fp32 (-inf where the chunk has no visible key). BLOCK_R >= G*Nq rows, a power of two.
    """
    sp = tl.program_id(0)
    kv_bh = tl.program_id(1)
    n_rows = group * n_q
    causal_off = n_kv - n_q
    rows = tl.arange(0, BLOCK_R)
    row_ok = rows < n_rows
    offs_d = tl.arange(0, HEAD_DIM)
    q_tile = rows[:, None] * HEAD_DIM + offs_d[None, :]
    q = tl.load(Q + kv_bh.to(tl.int64) * n_rows * HEAD_DIM + q_tile, mask=row_ok[:, None],
                other=0.0)
    q = mma_operand(q, DOT_FP32)
    kv_off = kv_bh.to(tl.int64) * n_kv * HEAD_DIM
    kv_tile = tl.arange(0, BLOCK_N)[:, None] * HEAD_DIM + offs_d[None, :]

    acc = tl.zeros([BLOCK_R, HEAD_DIM], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_R], dtype=tl.float32)
    m_i = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # 1/ln(2), for exp2
    # Every row of the group tile is one of the Nq query positions, 0..Nq-1.
    n_unmasked, end = kv_blocks_visible(0, n_q - 1, causal_off, n_kv, CAUSAL, BLOCK_N)
    lo = sp * chunk
    hi = tl.minimum(lo + chunk, tl.cdiv(n_kv, BLOCK_N))
    q_pos = rows % n_q
    acc, l_i, m_i = attn_fwd_inner(acc, l_i, m_i, q, K + kv_off + kv_tile, V + kv_off + kv_tile,
                                   q_pos, lo, tl.minimum(hi, n_unmasked), n_kv, causal_off,
                                   qk_scale, False, CAUSAL, BLOCK_N, HEAD_DIM, DOT_FP32)
    acc, l_i, m_i = attn_fwd_inner(acc, l_i, m_i, q, K + kv_off + kv_tile, V + kv_off + kv_tile,
                                   q_pos, tl.maximum(lo, n_unmasked), tl.minimum(hi, end), n_kv,
                                   causal_off, qk_scale, True, CAUSAL, BLOCK_N, HEAD_DIM,
                                   DOT_FP32)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    part = (kv_bh.to(tl.int64) * n_split + sp) * n_rows
    tl.store(O_PARTIAL + part * HEAD_DIM + q_tile, acc / l_safe[:, None], mask=row_ok[:, None])
    lse = (m_i + tl.log2(l_safe)) * 0.6931471805599453  # ln(2): back to natural log
    tl.store(LSE_PARTIAL + part + rows, lse, mask=row_ok)


@triton.jit
def decode_reduce(O_PARTIAL, LSE_PARTIAL, O, n_q, n_heads, group, n_split, BLOCK_Q: tl.constexpr,
                  HEAD_DIM: tl.constexpr):
    """Schedule: decode, kernel decode_reduce, docs/schedules.md. Grid (B*H).

    O = sum_s exp(lse_s - lse) O_s with lse = log sum_s exp(lse_s), over the S splits.
    """
    bh = tl.program_id(0)
    h = bh % n_heads
    kv_bh = (bh // n_heads) * (n_heads // group) + h // group
    rows = tl.arange(0, BLOCK_Q)
    row_ok = rows < n_q
    offs_d = tl.arange(0, HEAD_DIM)
    n_rows = group * n_q
    first_row = (h % group) * n_q  # this head's Nq rows inside its group tile
    acc = tl.zeros([BLOCK_Q, HEAD_DIM], dtype=tl.float32)
    total = tl.zeros([BLOCK_Q], dtype=tl.float32)
    m_i = tl.full([BLOCK_Q], float("-inf"), dtype=tl.float32)
    for sp in range(0, n_split):
        part = (kv_bh.to(tl.int64) * n_split + sp) * n_rows + first_row
        lse = tl.load(LSE_PARTIAL + part + rows, mask=row_ok, other=float("-inf"))
        o = tl.load(O_PARTIAL + (part + rows[:, None]) * HEAD_DIM + offs_d[None, :],
                    mask=row_ok[:, None], other=0.0)
        m_new = tl.maximum(m_i, lse)
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)  # no split saw a key yet
        alpha = tl.exp2((m_i - m_sub) * 1.4426950408889634)  # 1/ln(2): exp via exp2
        w = tl.exp2((lse - m_sub) * 1.4426950408889634)
        acc = acc * alpha[:, None] + w[:, None] * o
        total = total * alpha + w
        m_i = m_new
    o = acc / tl.where(total == 0.0, 1.0, total)[:, None]
    tl.store(O + (bh.to(tl.int64) * n_q + rows[:, None]) * HEAD_DIM + offs_d[None, :],
             o.to(O.dtype.element_ty), mask=row_ok[:, None])


def check(n_q: int, n_kv: int, tiling: Tiling) -> None:
    """Raise ValueError unless the decode schedule accepts this shape and tiling."""
    if n_q > MAX_DECODE_QUERIES:
        raise ValueError(f"decode handles at most {MAX_DECODE_QUERIES} queries per head, got "
                         f"Nq={n_q}; use algorithm='fa2'")
    tc = cdiv(n_kv, tiling.block_n)
    chunk = cdiv(tc, tiling.split_kv)
    if (tiling.split_kv - 1) * chunk >= tc:
        raise ValueError(f"split_kv={tiling.split_kv} leaves empty chunks: {tc} K/V blocks of "
                         f"{tiling.block_n} cut into chunks of {chunk}; use split_kv <= "
                         f"{cdiv(tc, chunk)}")


def launches(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, tiling: Tiling,
             sm_scale: float):
    """``(split, reduce, o)``: the two kernel launches of one decode call, as functions of no
    arguments over buffers allocated here, and the output ``o`` [B, H, Nq, d] that running
    ``split`` then ``reduce`` fills (``validation/overheads.py`` times them one by one)."""
    b, h, n_q, d = q.shape
    h_kv, n_kv = k.shape[1], k.shape[2]
    g, n_split = h // h_kv, tiling.split_kv
    check(n_q, n_kv, tiling)
    chunk = cdiv(cdiv(n_kv, tiling.block_n), n_split)
    opts = {"num_warps": tiling.num_warps, "num_stages": tiling.num_stages}
    # o_partial: [B, Hkv, S, G*Nq, d], lse_partial: [B, Hkv, S, G*Nq], both fp32
    o_partial = alloc((b, h_kv, n_split, g * n_q, d), torch.float32, q.device)
    lse_partial = alloc((b, h_kv, n_split, g * n_q), torch.float32, q.device)
    o = alloc(q.shape, q.dtype, q.device)

    def split():
        decode_split[(n_split, b * h_kv)](
            q, k, v, o_partial, lse_partial, sm_scale, n_q, n_kv, g, n_split, chunk,
            CAUSAL=causal, BLOCK_R=pow2_at_least(g * n_q, 16), BLOCK_N=tiling.block_n,
            HEAD_DIM=d, DOT_FP32=dot_fp32(q.dtype), **opts)

    def reduce():
        decode_reduce[(b * h,)](o_partial, lse_partial, o, n_q, h, g, n_split,
                                BLOCK_Q=pow2_at_least(n_q), HEAD_DIM=d, **opts)

    return split, reduce, o


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, tiling: Tiling,
            sm_scale: float) -> torch.Tensor:
    """Run decode_split then decode_reduce; returns o [B, H, Nq, d]."""
    split, reduce, o = launches(q, k, v, causal, tiling, sm_scale)
    split()
    reduce()
    return o
