"""What validation runs for one config: its inputs, the call that is timed, and its peers.

A config is (schedule, problem, tiling). Its call is the schedule's pass and nothing else:
``fa2`` forward launches ``fa2_fwd``; ``fa2`` backward launches the three backward kernels
on a forward output computed beforehand (the setup, not timed); ``naive`` forward launches
its three kernels; ``decode`` its two. The kernels it launches are the schedule's
(``traces.schedules``), which is how Nsight Compute results are matched to configs.

Peers are PyTorch's own ``scaled_dot_product_attention`` on the same inputs, restricted to
one backend: MATH (a naive implementation) and FLASH.

Needs torch and the Triton kernels; imported only where they run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from traces.problem import AttentionProblem
from traces.tiling import Tiling

SEED = 20240607
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
PEERS = ("sdpa_math", "sdpa_flash")


@dataclass
class Inputs:
    """Input tensors of one problem (and the forward results a backward needs)."""

    q: torch.Tensor  # q: [B, H, Nq, d]
    k: torch.Tensor  # k: [B, Hkv, Nkv, d]
    v: torch.Tensor  # v: [B, Hkv, Nkv, d]
    do: torch.Tensor | None = None  # do: [B, H, Nq, d], backward only
    saved: dict = field(default_factory=dict)  # forward results for the backward

    @property
    def sm_scale(self) -> float:
        return self.q.shape[-1] ** -0.5


def make_inputs(problem: AttentionProblem, device: str | torch.device,
                seed: int = SEED, empty: bool = False) -> Inputs:
    """Random normal inputs (never zeros: they hide unwritten outputs), seeded per problem.

    ``empty=True`` allocates without filling, for compiling only (no values are read).
    """
    if problem.dtype not in TORCH_DTYPES:
        raise ValueError(f"the Triton kernels take fp16 or bf16, not {problem.dtype}")
    dtype = TORCH_DTYPES[problem.dtype]
    p = problem
    shapes = {"q": (p.batch, p.heads, p.seq_q, p.head_dim),
              "k": (p.batch, p.kv_heads, p.seq_kv, p.head_dim),
              "v": (p.batch, p.kv_heads, p.seq_kv, p.head_dim)}
    if p.pass_ != "fwd":
        shapes["do"] = shapes["q"]
    if empty:
        tensors = {n: torch.empty(s, dtype=dtype, device=device) for n, s in shapes.items()}
    else:
        gen = torch.Generator(device=device).manual_seed(seed)
        tensors = {n: torch.randn(s, dtype=dtype, device=device, generator=gen)
                   for n, s in shapes.items()}
    return Inputs(**tensors)


def _module(schedule: str):
    from kernels import decode, fa1, fa2, naive

    return {"fa2": fa2, "naive": naive, "decode": decode, "fa1": fa1}[schedule]


def setup_backward(schedule: str, problem: AttentionProblem, inputs: Inputs,
                   empty: bool = False) -> None:
    """Compute (or, with ``empty``, allocate) the forward results the backward reads.

    The forward runs with the kernels' default tiling whatever the config's tiling is: the
    backward's inputs do not depend on it, and one forward compile serves every tiling.
    """
    from kernels.common import default_tiling

    q, k, v = inputs.q, inputs.k, inputs.v
    if empty:
        b, h, n_q, _ = q.shape
        o = torch.empty_like(q)
        second = (torch.empty((b, h, n_q), dtype=torch.float32, device=q.device)
                  if schedule == "fa2" else
                  torch.empty((b, h, n_q, k.shape[2]), dtype=q.dtype, device=q.device))
    else:
        tiling = default_tiling(schedule, problem.head_dim)
        o, second = _module(schedule).forward(q, k, v, problem.causal, tiling, inputs.sm_scale)
    inputs.saved = {"o": o, "lse" if schedule == "fa2" else "p": second}


def kernel_call(schedule: str, problem: AttentionProblem, tiling: Tiling,
                inputs: Inputs) -> Callable[[], dict]:
    """The call that is timed; it returns its outputs by name (``o``, or ``dq, dk, dv``)."""
    mod, causal, scale = _module(schedule), problem.causal, inputs.sm_scale
    q, k, v = inputs.q, inputs.k, inputs.v
    if problem.pass_ == "fwd":
        if schedule in ("fa2", "naive"):
            return lambda: {"o": mod.forward(q, k, v, causal, tiling, scale)[0]}
        return lambda: {"o": mod.forward(q, k, v, causal, tiling, scale)}
    if problem.pass_ != "bwd":
        raise ValueError("validation times the forward and the backward pass separately")
    if not inputs.saved:
        raise ValueError("call setup_backward() before timing a backward")
    do, saved = inputs.do, inputs.saved
    if schedule == "fa2":
        def call() -> dict:
            dq, dk, dv = mod.backward(do, q, k, v, saved["o"], saved["lse"], causal, tiling,
                                      scale)
            return {"dq": dq, "dk": dk, "dv": dv}
    elif schedule == "naive":
        def call() -> dict:
            dq, dk, dv = mod.backward(do, q, k, v, saved["o"], saved["p"], tiling, scale)
            return {"dq": dq, "dk": dk, "dv": dv}
    else:
        raise ValueError(f'schedule "{schedule}" has no backward kernels')
    return call


def peer_supported(implementation: str, problem: AttentionProblem) -> str | None:
    """None if the peer can run this problem, else why not."""
    if problem.causal and problem.seq_q != problem.seq_kv:
        # SDPA's is_causal aligns the mask top-left; the kernels align it bottom-right.
        return "SDPA's causal mask is top-left aligned; the problem needs bottom-right"
    if implementation not in PEERS:
        return f"unknown peer {implementation!r}"
    return None


def peer_call(implementation: str, problem: AttentionProblem,
              inputs: Inputs) -> Callable[[], dict]:
    """PyTorch SDPA with one backend forced: the forward, or the backward via autograd."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"sdpa_math": SDPBackend.MATH, "sdpa_flash": SDPBackend.FLASH_ATTENTION}[
        implementation]
    gqa = {"enable_gqa": True} if problem.kv_heads != problem.heads else {}

    def forward(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=problem.causal,
                                                  scale=inputs.sm_scale, **gqa)

    if problem.pass_ == "fwd":
        return lambda: {"o": forward(inputs.q, inputs.k, inputs.v)}
    leaves = [t.detach().requires_grad_() for t in (inputs.q, inputs.k, inputs.v)]
    out = forward(*leaves)

    def backward() -> dict:
        dq, dk, dv = torch.autograd.grad(out, leaves, inputs.do, retain_graph=True)
        return {"dq": dq, "dk": dk, "dv": dv}

    return backward
