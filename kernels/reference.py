"""Reference attention: float64 truth and a plain PyTorch implementation at low precision.

``reference_attention`` (float64, on the CPU by default) is what every kernel is checked
against. ``pytorch_attention`` is the same formula run in the inputs' own dtype; its error
against the float64 truth sets the tolerance of FlashAttention's test rule
``max|out - ref| <= 2 * max|out_pt - ref|``.
"""

from __future__ import annotations

import torch


def _expand_kv(k: torch.Tensor, v: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Repeat each K/V head for its group of query heads (GQA): [B, Hkv, N, d] -> [B, H, N, d]."""
    group = heads // k.shape[1]
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)


def causal_mask(n_q: int, n_kv: int, device=None) -> torch.Tensor:
    """[Nq, Nkv] bool, True where query row r may see key column c: c <= r + (Nkv - Nq)."""
    rows = torch.arange(n_q, device=device)[:, None]
    cols = torch.arange(n_kv, device=device)[None, :]
    return cols <= rows + (n_kv - n_q)


def pytorch_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                      sm_scale: float | None = None) -> torch.Tensor:
    """softmax(scale * Q K^T + mask) V in the inputs' dtype, as PyTorch computes it.

    Rows that see no key output 0 (where softmax alone would give NaN), as the kernels do.
    """
    scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    k, v = _expand_kv(k, v, q.shape[1])
    s = torch.matmul(q, k.transpose(-1, -2)) * scale  # s: [B, H, Nq, Nkv]
    if causal:
        visible = causal_mask(q.shape[2], k.shape[2], q.device)
        s = s.masked_fill(~visible, float("-inf"))
        p = torch.softmax(s, dim=-1).masked_fill(~visible.any(-1, keepdim=True), 0.0)
    else:
        p = torch.softmax(s, dim=-1)
    return torch.matmul(p.to(v.dtype), v)


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                        sm_scale: float | None = None) -> torch.Tensor:
    """The float64 truth: ``pytorch_attention`` on float64 CPU copies of the inputs.

    Differentiable: gradients through it (``torch.autograd.grad``) are float64 gradients.
    """
    as64 = [t.detach().to("cpu", torch.float64).requires_grad_(t.requires_grad)
            for t in (q, k, v)]
    return pytorch_attention(*as64, causal=causal, sm_scale=sm_scale)


def reference_gradients(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
                        causal: bool = False, sm_scale: float | None = None):
    """Float64 (out, dq, dk, dv) for upstream gradient ``do``, by autograd in float64."""
    q64, k64, v64 = (t.detach().to("cpu", torch.float64).requires_grad_() for t in (q, k, v))
    out = pytorch_attention(q64, k64, v64, causal=causal, sm_scale=sm_scale)
    dq, dk, dv = torch.autograd.grad(out, (q64, k64, v64), do.to("cpu", torch.float64))
    return out.detach(), dq, dk, dv
