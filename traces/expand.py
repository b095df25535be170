"""Expand a compact ``Kernel`` into its access records, one per load, store or compute step.

Records of one kernel are ordered as the CTAs run them: CTA by CTA in launch order, and
within a CTA prologue, loop iterations, epilogue. Each step of the program template is evaluated
once with numpy for all CTAs (or all iterations); a numba pass then writes the records.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from traces.schedules.base import (
    COMPUTE,
    LOOP,
    POST,
    PRE,
    Access,
    Kernel,
    step_mask,
)

RECORD_DTYPE = np.dtype(
    [
        ("cta", "<u4"),  # CTA index in launch order
        ("phase", "u1"),  # 0 prologue, 1 loop, 2 epilogue
        ("step", "<u4"),  # loop iteration (0 outside the loop)
        ("op", "u1"),  # 0 load, 1 store, 2 compute
        ("tensor", "u1"),  # index into the trace's tensor names (255 for compute)
        ("plane", "<u4"),  # batch*heads plane of the tensor view
        ("row_block", "<u4"),
        ("col_block", "<u4"),
        ("rows", "<u4"),  # valid rows of the tile
        ("row_bytes", "<u4"),  # valid bytes per row
        ("row_stride", "<u8"),  # bytes between rows in memory
        ("address", "<u8"),  # virtual address of the tile's first byte
        ("bytes", "<u8"),  # bytes moved (valid elements only)
        ("tensor_flops", "<u8"),
        ("exp_ops", "<u8"),
        ("other_flops", "<u8"),
    ]
)
NO_TENSOR = 255


# Per-step metadata columns, one row per program step.
_KIND, _TENSOR, _TILE_ROWS, _TILE_COLS, _ROWS, _COLS, _ELEM, _BASE = range(8)


def _evaluate(steps, ctx: dict, tensor_ids: dict, tensors: dict):
    """Evaluate every step of a phase for all its units (CTAs or iterations) at once.

    Returns ``values[k, 0:3, u]`` (tile coordinates, or compute amounts), ``masks[k, u]``
    and ``meta[k, :]`` (kind, tensor id, tile shape, tensor shape, element bytes, base).
    """
    units = ctx["cta"].shape[0]
    values = np.zeros((len(steps), 3, units), dtype=np.int64)
    masks = np.ones((len(steps), units), dtype=np.bool_)
    meta = np.zeros((len(steps), 8), dtype=np.int64)
    for k, step in enumerate(steps):
        if isinstance(step, Access):
            t = tensors[step.tensor]
            meta[k] = (step.kind, tensor_ids[step.tensor], step.tile_rows, step.tile_cols,
                       t.rows, t.cols, t.elem_bytes, t.base)
            produced = step.coords(ctx)
        else:
            meta[k, _KIND] = COMPUTE
            meta[k, _TENSOR] = NO_TENSOR
            produced = step.amounts(ctx)
        for f, column in enumerate(produced):
            values[k, f] = column
        if step.when is not None:
            masks[k] = step_mask(step, ctx)
    return values, masks, meta


@njit(cache=True)
def _emit(out, pos, cta, phase, t, values, masks, meta, u):  # pragma: no cover - numba
    for k in range(meta.shape[0]):
        if not masks[k, u]:
            continue
        r = out[pos]
        r.cta = cta
        r.phase = phase
        r.step = t
        r.op = meta[k, _KIND]
        r.tensor = meta[k, _TENSOR]
        a, b, c = values[k, 0, u], values[k, 1, u], values[k, 2, u]
        if meta[k, _KIND] == COMPUTE:
            r.plane = 0
            r.row_block = 0
            r.col_block = 0
            r.rows = 0
            r.row_bytes = 0
            r.row_stride = 0
            r.address = 0
            r.bytes = 0
            r.tensor_flops = a
            r.exp_ops = b
            r.other_flops = c
        else:
            tile_rows, tile_cols = meta[k, _TILE_ROWS], meta[k, _TILE_COLS]
            rows, cols, elem = meta[k, _ROWS], meta[k, _COLS], meta[k, _ELEM]
            vrows = min(max(rows - b * tile_rows, 0), tile_rows)
            vcols = min(max(cols - c * tile_cols, 0), tile_cols)
            r.plane = a
            r.row_block = b
            r.col_block = c
            r.rows = vrows
            r.row_bytes = vcols * elem
            r.row_stride = cols * elem
            r.address = meta[k, _BASE] + ((a * rows + b * tile_rows) * cols + c * tile_cols) * elem
            r.bytes = vrows * vcols * elem
            r.tensor_flops = 0
            r.exp_ops = 0
            r.other_flops = 0
        pos += 1
    return pos


@njit(cache=True)
def _assemble(out, loop_count, pre, loop, post):  # pragma: no cover - numba
    pos = 0
    u = 0
    for cta in range(loop_count.shape[0]):
        pos = _emit(out, pos, cta, PRE, 0, pre[0], pre[1], pre[2], cta)
        for t in range(loop_count[cta]):
            pos = _emit(out, pos, cta, LOOP, t, loop[0], loop[1], loop[2], u)
            u += 1
        pos = _emit(out, pos, cta, POST, 0, post[0], post[1], post[2], cta)
    return pos


def expand_kernel(kernel: Kernel, tensor_ids: dict[str, int]) -> np.ndarray:
    """All records of ``kernel`` as a ``RECORD_DTYPE`` array, in execution order.

    Steps are evaluated with numpy for all CTAs/iterations at once; one compiled pass then
    writes the records in order (sequential writes: this is memory-bound).
    """
    ids = {name: tensor_ids[name] for name in kernel.tensors if name in tensor_ids}
    pre = _evaluate(kernel.pre, kernel.cta_context(), ids, kernel.tensors)
    loop = _evaluate(kernel.loop, kernel.loop_context(), ids, kernel.tensors)
    post = _evaluate(kernel.post, kernel.cta_context(), ids, kernel.tensors)
    total = int(pre[1].sum() + loop[1].sum() + post[1].sum())
    out = np.empty(total, dtype=RECORD_DTYPE)  # every field of every record is written
    written = _assemble(out, kernel.loop_count.astype(np.int64), pre, loop, post)
    assert written == total
    return out
