"""FlashAttention-1 loop order (Algorithm 1 of arXiv:2205.14135), forward only.

One CTA per (batch, head). Outer loop over K/V blocks, inner loop over Q blocks; the
running output O (problem dtype, normalised), row sum l and row max m (fp32, natural-log
units) live in HBM and are re-read and re-written at every inner step. Slow by design: it
exists so that the model's FA1 traffic can be checked against a real kernel.
Schedule ``fa1``, docs/schedules.md.
"""

import torch
import triton
import triton.language as tl

from kernels.common import alloc, dot_fp32, mma_operand, q_blocks_visible
from traces.tiling import Tiling


@triton.jit
def fa1_fwd(Q, K, V, O, L, M, sm_scale, n_q, n_kv, n_heads, group, CAUSAL: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
            DOT_FP32: tl.constexpr):
    """Schedule: fa1 forward, kernel fa1_fwd, docs/schedules.md. Grid (B*H).

    Q, O: [B, H, Nq, d]; K, V: [B, H/G, Nkv, d]; L, M: [B, H, Nq] fp32.
    """
    bh = tl.program_id(0)
    kv_bh = (bh // n_heads) * (n_heads // group) + (bh % n_heads) // group
    causal_off = n_kv - n_q
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_base = bh.to(tl.int64) * n_q * HEAD_DIM
    stat_base = bh.to(tl.int64) * n_q
    kv_base = kv_bh.to(tl.int64) * n_kv * HEAD_DIM
    q_tile = offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    n_qblocks = tl.cdiv(n_q, BLOCK_M)

    for start_m in range(0, n_q, BLOCK_M):
        rows = start_m + offs_m
        row_ok = rows < n_q
        tl.store(O + q_base + start_m * HEAD_DIM + q_tile,
                 tl.zeros([BLOCK_M, HEAD_DIM], dtype=O.dtype.element_ty), mask=row_ok[:, None])
        tl.store(L + stat_base + rows, tl.zeros([BLOCK_M], dtype=tl.float32), mask=row_ok)
        tl.store(M + stat_base + rows, tl.full([BLOCK_M], float("-inf"), tl.float32),
                 mask=row_ok)
    # Later steps re-read O, l, m that other threads of this CTA wrote.
    tl.debug_barrier()

    for start_n in range(0, n_kv, BLOCK_N):
        cols = start_n + offs_n
        kv_ptrs = K + kv_base + cols[:, None] * HEAD_DIM + offs_d[None, :]
        k = mma_operand(tl.load(kv_ptrs, mask=cols[:, None] < n_kv, other=0.0), DOT_FP32)
        v = tl.load(V + kv_base + cols[:, None] * HEAD_DIM + offs_d[None, :],
                    mask=cols[:, None] < n_kv, other=0.0)
        first, _, _ = q_blocks_visible(start_n, n_q, causal_off, CAUSAL, BLOCK_M, BLOCK_N)
        for start_m in range(first * BLOCK_M, n_qblocks * BLOCK_M, BLOCK_M):
            rows = start_m + offs_m
            row_ok = rows < n_q
            tile = q_base + start_m * HEAD_DIM + q_tile
            q = tl.load(Q + tile, mask=row_ok[:, None], other=0.0)
            o = tl.load(O + tile, mask=row_ok[:, None], other=0.0).to(tl.float32)
            l_i = tl.load(L + stat_base + rows, mask=row_ok, other=0.0)
            m_i = tl.load(M + stat_base + rows, mask=row_ok, other=float("-inf"))
            s = tl.dot(mma_operand(q, DOT_FP32), tl.trans(k)) * sm_scale
            visible = cols[None, :] < n_kv
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None] + causal_off)
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            # A row that has seen no key keeps m = -inf; subtracting 0 makes its exp 0, not NaN.
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2((s - m_sub[:, None]) * 1.4426950408889634)  # 1/ln(2): exp via exp2
            alpha = tl.exp2((m_i - m_sub) * 1.4426950408889634)
            l_new = l_i * alpha + tl.sum(p, 1)
            pv = tl.dot(mma_operand(p.to(v.dtype), DOT_FP32), mma_operand(v, DOT_FP32))
            o = ((l_i * alpha)[:, None] * o + pv) / tl.where(l_new == 0.0, 1.0, l_new)[:, None]
            tl.store(O + tile, o.to(O.dtype.element_ty), mask=row_ok[:, None])
            tl.store(L + stat_base + rows, l_new, mask=row_ok)
            tl.store(M + stat_base + rows, m_new, mask=row_ok)
        tl.debug_barrier()


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, tiling: Tiling,
            sm_scale: float) -> torch.Tensor:
    """Run fa1_fwd; returns o. l and m are scratch tensors in HBM, as the schedule says."""
    b, h, n_q, d = q.shape
    h_kv, n_kv = k.shape[1], k.shape[2]
    o = alloc(q.shape, q.dtype, q.device)
    l = alloc((b, h, n_q), torch.float32, q.device)  # l: [B, H, Nq] row sums
    m = alloc((b, h, n_q), torch.float32, q.device)  # m: [B, H, Nq] row maxima
    fa1_fwd[(b * h,)](q, k, v, o, l, m, sm_scale, n_q, n_kv, h, h // h_kv, CAUSAL=causal,
                      BLOCK_M=tiling.block_m, BLOCK_N=tiling.block_n, HEAD_DIM=d,
                      DOT_FP32=dot_fp32(q.dtype), num_warps=tiling.num_warps,
                      num_stages=tiling.num_stages)
    return o
