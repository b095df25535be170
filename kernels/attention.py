"""The public entry point: ``attention(q, k, v, causal, tiling, algorithm)``.

A ``torch.autograd.Function`` over the four algorithms. Forward and backward exist for
``fa2`` and ``naive``; ``fa1`` and ``decode`` are forward-only (they exist to validate the
model's forward numbers) and say so if a gradient is asked of them.
"""

from __future__ import annotations

import torch

from kernels import decode, fa1, fa2, naive
from kernels.common import check_qkv, default_tiling
from traces.tiling import Tiling

ALGORITHMS = ("naive", "fa1", "fa2", "decode")
BACKWARD_ALGORITHMS = ("naive", "fa2")


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal: bool, tiling: Tiling, bwd_tiling: Tiling, algorithm: str,
                sm_scale: float):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        saved = ()
        if algorithm == "fa2":
            o, lse = fa2.forward(q, k, v, causal, tiling, sm_scale)
            saved = (q, k, v, o, lse)
        elif algorithm == "naive":
            o, p = naive.forward(q, k, v, causal, tiling, sm_scale)
            saved = (q, k, v, o, p)
        elif algorithm == "fa1":
            o = fa1.forward(q, k, v, causal, tiling, sm_scale)
        else:
            o = decode.forward(q, k, v, causal, tiling, sm_scale)
        ctx.save_for_backward(*saved)
        ctx.causal, ctx.algorithm, ctx.sm_scale = causal, algorithm, sm_scale
        ctx.tiling = bwd_tiling
        return o

    @staticmethod
    def backward(ctx, do):
        if ctx.algorithm not in BACKWARD_ALGORITHMS:
            raise NotImplementedError(
                f"algorithm {ctx.algorithm!r} is forward-only; gradients are implemented for "
                f"{', '.join(BACKWARD_ALGORITHMS)}"
            )
        do = do.contiguous()
        if ctx.algorithm == "fa2":
            q, k, v, o, lse = ctx.saved_tensors
            dq, dk, dv = fa2.backward(do, q, k, v, o, lse, ctx.causal, ctx.tiling, ctx.sm_scale)
        else:
            q, k, v, o, p = ctx.saved_tensors
            dq, dk, dv = naive.backward(do, q, k, v, o, p, ctx.tiling, ctx.sm_scale)
        return dq, dk, dv, None, None, None, None, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              tiling: Tiling | None = None, algorithm: str = "fa2") -> torch.Tensor:
    """softmax(Q K^T / sqrt(d) [+ causal mask]) V with the Triton kernels of ``algorithm``.

    q: [B, H, Nq, d]; k, v: [B, Hkv, Nkv, d] with Hkv dividing H (GQA/MQA); float16 or
    bfloat16; d in 16, 32, 64, 128, 256. Accumulation is fp32; the output has q's dtype.
    Causal masking is bottom-right aligned (row r sees columns c <= r + Nkv - Nq); rows that
    see no key output 0. ``algorithm`` is one of naive, fa1, fa2, decode (decode needs
    Nq <= 16 and uses ``tiling.split_kv``). The backward runs with the same tiling, or,
    when none is given, with a default sized for the backward kernels.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    check_qkv(q, k, v)
    if tiling is not None and not isinstance(tiling, Tiling):
        raise TypeError(f"tiling must be a traces.tiling.Tiling, got {type(tiling).__name__}")
    bwd_tiling = tiling or default_tiling(algorithm, q.shape[-1], backward=True)
    tiling = tiling or default_tiling(algorithm, q.shape[-1])
    if algorithm == "decode":
        decode.check(q.shape[2], k.shape[2], tiling)
    sm_scale = q.shape[-1] ** -0.5
    return _Attention.apply(q, k, v, bool(causal), tiling, bwd_tiling, algorithm, sm_scale)
