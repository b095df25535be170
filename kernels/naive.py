"""Naive attention (Algorithm 0): every intermediate N x N matrix goes through HBM.

Forward: ``naive_qk`` (S = scale Q K^T), ``naive_softmax`` (P = softmax(S), causal mask
applied here), ``naive_pv`` (O = P V). Backward: ``naive_bwd_dv`` (dV = P^T dO),
``naive_bwd_dp`` (dP = dO V^T), ``naive_bwd_ds`` (dS = P * (dP - rowsum(dO * O))),
``naive_bwd_dq`` (dQ = scale dS K), ``naive_bwd_dk`` (dK = scale dS^T Q). S, P, dP, dS are
stored in the problem dtype, as a PyTorch implementation at that precision stores them.
Every block is computed, causal or not. Schedule ``naive``, docs/schedules.md.
"""

import torch
import triton
import triton.language as tl

from kernels.common import alloc, cdiv, dot_fp32, mma_operand
from traces.schedules.base import pow2_at_least
from traces.tiling import Tiling


@triton.jit
def _tile_ptrs(start_r, start_c, n_r, n_c, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Offsets and in-bounds mask of the ROWS x COLS tile at (start_r, start_c) of an n_r x n_c
    row-major matrix."""
    r = start_r + tl.arange(0, ROWS)
    c = start_c + tl.arange(0, COLS)
    return r[:, None] * n_c + c[None, :], (r[:, None] < n_r) & (c[None, :] < n_c)


@triton.jit
def naive_qk(Q, K, S, sm_scale, n_q, n_kv, n_heads, group, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, DOT_FP32: tl.constexpr):
    """Schedule: naive forward, kernel naive_qk, docs/schedules.md. Grid (Tc, Tr, B*H)."""
    j = tl.program_id(0)
    i = tl.program_id(1)
    bh = tl.program_id(2)
    kv_bh = (bh // n_heads) * (n_heads // group) + (bh % n_heads) // group
    q_offs, q_ok = _tile_ptrs(i * BLOCK_M, 0, n_q, HEAD_DIM, BLOCK_M, HEAD_DIM)
    k_offs, k_ok = _tile_ptrs(j * BLOCK_N, 0, n_kv, HEAD_DIM, BLOCK_N, HEAD_DIM)
    q = tl.load(Q + bh.to(tl.int64) * n_q * HEAD_DIM + q_offs, mask=q_ok, other=0.0)
    k = tl.load(K + kv_bh.to(tl.int64) * n_kv * HEAD_DIM + k_offs, mask=k_ok, other=0.0)
    s = tl.dot(mma_operand(q, DOT_FP32), tl.trans(mma_operand(k, DOT_FP32))) * sm_scale
    s_offs, s_ok = _tile_ptrs(i * BLOCK_M, j * BLOCK_N, n_q, n_kv, BLOCK_M, BLOCK_N)
    tl.store(S + bh.to(tl.int64) * n_q * n_kv + s_offs, s.to(S.dtype.element_ty), mask=s_ok)


@triton.jit
def naive_softmax(S, P, n_q, n_kv, CAUSAL: tl.constexpr, ROW: tl.constexpr):
    """Schedule: naive forward, kernel naive_softmax, docs/schedules.md. Grid (Nq, B*H).

    One CTA per row; the whole row (ROW >= Nkv, a power of two) lives in registers.
    """
    r = tl.program_id(0)
    bh = tl.program_id(1)
    cols = tl.arange(0, ROW)
    in_row = cols < n_kv
    row = bh.to(tl.int64) * n_q * n_kv + r.to(tl.int64) * n_kv
    s = tl.load(S + row + cols, mask=in_row, other=float("-inf")).to(tl.float32)
    visible = in_row
    if CAUSAL:
        visible = visible & (cols <= r + (n_kv - n_q))
    s = tl.where(visible, s, float("-inf"))
    m = tl.max(s, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # a row that sees no key: P = 0, not NaN
    e = tl.exp2((s - m) * 1.4426950408889634)  # 1/ln(2): exp(x) == exp2(x / ln 2)
    total = tl.sum(e, 0)
    p = e / tl.where(total == 0.0, 1.0, total)
    tl.store(P + row + cols, p.to(P.dtype.element_ty), mask=in_row)


@triton.jit
def naive_pv(P, V, O, n_q, n_kv, n_heads, group, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             HEAD_DIM: tl.constexpr, DOT_FP32: tl.constexpr):
    """Schedule: naive forward, kernel naive_pv, docs/schedules.md. Grid (Tr, B*H)."""
    i = tl.program_id(0)
    bh = tl.program_id(1)
    kv_bh = (bh // n_heads) * (n_heads // group) + (bh % n_heads) // group
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, n_kv, BLOCK_N):
        p_offs, p_ok = _tile_ptrs(i * BLOCK_M, start_n, n_q, n_kv, BLOCK_M, BLOCK_N)
        v_offs, v_ok = _tile_ptrs(start_n, 0, n_kv, HEAD_DIM, BLOCK_N, HEAD_DIM)
        p = tl.load(P + bh.to(tl.int64) * n_q * n_kv + p_offs, mask=p_ok, other=0.0)
        v = tl.load(V + kv_bh.to(tl.int64) * n_kv * HEAD_DIM + v_offs, mask=v_ok, other=0.0)
        acc = tl.dot(mma_operand(p, DOT_FP32), mma_operand(v, DOT_FP32), acc)
    o_offs, o_ok = _tile_ptrs(i * BLOCK_M, 0, n_q, HEAD_DIM, BLOCK_M, HEAD_DIM)
    tl.store(O + bh.to(tl.int64) * n_q * HEAD_DIM + o_offs, acc.to(O.dtype.element_ty), mask=o_ok)


@triton.jit
def _grouped_tn(A, B, C, n_q, n_kv, n_heads, group, scale, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, DOT_FP32: tl.constexpr):
    """C_j = scale * sum over the G heads and Q blocks of A(i, j)^T B_i (one K/V block j).

    A: [B, H, Nq, Nkv] score-shaped, B: [B, H, Nq, d], C: [B, Hkv, Nkv, d]. Serves
    naive_bwd_dv (A = P, B = dO) and naive_bwd_dk (A = dS, B = Q). Grid (Tc, B*Hkv).
    """
    j = tl.program_id(0)
    kv_bh = tl.program_id(1)
    h_kv = n_heads // group
    first_bh = (kv_bh // h_kv) * n_heads + (kv_bh % h_kv) * group
    acc = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    for g in range(group):
        bh = (first_bh + g).to(tl.int64)
        for start_m in range(0, n_q, BLOCK_M):
            a_offs, a_ok = _tile_ptrs(start_m, j * BLOCK_N, n_q, n_kv, BLOCK_M, BLOCK_N)
            b_offs, b_ok = _tile_ptrs(start_m, 0, n_q, HEAD_DIM, BLOCK_M, HEAD_DIM)
            a = tl.load(A + bh * n_q * n_kv + a_offs, mask=a_ok, other=0.0)
            b = tl.load(B + bh * n_q * HEAD_DIM + b_offs, mask=b_ok, other=0.0)
            acc = tl.dot(tl.trans(mma_operand(a, DOT_FP32)), mma_operand(b, DOT_FP32), acc)
    c_offs, c_ok = _tile_ptrs(j * BLOCK_N, 0, n_kv, HEAD_DIM, BLOCK_N, HEAD_DIM)
    tl.store(C + kv_bh.to(tl.int64) * n_kv * HEAD_DIM + c_offs,
             (acc * scale).to(C.dtype.element_ty), mask=c_ok)


@triton.jit
def naive_bwd_dv(P, DO, DV, n_q, n_kv, n_heads, group, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 HEAD_DIM: tl.constexpr, DOT_FP32: tl.constexpr):
    """Schedule: naive backward, kernel naive_bwd_dv, docs/schedules.md. Grid (Tc, B*Hkv)."""
    _grouped_tn(P, DO, DV, n_q, n_kv, n_heads, group, 1.0, BLOCK_M, BLOCK_N, HEAD_DIM, DOT_FP32)


@triton.jit
def naive_bwd_dk(DS, Q, DK, sm_scale, n_q, n_kv, n_heads, group, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, DOT_FP32: tl.constexpr):
    """Schedule: naive backward, kernel naive_bwd_dk, docs/schedules.md. Grid (Tc, B*Hkv)."""
    _grouped_tn(DS, Q, DK, n_q, n_kv, n_heads, group, sm_scale, BLOCK_M, BLOCK_N, HEAD_DIM,
                DOT_FP32)


@triton.jit
def naive_bwd_dp(DO, V, DP, n_q, n_kv, n_heads, group, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 HEAD_DIM: tl.constexpr, DOT_FP32: tl.constexpr):
    """Schedule: naive backward, kernel naive_bwd_dp, docs/schedules.md. Grid (Tc, Tr, B*H)."""
    naive_qk(DO, V, DP, 1.0, n_q, n_kv, n_heads, group, BLOCK_M, BLOCK_N, HEAD_DIM, DOT_FP32)


@triton.jit
def naive_bwd_ds(DO, O, P, DP, DS, n_q, n_kv, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 HEAD_DIM: tl.constexpr):
    """Schedule: naive backward, kernel naive_bwd_ds, docs/schedules.md. Grid (Tr, B*H).

    dS = P * (dP - D) with D = rowsum(dO * O), computed from the dO and O tiles first.
    """
    i = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    o_offs, o_ok = _tile_ptrs(i * BLOCK_M, 0, n_q, HEAD_DIM, BLOCK_M, HEAD_DIM)
    do = tl.load(DO + bh * n_q * HEAD_DIM + o_offs, mask=o_ok, other=0.0).to(tl.float32)
    o = tl.load(O + bh * n_q * HEAD_DIM + o_offs, mask=o_ok, other=0.0).to(tl.float32)
    delta = tl.sum(do * o, 1)
    for start_n in range(0, n_kv, BLOCK_N):
        s_offs, s_ok = _tile_ptrs(i * BLOCK_M, start_n, n_q, n_kv, BLOCK_M, BLOCK_N)
        p = tl.load(P + bh * n_q * n_kv + s_offs, mask=s_ok, other=0.0).to(tl.float32)
        dp = tl.load(DP + bh * n_q * n_kv + s_offs, mask=s_ok, other=0.0).to(tl.float32)
        ds = p * (dp - delta[:, None])
        tl.store(DS + bh * n_q * n_kv + s_offs, ds.to(DS.dtype.element_ty), mask=s_ok)


@triton.jit
def naive_bwd_dq(DS, K, DQ, sm_scale, n_q, n_kv, n_heads, group, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, DOT_FP32: tl.constexpr):
    """Schedule: naive backward, kernel naive_bwd_dq, docs/schedules.md. Grid (Tr, B*H).

    Same program as naive_pv with dS for P and K for V, scaled.
    """
    i = tl.program_id(0)
    bh = tl.program_id(1)
    kv_bh = (bh // n_heads) * (n_heads // group) + (bh % n_heads) // group
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, n_kv, BLOCK_N):
        s_offs, s_ok = _tile_ptrs(i * BLOCK_M, start_n, n_q, n_kv, BLOCK_M, BLOCK_N)
        k_offs, k_ok = _tile_ptrs(start_n, 0, n_kv, HEAD_DIM, BLOCK_N, HEAD_DIM)
        ds = tl.load(DS + bh.to(tl.int64) * n_q * n_kv + s_offs, mask=s_ok, other=0.0)
        k = tl.load(K + kv_bh.to(tl.int64) * n_kv * HEAD_DIM + k_offs, mask=k_ok, other=0.0)
        acc = tl.dot(mma_operand(ds, DOT_FP32), mma_operand(k, DOT_FP32), acc)
    q_offs, q_ok = _tile_ptrs(i * BLOCK_M, 0, n_q, HEAD_DIM, BLOCK_M, HEAD_DIM)
    tl.store(DQ + bh.to(tl.int64) * n_q * HEAD_DIM + q_offs,
             (acc * sm_scale).to(DQ.dtype.element_ty), mask=q_ok)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, tiling: Tiling,
            sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Run naive_qk, naive_softmax, naive_pv. Returns (o, p); p is kept for the backward."""
    b, h, n_q, d = q.shape
    h_kv, n_kv = k.shape[1], k.shape[2]
    if n_q * n_kv >= 2**31:
        raise ValueError(f"naive attention indexes one head's {n_q} x {n_kv} scores with 32-bit "
                         "offsets; Nq * Nkv must be below 2**31")
    g, bm, bn = h // h_kv, tiling.block_m, tiling.block_n
    tr, tc = cdiv(n_q, bm), cdiv(n_kv, bn)
    opts = {"num_warps": tiling.num_warps, "num_stages": tiling.num_stages}
    shapes = {"BLOCK_M": bm, "BLOCK_N": bn, "HEAD_DIM": d, "DOT_FP32": dot_fp32(q.dtype)}
    s = alloc((b, h, n_q, n_kv), q.dtype, q.device)  # s: [B, H, Nq, Nkv]
    p = alloc((b, h, n_q, n_kv), q.dtype, q.device)  # p: [B, H, Nq, Nkv]
    o = alloc(q.shape, q.dtype, q.device)
    naive_qk[(tc, tr, b * h)](q, k, s, sm_scale, n_q, n_kv, h, g, **shapes, **opts)
    naive_softmax[(n_q, b * h)](s, p, n_q, n_kv, CAUSAL=causal, ROW=pow2_at_least(n_kv, 16),
                                **opts)
    naive_pv[(tr, b * h)](p, v, o, n_q, n_kv, h, g, **shapes, **opts)
    return o, p


def backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             o: torch.Tensor, p: torch.Tensor, tiling: Tiling,
             sm_scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the five backward kernels in schedule order (dv, dp, ds, dq, dk)."""
    b, h, n_q, d = q.shape
    h_kv, n_kv = k.shape[1], k.shape[2]
    g, bm, bn = h // h_kv, tiling.block_m, tiling.block_n
    tr, tc = cdiv(n_q, bm), cdiv(n_kv, bn)
    opts = {"num_warps": tiling.num_warps, "num_stages": tiling.num_stages}
    shapes = {"BLOCK_M": bm, "BLOCK_N": bn, "HEAD_DIM": d, "DOT_FP32": dot_fp32(q.dtype)}
    dq = alloc(q.shape, q.dtype, q.device)
    dk = alloc(k.shape, k.dtype, k.device)
    dv = alloc(v.shape, v.dtype, v.device)
    dp = alloc(p.shape, p.dtype, p.device)  # dp: [B, H, Nq, Nkv]
    ds = alloc(p.shape, p.dtype, p.device)  # ds: [B, H, Nq, Nkv]
    naive_bwd_dv[(tc, b * h_kv)](p, do, dv, n_q, n_kv, h, g, **shapes, **opts)
    naive_bwd_dp[(tc, tr, b * h)](do, v, dp, n_q, n_kv, h, g, **shapes, **opts)
    naive_bwd_ds[(tr, b * h)](do, o, p, dp, ds, n_q, n_kv, BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=d,
                              **opts)
    naive_bwd_dq[(tr, b * h)](ds, k, dq, sm_scale, n_q, n_kv, h, g, **shapes, **opts)
    naive_bwd_dk[(tc, b * h_kv)](ds, q, dk, sm_scale, n_q, n_kv, h, g, **shapes, **opts)
    return dq, dk, dv
