"""FlashAttention-2: one CTA per Q block, online softmax, O written once, LSE stored.

Forward (schedule ``fa2``, kernel ``fa2_fwd``) and backward (kernels ``fa2_bwd_preprocess``,
``fa2_bwd_dkdv``, ``fa2_bwd_dq``), as docs/schedules.md defines them. Each loop visits its
blocks in ascending order; one inner-loop helper per loop serves both the unmasked blocks
(no mask arithmetic, unmasked loads) and the masked ones (causal diagonal, partial tiles),
chosen by the constexpr ``MASKED``. Causal masking is bottom-right aligned.

Softmax runs in base 2: scores are multiplied by ``sm_scale * log2(e)`` once so that
``exp2`` (a single MUFU instruction) replaces ``exp``. LSE is stored in natural-log units.
"""

import torch
import triton
import triton.language as tl

from kernels.common import (
    alloc,
    cdiv,
    dot_fp32,
    kv_blocks_visible,
    mma_operand,
    q_blocks_visible,
)
from traces.tiling import Tiling


@triton.jit
def attn_fwd_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, q_pos, block_lo, block_hi, n_kv,
                   causal_off, qk_scale, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                   BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, DOT_FP32: tl.constexpr):
    """Online softmax over K/V blocks block_lo..block_hi-1 for one query tile.

    ``q_pos`` is each tile row's query position (for the causal mask); ``acc``, ``l_i``,
    ``m_i`` are the unnormalised output, row sum and row max (base-2 units), all fp32.
    """
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(block_lo * BLOCK_N, block_hi * BLOCK_N, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        if MASKED:
            k = tl.load(k_ptrs + start_n * HEAD_DIM, mask=cols[:, None] < n_kv, other=0.0)
        else:
            k = tl.load(k_ptrs + start_n * HEAD_DIM)
        qk = tl.dot(q, tl.trans(mma_operand(k, DOT_FP32)))
        if MASKED:
            visible = cols[None, :] < n_kv
            if CAUSAL:
                visible = visible & (cols[None, :] <= q_pos[:, None] + causal_off)
            qk = tl.where(visible, qk * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            # A row that has seen no key keeps m = -inf; subtracting 0 makes its exp2 0, not NaN.
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
            qk = qk - m_sub[:, None]
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            m_sub = m_new
            qk = qk * qk_scale - m_sub[:, None]
        p = tl.exp2(qk)
        alpha = tl.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        if MASKED:
            v = tl.load(v_ptrs + start_n * HEAD_DIM, mask=cols[:, None] < n_kv, other=0.0)
        else:
            v = tl.load(v_ptrs + start_n * HEAD_DIM)
        acc = acc * alpha[:, None]
        acc = tl.dot(mma_operand(p.to(v.dtype), DOT_FP32), mma_operand(v, DOT_FP32), acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def fa2_fwd(Q, K, V, O, LSE, sm_scale, n_q, n_kv, n_heads, group, CAUSAL: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
            DOT_FP32: tl.constexpr):
    """Schedule: fa2 forward, kernel fa2_fwd, docs/schedules.md. Grid (Tr, B*H).

    Q: [B, H, Nq, d], K, V: [B, H/G, Nkv, d], O like Q, LSE: [B, H, Nq] fp32.
    """
    i = tl.program_id(0)
    bh = tl.program_id(1)
    kv_bh = (bh // n_heads) * (n_heads // group) + (bh % n_heads) // group
    causal_off = n_kv - n_q
    offs_m = i * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q_off = bh.to(tl.int64) * n_q * HEAD_DIM
    kv_off = kv_bh.to(tl.int64) * n_kv * HEAD_DIM
    tile = offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    row_ok = offs_m < n_q
    q = mma_operand(tl.load(Q + q_off + tile, mask=row_ok[:, None], other=0.0), DOT_FP32)
    kv_tile = tl.arange(0, BLOCK_N)[:, None] * HEAD_DIM + offs_d[None, :]
    k_ptrs = K + kv_off + kv_tile
    v_ptrs = V + kv_off + kv_tile

    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # 1/ln(2), for exp2
    q_last = tl.minimum((i + 1) * BLOCK_M, n_q) - 1
    n_unmasked, end = kv_blocks_visible(i * BLOCK_M, q_last, causal_off, n_kv, CAUSAL, BLOCK_N)
    acc, l_i, m_i = attn_fwd_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, offs_m, 0, n_unmasked,
                                   n_kv, causal_off, qk_scale, False, CAUSAL, BLOCK_N,
                                   HEAD_DIM, DOT_FP32)
    acc, l_i, m_i = attn_fwd_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, offs_m, n_unmasked, end,
                                   n_kv, causal_off, qk_scale, True, CAUSAL, BLOCK_N,
                                   HEAD_DIM, DOT_FP32)
    # Rows that saw no key: l = 0, output 0, LSE = -inf.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    o = acc / l_safe[:, None]
    tl.store(O + q_off + tile, o.to(O.dtype.element_ty), mask=row_ok[:, None])
    lse = (m_i + tl.log2(l_safe)) * 0.6931471805599453  # ln(2): back to natural log
    tl.store(LSE + bh.to(tl.int64) * n_q + offs_m, lse, mask=row_ok)


@triton.jit
def fa2_bwd_preprocess(O, DO, DELTA, n_q, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Schedule: fa2 backward, kernel fa2_bwd_preprocess, docs/schedules.md. Grid (Tr, B*H).

    DELTA[b, h, r] = rowsum(dO * O) in fp32 (the D of the FA2 paper).
    """
    i = tl.program_id(0)
    bh = tl.program_id(1)
    offs_m = i * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < n_q
    ptrs = bh.to(tl.int64) * n_q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    o = tl.load(O + ptrs, mask=row_ok[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + ptrs, mask=row_ok[:, None], other=0.0).to(tl.float32)
    tl.store(DELTA + bh.to(tl.int64) * n_q + offs_m, tl.sum(o * do, 1), mask=row_ok)


@triton.jit
def bwd_dkdv_inner(dk, dv, k, v, q_ptrs, do_ptrs, LSE, DELTA, offs_n, block_lo, block_hi,
                   n_q, causal_off, qk_scale, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                   BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, DOT_FP32: tl.constexpr):
    """Accumulate dK, dV of one K/V tile over Q blocks block_lo..block_hi-1 (one head).

    Works on transposed scores S^T [BN, BM] so that no tile is transposed twice. Rows of a
    partial K/V tile past Nkv are computed and discarded (never stored).
    """
    offs_m = tl.arange(0, BLOCK_M)
    for start_m in range(block_lo * BLOCK_M, block_hi * BLOCK_M, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        rows = start_m + offs_m
        if MASKED:
            row_ok = rows < n_q
            q = tl.load(q_ptrs + start_m * HEAD_DIM, mask=row_ok[:, None], other=0.0)
            do = tl.load(do_ptrs + start_m * HEAD_DIM, mask=row_ok[:, None], other=0.0)
            lse = tl.load(LSE + rows, mask=row_ok, other=0.0)
            delta = tl.load(DELTA + rows, mask=row_ok, other=0.0)
        else:
            q = tl.load(q_ptrs + start_m * HEAD_DIM)
            do = tl.load(do_ptrs + start_m * HEAD_DIM)
            lse = tl.load(LSE + rows)
            delta = tl.load(DELTA + rows)
        q = mma_operand(q, DOT_FP32)
        do_mma = mma_operand(do, DOT_FP32)
        # A row that sees no key has LSE = -inf; using +inf makes its P exactly 0.
        lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
        p_t = tl.exp2(tl.dot(k, tl.trans(q)) * qk_scale - lse2[None, :])
        if MASKED:
            visible = rows[None, :] < n_q
            if CAUSAL:
                visible = visible & (offs_n[:, None] <= rows[None, :] + causal_off)
            p_t = tl.where(visible, p_t, 0.0)
        dv = tl.dot(mma_operand(p_t.to(do.dtype), DOT_FP32), do_mma, dv)
        dp_t = tl.dot(v, tl.trans(do_mma))
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(mma_operand(ds_t.to(do.dtype), DOT_FP32), q, dk)
    return dk, dv


@triton.jit
def fa2_bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, sm_scale, n_q, n_kv, n_heads, group,
                 CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 HEAD_DIM: tl.constexpr, DOT_FP32: tl.constexpr):
    """Schedule: fa2 backward, kernel fa2_bwd_dkdv, docs/schedules.md. Grid (Tc, B*Hkv).

    One CTA per K/V block; loops over the G query heads of its K/V head, then over Q blocks
    (skipping fully masked ones). dK, dV accumulate in fp32 and are written once.
    """
    j = tl.program_id(0)
    kv_bh = tl.program_id(1)
    h_kv = n_heads // group
    first_bh = (kv_bh // h_kv) * n_heads + (kv_bh % h_kv) * group
    causal_off = n_kv - n_q
    offs_n = j * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    kv_ptrs = kv_bh.to(tl.int64) * n_kv * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    col_ok = offs_n[:, None] < n_kv
    k = mma_operand(tl.load(K + kv_ptrs, mask=col_ok, other=0.0), DOT_FP32)
    v = mma_operand(tl.load(V + kv_ptrs, mask=col_ok, other=0.0), DOT_FP32)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # 1/ln(2), for exp2
    start, mid, tail = q_blocks_visible(j * BLOCK_N, n_q, causal_off, CAUSAL, BLOCK_M, BLOCK_N)
    n_blocks = tl.cdiv(n_q, BLOCK_M)
    q_tile = tl.arange(0, BLOCK_M)[:, None] * HEAD_DIM + offs_d[None, :]
    for g in range(group):
        bh = first_bh + g
        q_off = bh.to(tl.int64) * n_q * HEAD_DIM
        stat_off = bh.to(tl.int64) * n_q
        q_ptrs = Q + q_off + q_tile
        do_ptrs = DO + q_off + q_tile
        dk, dv = bwd_dkdv_inner(dk, dv, k, v, q_ptrs, do_ptrs, LSE + stat_off,
                                DELTA + stat_off, offs_n, start, mid, n_q, causal_off,
                                qk_scale, True, CAUSAL, BLOCK_M, HEAD_DIM, DOT_FP32)
        dk, dv = bwd_dkdv_inner(dk, dv, k, v, q_ptrs, do_ptrs, LSE + stat_off,
                                DELTA + stat_off, offs_n, mid, tail, n_q, causal_off,
                                qk_scale, False, CAUSAL, BLOCK_M, HEAD_DIM, DOT_FP32)
        dk, dv = bwd_dkdv_inner(dk, dv, k, v, q_ptrs, do_ptrs, LSE + stat_off,
                                DELTA + stat_off, offs_n, tail, n_blocks, n_q, causal_off,
                                qk_scale, True, CAUSAL, BLOCK_M, HEAD_DIM, DOT_FP32)
    tl.store(DK + kv_ptrs, (dk * sm_scale).to(DK.dtype.element_ty), mask=col_ok)
    tl.store(DV + kv_ptrs, dv.to(DV.dtype.element_ty), mask=col_ok)


@triton.jit
def bwd_dq_inner(dq, q, do, lse2, delta, k_ptrs, v_ptrs, rows, block_lo, block_hi, n_kv,
                 causal_off, qk_scale, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                 BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, DOT_FP32: tl.constexpr):
    """Accumulate dQ of one Q tile over K/V blocks block_lo..block_hi-1."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(block_lo * BLOCK_N, block_hi * BLOCK_N, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        if MASKED:
            k = tl.load(k_ptrs + start_n * HEAD_DIM, mask=cols[:, None] < n_kv, other=0.0)
            v = tl.load(v_ptrs + start_n * HEAD_DIM, mask=cols[:, None] < n_kv, other=0.0)
        else:
            k = tl.load(k_ptrs + start_n * HEAD_DIM)
            v = tl.load(v_ptrs + start_n * HEAD_DIM)
        k = mma_operand(k, DOT_FP32)
        p = tl.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse2[:, None])
        if MASKED:
            visible = cols[None, :] < n_kv
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None] + causal_off)
            p = tl.where(visible, p, 0.0)
        dp = tl.dot(do, tl.trans(mma_operand(v, DOT_FP32)))
        ds = p * (dp - delta[:, None])
        dq = tl.dot(mma_operand(ds.to(v.dtype), DOT_FP32), k, dq)
    return dq


