"""Two float64 CPU attentions for the race: naive (holds N x N) and tiled online softmax.

Both compute ``O = softmax(Q K^T * scale) V`` for one head and write into a caller-provided
``out``, so that neither call is charged for its output — what each call allocates is its
working memory only.

- ``naive_attention`` (numpy): materialises the full N x N score matrix, then turns it into
  the probabilities in place (S and P share one buffer, so it is charged for one N x N, not
  two).
- ``tiled_attention`` (numba): walks ``tile x tile`` blocks of scores with the online softmax
  and holds exactly four buffers, allocated once per call inside the numba kernel
  (see ``tile_buffer_bytes``), whatever N is.

Numba allocates through its own runtime (NRT). Recent numba (checked on 0.68) installs
``PyMem_RawMalloc`` as the NRT allocator, which ``tracemalloc`` traces; older or differently
built numba may not, so ``tracemalloc_sees_numba`` probes the numba at hand.
"""

from __future__ import annotations

import functools
import gc
import math
import tracemalloc
from collections.abc import Callable

import numba
import numpy as np

FLOAT64_BYTES = 8
TILED_BUFFERS = 4  # s_tile, acc, m_i, l_i: allocations the tiled kernel makes per call
# The NRT also allocates one small header per array argument (q, k, v, out) it is handed.
TILED_ARRAY_ARGS = 4
_PROBE_ELEMENTS = 1 << 17  # 1 MiB of float64: far above any Python-side noise of a call


def naive_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray) -> None:
    """``out = softmax(q k^T / sqrt(d)) v`` through the full score matrix."""
    # q, k, v, out: [N, d] float64
    scale = 1.0 / math.sqrt(q.shape[1])
    s = q @ k.T  # s: [N, N] — the allocation the race is about
    s *= scale
    s -= s.max(axis=1, keepdims=True)
    np.exp(s, out=s)  # p: [N, N], in place of s
    s /= s.sum(axis=1, keepdims=True)
    np.matmul(s, v, out=out)


def tile_buffer_bytes(tile: int, head_dim: int) -> int:
    """Bytes of the buffers ``_tiled_kernel`` allocates: exactly what its ``np.empty`` ask for.

    ``s_tile [tile, tile]``, ``acc [tile, d]``, ``m_i [tile]`` and ``l_i [tile]``, float64
    (array data only; numba's per-array header of a few dozen bytes is not counted).
    """
    return FLOAT64_BYTES * (tile * tile + tile * head_dim + 2 * tile)


@numba.njit(cache=True)
def _probe_kernel(n):  # pragma: no cover - compiled by numba
    buf = np.empty(n)
    buf[0] = 1.0
    return buf[0]


def traced_peak_bytes(call: Callable[[], object]) -> int:
    """Peak bytes ``tracemalloc`` traces during ``call()``, above what was live before it."""
    gc.collect()
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        call()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        if not was_tracing:
            tracemalloc.stop()
    return peak - base


@functools.cache
def tracemalloc_sees_numba() -> bool:
    """Whether ``tracemalloc`` counts arrays that a numba kernel allocates (probed once)."""
    _probe_kernel(1)  # compile or load the cache outside the traced region
    peak = traced_peak_bytes(lambda: _probe_kernel(_PROBE_ELEMENTS))
    return peak >= _PROBE_ELEMENTS * FLOAT64_BYTES


def numba_allocations(call: Callable[[], object]) -> int | None:
    """Allocations numba's runtime makes during ``call()``; None if its stats are unavailable."""
    try:
        from numba.core.runtime import _nrt_python as nrt
        from numba.core.runtime import rtsys
    except ImportError:  # pragma: no cover - numba internals moved
        return None
    if not hasattr(nrt, "memsys_enable_stats"):  # pragma: no cover
        return None
    was_enabled = nrt.memsys_stats_enabled()
    nrt.memsys_enable_stats()
    try:
        before = rtsys.get_allocation_stats().alloc
        call()
        return rtsys.get_allocation_stats().alloc - before
    finally:
        if not was_enabled:
            nrt.memsys_disable_stats()


@numba.njit(cache=True)
def _tiled_kernel(q, k, v, out, scale, tile):  # pragma: no cover - compiled by numba
    # q, k, v, out: [N, d]; one query block of TILE rows at a time, K/V in blocks of TILE.
    n, d = q.shape
    s_tile = np.empty((tile, tile))  # scores of one (query block, key block) tile
    acc = np.empty((tile, d))  # unnormalised output rows of the query block
    m_i = np.empty(tile)  # running max per row
    l_i = np.empty(tile)  # running sum per row
    for i0 in range(0, n, tile):
        rows = min(tile, n - i0)
        for r in range(rows):
            m_i[r] = -np.inf
            l_i[r] = 0.0
            for c in range(d):
                acc[r, c] = 0.0
        for j0 in range(0, n, tile):
            cols = min(tile, n - j0)
            for r in range(rows):
                m_new = m_i[r]
                for j in range(cols):
                    dot = 0.0
                    for c in range(d):
                        dot += q[i0 + r, c] * k[j0 + j, c]
                    s_tile[r, j] = dot * scale
                    if s_tile[r, j] > m_new:
                        m_new = s_tile[r, j]
                alpha = math.exp(m_i[r] - m_new)  # rescale what was summed against m_old
                l_i[r] *= alpha
                for c in range(d):
                    acc[r, c] *= alpha
                for j in range(cols):
                    p = math.exp(s_tile[r, j] - m_new)
                    l_i[r] += p
                    for c in range(d):
                        acc[r, c] += p * v[j0 + j, c]
                m_i[r] = m_new
        for r in range(rows):
            inv = 1.0 / l_i[r]
            for c in range(d):
                out[i0 + r, c] = acc[r, c] * inv


def tiled_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray, tile: int = 64
) -> None:
    """``out = softmax(q k^T / sqrt(d)) v`` one ``tile x tile`` block of scores at a time."""
    _tiled_kernel(q, k, v, out, 1.0 / math.sqrt(q.shape[1]), tile)
