"""Expand a compact ``Kernel`` into its access records, one per load, store or compute step.

Records of one kernel are ordered as the CTAs run them: CTA by CTA in launch order, and
within a CTA prologue, loop iterations, epilogue. Each step of the program template is evaluated
once with numpy: prologue and epilogue for all CTAs, the loop for the iterations of one
period of CTAs (``traces.schedules.period``: CTA ``c`` runs the loop of CTA ``c % period``
moved by a plane offset per step). A numba pass then writes the records.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from traces.schedules.base import COMPUTE, LOOP, POST, PRE, Access, Kernel
from traces.schedules.period import evaluate_steps, periodic_loop

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


def _step_meta(steps, tensor_ids: dict, tensors: dict) -> np.ndarray:
    """``meta[k, :]``: kind, tensor id, tile shape, tensor shape, element bytes, base."""
    meta = np.zeros((len(steps), 8), dtype=np.int64)
    for k, step in enumerate(steps):
        if isinstance(step, Access):
            t = tensors[step.tensor]
            meta[k] = (step.kind, tensor_ids[step.tensor], step.tile_rows, step.tile_cols,
                       t.rows, t.cols, t.elem_bytes, t.base)
        else:
            meta[k, _KIND] = COMPUTE
            meta[k, _TENSOR] = NO_TENSOR
    return meta


@njit(cache=True)
def _emit(out, pos, cta, phase, t, values, masks, meta, u, plane_offset):  # pragma: no cover
    """Write the records of unit ``u`` of a phase from ``pos``; returns the next position.

    ``plane_offset[k]`` moves the plane (and so the address) of access step ``k``.
    """
    for k in range(meta.shape[0]):
        if not masks[k, u]:
            continue
        r = out[pos]
        pos += 1
        r.cta = cta
        r.phase = phase
        r.step = t
        kind = meta[k, _KIND]
        r.op = kind
        r.tensor = meta[k, _TENSOR]
        if kind == COMPUTE:
            r.plane = 0
            r.row_block = 0
            r.col_block = 0
            r.rows = 0
            r.row_bytes = 0
            r.row_stride = 0
            r.address = 0
            r.bytes = 0
            r.tensor_flops = values[k, 0, u]
            r.exp_ops = values[k, 1, u]
            r.other_flops = values[k, 2, u]
            continue
        a = values[k, 0, u] + plane_offset[k]
        b, c = values[k, 1, u], values[k, 2, u]
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
    return pos


@njit(cache=True)
def _assemble(out, loop_count, pre, loop, post, period, loop_first, offsets):  # pragma: no cover
    """Write every record, CTA by CTA: prologue, loop iterations, epilogue.

    ``offsets`` is ``[grid, k_loop]``: CTA ``c`` runs the representative loop units
    ``loop_first[c % period] + t`` with plane offsets ``offsets[c]``.
    """
    pos = 0
    no_pre_offset = np.zeros(pre[2].shape[0], dtype=np.int64)
    no_post_offset = np.zeros(post[2].shape[0], dtype=np.int64)
    for cta in range(loop_count.shape[0]):
        pos = _emit(out, pos, cta, PRE, 0, pre[0], pre[1], pre[2], cta, no_pre_offset)
        start, offset = loop_first[cta % period], offsets[cta]
        for t in range(loop_count[cta]):
            pos = _emit(out, pos, cta, LOOP, t, loop[0], loop[1], loop[2], start + t, offset)
        pos = _emit(out, pos, cta, POST, 0, post[0], post[1], post[2], cta, no_post_offset)
    return pos


def _loop_records(masks: np.ndarray, first: np.ndarray, count: np.ndarray) -> int:
    """Records the loop writes: each CTA's mask hits over units ``first .. first+count``."""
    hits = np.concatenate([[0], np.cumsum(masks.sum(axis=0))])
    return int((hits[first + count] - hits[first]).sum())


def expand_kernel(kernel: Kernel, tensor_ids: dict[str, int], compress: bool = True,
                  ) -> np.ndarray:
    """All records of ``kernel`` as a ``RECORD_DTYPE`` array, in execution order.

    Prologue and epilogue are evaluated with numpy for all CTAs, the loop for one verified
    period of CTAs (``traces.schedules.period``; ``compress=False`` evaluates every CTA's
    loop, the records are the same); one compiled pass then writes the records in order
    (sequential writes: this is memory-bound).
    """
    ids = {name: tensor_ids[name] for name in kernel.tensors if name in tensor_ids}
    cta_ctx = kernel.cta_context()
    pre = (*evaluate_steps(kernel.pre, cta_ctx), _step_meta(kernel.pre, ids, kernel.tensors))
    post = (*evaluate_steps(kernel.post, cta_ctx), _step_meta(kernel.post, ids, kernel.tensors))
    periodic = periodic_loop(kernel, compress)
    loop = (periodic.values, periodic.masks, _step_meta(kernel.loop, ids, kernel.tensors))
    loop_count = kernel.loop_count.astype(np.int64)
    reps = np.arange(kernel.grid, dtype=np.int64) % periodic.period
    total = int(pre[1].sum() + post[1].sum()) + _loop_records(
        periodic.masks, periodic.loop_first[reps], loop_count)
    out = np.empty(total, dtype=RECORD_DTYPE)  # every field of every record is written
    written = _assemble(out, loop_count, pre, loop, post, periodic.period, periodic.loop_first,
                        np.ascontiguousarray(periodic.plane_offset.T))
    assert written == total
    return out