@triton.jit
def fa2_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, n_q, n_kv, n_heads, group,
               CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               HEAD_DIM: tl.constexpr, DOT_FP32: tl.constexpr):
    """Schedule: fa2 backward, kernel fa2_bwd_dq, docs/schedules.md. Grid (Tr, B*H).

    One CTA per Q block; recomputes P from LSE for each visible K/V block; dQ written once.
    """
    i = tl.program_id(0)
    bh = tl.program_id(1)
    kv_bh = (bh // n_heads) * (n_heads // group) + (bh % n_heads) // group
    causal_off = n_kv - n_q
    offs_m = i * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < n_q
    q_ptrs = bh.to(tl.int64) * n_q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    q = mma_operand(tl.load(Q + q_ptrs, mask=row_ok[:, None], other=0.0), DOT_FP32)
    do = mma_operand(tl.load(DO + q_ptrs, mask=row_ok[:, None], other=0.0), DOT_FP32)
    lse = tl.load(LSE + bh.to(tl.int64) * n_q + offs_m, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + bh.to(tl.int64) * n_q + offs_m, mask=row_ok, other=0.0)
    # A row that sees no key has LSE = -inf; using +inf makes its P exactly 0.
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    kv_off = kv_bh.to(tl.int64) * n_kv * HEAD_DIM
    kv_tile = tl.arange(0, BLOCK_N)[:, None] * HEAD_DIM + offs_d[None, :]
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # 1/ln(2), for exp2
    q_last = tl.minimum((i + 1) * BLOCK_M, n_q) - 1
    n_unmasked, end = kv_blocks_visible(i * BLOCK_M, q_last, causal_off, n_kv, CAUSAL, BLOCK_N)
    dq = bwd_dq_inner(dq, q, do, lse2, delta, K + kv_off + kv_tile, V + kv_off + kv_tile,
                      offs_m, 0, n_unmasked, n_kv, causal_off, qk_scale, False, CAUSAL,
                      BLOCK_N, HEAD_DIM, DOT_FP32)
    dq = bwd_dq_inner(dq, q, do, lse2, delta, K + kv_off + kv_tile, V + kv_off + kv_tile,
                      offs_m, n_unmasked, end, n_kv, causal_off, qk_scale, True, CAUSAL,
                      BLOCK_N, HEAD_DIM, DOT_FP32)
    tl.store(DQ + q_ptrs, (dq * sm_scale).to(DQ.dtype.element_ty), mask=row_ok[:, None])


def _launch_opts(tiling: Tiling) -> dict:
    return {"num_warps": tiling.num_warps, "num_stages": tiling.num_stages}


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, tiling: Tiling,
            sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Run fa2_fwd. q: [B, H, Nq, d], k, v: [B, Hkv, Nkv, d], contiguous. Returns (o, lse)."""
    b, h, n_q, d = q.shape
    h_kv, n_kv = k.shape[1], k.shape[2]
    o = alloc(q.shape, q.dtype, q.device)  # o: [B, H, Nq, d]
    lse = alloc((b, h, n_q), torch.float32, q.device)  # lse: [B, H, Nq]
    grid = (cdiv(n_q, tiling.block_m), b * h)
    fa2_fwd[grid](q, k, v, o, lse, sm_scale, n_q, n_kv, h, h // h_kv, CAUSAL=causal,
                  BLOCK_M=tiling.block_m, BLOCK_N=tiling.block_n, HEAD_DIM=d,
                  DOT_FP32=dot_fp32(q.dtype), **_launch_opts(tiling))
    return o, lse


def backward_launches(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      o: torch.Tensor, lse: torch.Tensor, causal: bool, tiling: Tiling,
                      sm_scale: float):
    """``(preprocess, dkdv, dq, outputs)``: the three kernel launches of one backward, as
    functions of no arguments over buffers allocated here, and ``outputs`` ({dq, dk, dv})
    that running them in that order fills (``validation/overheads.py`` times one alone)."""
    b, h, n_q, d = q.shape
    h_kv, n_kv = k.shape[1], k.shape[2]
    g = h // h_kv
    dq = alloc(q.shape, q.dtype, q.device)
    dk = alloc(k.shape, k.dtype, k.device)
    dv = alloc(v.shape, v.dtype, v.device)
    delta = alloc((b, h, n_q), torch.float32, q.device)  # delta: [B, H, Nq]
    bm, bn, mma32 = tiling.block_m, tiling.block_n, dot_fp32(q.dtype)
    opts = _launch_opts(tiling)

    def preprocess():
        fa2_bwd_preprocess[(cdiv(n_q, bm), b * h)](o, do, delta, n_q, BLOCK_M=bm, HEAD_DIM=d,
                                                   **opts)

    def dkdv():
        fa2_bwd_dkdv[(cdiv(n_kv, bn), b * h_kv)](
            q, k, v, do, lse, delta, dk, dv, sm_scale, n_q, n_kv, h, g, CAUSAL=causal,
            BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=d, DOT_FP32=mma32, **opts)

    def dq_kernel():
        fa2_bwd_dq[(cdiv(n_q, bm), b * h)](
            q, k, v, do, lse, delta, dq, sm_scale, n_q, n_kv, h, g, CAUSAL=causal,
            BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=d, DOT_FP32=mma32, **opts)

    return preprocess, dkdv, dq_kernel, {"dq": dq, "dk": dk, "dv": dv}


def backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             o: torch.Tensor, lse: torch.Tensor, causal: bool, tiling: Tiling,
             sm_scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the three backward kernels. All tensors contiguous. Returns (dq, dk, dv)."""
    preprocess, dkdv, dq, out = backward_launches(do, q, k, v, o, lse, causal, tiling,
                                                  sm_scale)
    preprocess()
    dkdv()
    dq()
    return out["dq"], out["dk"], out["dv"]
