"""Schedules: what each attention algorithm's kernels load, store and compute.

``build_schedule(problem, tiling, name)`` returns a ``Schedule``: the tensors in one
virtual address space and the kernel launches of the problem's pass, in order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from traces.problem import AttentionProblem, ProblemError
from traces.schedules import decode, fa1, fa2, naive
from traces.schedules.base import (
    LOAD,
    STORE,
    Kernel,
    Tensor,
    allocate,
    step_mask,
    valid_extent,
)
from traces.tiling import Tiling

SCHEDULE_NAMES = ("naive", "fa1", "fa2", "decode")
_MODULES = {"naive": naive, "fa1": fa1, "fa2": fa2, "decode": decode}
DECODE_MAX_SEQ_Q = 16


@dataclass
class Schedule:
    name: str
    problem: AttentionProblem
    tiling: Tiling
    tensors: dict[str, Tensor]
    kernels: list[Kernel]

    @property
    def tensor_names(self) -> list[str]:
        return list(self.tensors)

    @property
    def device_bytes(self) -> int:
        return device_bytes(self.tensors)


def device_bytes(tensors: dict[str, Tensor]) -> int:
    """Bytes of the virtual address space the tensors span (with their alignment): the
    device memory a schedule's kernels need, every tensor allocated at once."""
    return max((t.base + t.nbytes for t in tensors.values()), default=0)


def check_supported(problem: AttentionProblem, tiling: Tiling, name: str) -> None:
    if name not in SCHEDULE_NAMES:
        raise ProblemError(f'unknown schedule "{name}"; known: {", ".join(SCHEDULE_NAMES)}')
    if name in ("fa1", "decode") and problem.pass_ != "fwd":
        raise ProblemError(f'schedule "{name}" has a forward pass only; use --pass fwd')
    if name == "decode":
        decode.check(problem, tiling)
    elif tiling.split_kv != 1:
        raise ProblemError(f'"split_kv" applies to the decode schedule only, not "{name}"')


def schedule_tensors(problem: AttentionProblem, tiling: Tiling, name: str) -> dict[str, Tensor]:
    """The tensors of the schedule's pass in one address space, without its kernels (cheap
    at any size, unlike the kernels' per-CTA coordinates)."""
    check_supported(problem, tiling, name)
    module = _MODULES[name]
    if name == "decode":
        wanted = decode.tensors_for(problem, tiling)
    else:
        wanted = list(module.forward_tensors(problem))
    if problem.pass_ != "fwd":
        wanted += module.backward_tensors(problem)
    return allocate(wanted)


def build_schedule(problem: AttentionProblem, tiling: Tiling, name: str) -> Schedule:
    tensors = schedule_tensors(problem, tiling, name)
    module = _MODULES[name]
    kernels: list[Kernel] = []
    if problem.pass_ in ("fwd", "fwd+bwd"):
        fwd = module.forward(problem, tiling, tensors)
        kernels += fwd if isinstance(fwd, list) else [fwd]
    if problem.pass_ in ("bwd", "fwd+bwd"):
        kernels += module.backward(problem, tiling, tensors)
    return Schedule(name, problem, tiling, tensors, kernels)


def _phase_traffic(kernel: Kernel, steps, ctx: dict, totals: dict) -> None:
    for step in steps:
        if step.kind not in (LOAD, STORE):
            continue
        mask = step_mask(step, ctx)
        sub = ctx if mask.all() else {n: v[mask] for n, v in ctx.items()}
        t = kernel.tensors[step.tensor]
        _, rb, cb = (np.broadcast_to(np.asarray(a, dtype=np.int64), sub["cta"].shape)
                     for a in step.coords(sub))
        nbytes = int((valid_extent(rb, step.tile_rows, t.rows)
                      * valid_extent(cb, step.tile_cols, t.cols)).sum()) * t.elem_bytes
        key = "global_read" if step.kind == LOAD else "global_write"
        totals.setdefault(step.tensor, {"global_read": 0, "global_write": 0})[key] += nbytes


def kernel_traffic(problem: AttentionProblem, tiling: Tiling, schedule: str) -> list[dict]:
    """Global bytes each kernel reads and writes, per tensor, from the schedule's program.

    Evaluated step by step over all CTAs (no record array is built), so it is cheap; it is
    the same program ``tilesim trace`` expands, and the kernels' twin test compares against it.
    """
    sched = build_schedule(problem, tiling, schedule)
    result = []
    for k in sched.kernels:
        totals: dict = {}
        cta_ctx = k.cta_context()
        _phase_traffic(k, k.pre, cta_ctx, totals)
        _phase_traffic(k, k.post, cta_ctx, totals)
        if k.loop and k.loop_count.sum():
            _phase_traffic(k, k.loop, k.loop_context(), totals)
        result.append({"name": k.name, "grid": k.grid, "per_tensor": totals})
    return result
