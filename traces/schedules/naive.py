"""Standard attention (the FlashAttention paper's Algorithm 0 and its backward) as tiled kernels.

Every N x N intermediate (S, P, and in the backward dP, dS) is written to HBM and read back.
Naive computes every block, causal or not: the mask is applied inside the softmax.
Kernels and their grids are listed in docs/schedules.md.
"""

from __future__ import annotations

import numpy as np

from traces.problem import AttentionProblem
from traces.schedules.base import (
    LOAD,
    STORE,
    Access,
    Compute,
    Kernel,
    Tensor,
    cdiv,
    grid_coords,
    pow2_at_least,
    tile_compute,
    valid_extent,
)
from traces.schedules.fa2 import kv_plane
from traces.schedules.mma_layout import Dot
from traces.tiling import Tiling


def forward_tensors(p: AttentionProblem) -> list[Tensor]:
    s, bh, bkv = p.elem_bytes, p.batch * p.heads, p.batch * p.kv_heads
    return [
        Tensor("q", bh, p.seq_q, p.head_dim, s),
        Tensor("k", bkv, p.seq_kv, p.head_dim, s),
        Tensor("v", bkv, p.seq_kv, p.head_dim, s),
        Tensor("o", bh, p.seq_q, p.head_dim, s),
        Tensor("s", bh, p.seq_q, p.seq_kv, s),
        Tensor("p", bh, p.seq_q, p.seq_kv, s),
    ]


def backward_tensors(p: AttentionProblem) -> list[Tensor]:
    s, bh, bkv = p.elem_bytes, p.batch * p.heads, p.batch * p.kv_heads
    return [
        Tensor("do", bh, p.seq_q, p.head_dim, s),
        Tensor("dq", bh, p.seq_q, p.head_dim, s),
        Tensor("dk", bkv, p.seq_kv, p.head_dim, s),
        Tensor("dv", bkv, p.seq_kv, p.head_dim, s),
        Tensor("dp", bh, p.seq_q, p.seq_kv, s),
        Tensor("ds", bh, p.seq_q, p.seq_kv, s),
    ]


class _Blocks:
    """Helpers shared by the naive kernels of one problem and tiling."""

    def __init__(self, p: AttentionProblem, t: Tiling, tensors: dict[str, Tensor]):
        self.p, self.t, self.tensors = p, t, tensors
        self.bm, self.bn, self.d, self.s = t.block_m, t.block_n, p.head_dim, p.elem_bytes
        self.tr, self.tc = cdiv(p.seq_q, self.bm), cdiv(p.seq_kv, self.bn)

    def rows(self, i):
        return valid_extent(i, self.bm, self.p.seq_q)

    def cols(self, j):
        return valid_extent(j, self.bn, self.p.seq_kv)

    def matmul(self, rows, cols):
        """Tensor FLOPs of one (rows x cols x d) product."""
        return 2 * rows * cols * self.d

    def tile_step(self, work, i_of, j_of, when=None):
        """A compute step on the (BM x BN) tile of Q block ``i_of(ctx)`` and K/V block
        ``j_of(ctx)``: ``work(rows, cols)`` counted on its valid elements, issued whole."""
        return tile_compute(work, lambda c: self.rows(i_of(c)), lambda c: self.cols(j_of(c)),
                            self.bm, self.bn, when)

    def matmul_step(self, i_of, j_of):
        """One (BM x BN x d) product, nothing else."""
        return self.tile_step(lambda rows, cols: (self.matmul(rows, cols), 0, 0), i_of, j_of)

    def kernel(self, name, ctas, count, pre, loop, post, sram, mma_rows=0, dot=None):
        """``dot``: the kernel's one matmul (a lone one: ``mma_layout``), if it has one."""
        return Kernel(name=name, ctas=ctas, loop_count=np.asarray(count, dtype=np.int64),
                      pre=pre, loop=loop, post=post, sram_bytes=sram, tensors=self.tensors,
                      mma_rows=mma_rows, dots=() if dot is None else (dot,))

    def tile_grid(self):
        """One CTA per (BM x BN) tile: grid (Tc, Tr, B*H), column block fastest."""
        return grid_coords(("j", self.tc), ("i", self.tr), ("bh", self.p.batch * self.p.heads))

    def row_grid(self):
        return grid_coords(("i", self.tr), ("bh", self.p.batch * self.p.heads))

    def kv_grid(self):
        return grid_coords(("j", self.tc), ("bkv", self.p.batch * self.p.kv_heads))

    def group_loop(self, c):
        """Loop of a per-K/V-block kernel: (group head, Q block) -> (q plane, i)."""
        g, i = np.divmod(c["t"], self.tr)
        b, kvh = np.divmod(c["bkv"], self.p.kv_heads)
        return b * self.p.heads + kvh * self.p.group_size + g, i


def forward(p: AttentionProblem, t: Tiling, tensors: dict[str, Tensor]) -> list[Kernel]:
    k = _Blocks(p, t, tensors)
    bm, bn, d, s = k.bm, k.bn, k.d, k.s

    def q_i(c):
        return c["bh"], c["i"], 0

    def k_j(c):
        return kv_plane(p, c["bh"]), c["j"], 0

    def s_ij(c):
        return c["bh"], c["i"], c["j"]

    def qk(rows, cols):
        return k.matmul(rows, cols), 0, rows * cols  # and the scale

    tiles = k.tile_grid()
    qk_kernel = k.kernel("naive_qk", tiles, np.zeros(tiles["i"].size), [
        Access(LOAD, "q", bm, d, q_i), Access(LOAD, "k", bn, d, k_j),
        k.tile_step(qk, lambda c: c["i"], lambda c: c["j"]),
        Access(STORE, "s", bm, bn, s_ij)], [], [], (bm + bn) * d * s, mma_rows=bm,
        dot=Dot(bm, bn, d))

    rows = grid_coords(("r", p.seq_q), ("bh", p.batch * p.heads))

    def row(c):
        return c["bh"], c["r"], 0

    def softmax(n):
        return 0, n, 4 * n  # mask+max, subtract, sum, divide per element; one exp each

    row_width = pow2_at_least(p.seq_kv, 16)  # the twin's ROW

    softmax_kernel = k.kernel("naive_softmax", rows, np.zeros(rows["r"].size), [
        Access(LOAD, "s", 1, p.seq_kv, row),
        Compute(lambda c: softmax(p.seq_kv), issued=lambda c: softmax(row_width)),
        Access(STORE, "p", 1, p.seq_kv, row)], [], [], 0)

    blocks = k.row_grid()

    def p_it(c):
        return c["bh"], c["i"], c["t"]

    def v_t(c):
        return kv_plane(p, c["bh"]), c["t"], 0

    pv_kernel = k.kernel("naive_pv", blocks, np.full(blocks["i"].size, k.tc), [], [
        Access(LOAD, "p", bm, bn, p_it), Access(LOAD, "v", bn, d, v_t),
        k.matmul_step(lambda c: c["i"], lambda c: c["t"])],
        [Access(STORE, "o", bm, d, q_i)], t.num_stages * (bm * bn + bn * d) * s,
        mma_rows=bm, dot=Dot(bm, d, bn))
    return [qk_kernel, softmax_kernel, pv_kernel]


def backward(p: AttentionProblem, t: Tiling, tensors: dict[str, Tensor]) -> list[Kernel]:
    k = _Blocks(p, t, tensors)
    bm, bn, d, s, g = k.bm, k.bn, k.d, k.s, p.group_size
    per_kv_block = g * k.tr

    def own_kv(c):
        return c["bkv"], c["j"], 0

    def looped_tile(name):
        def coords(c):
            plane, i = k.group_loop(c)
            return plane, i, c["j"]
        return coords

    def looped_q(c):
        plane, i = k.group_loop(c)
        return plane, i, 0

    def loop_i(c):
        return k.group_loop(c)[1]

    def own_j(c):
        return c["j"]

    kv_blocks = k.kv_grid()
    streamed = t.num_stages * (bm * bn + bm * d) * s
    dv = k.kernel("naive_bwd_dv", kv_blocks, np.full(kv_blocks["j"].size, per_kv_block), [],
                  [Access(LOAD, "p", bm, bn, looped_tile("p")),
                   Access(LOAD, "do", bm, d, looped_q),
                   k.matmul_step(loop_i, own_j)],
                  [Access(STORE, "dv", bn, d, own_kv)], streamed, mma_rows=bn,
                  dot=Dot(bn, d, bm))

    tiles = k.tile_grid()

    def q_i(c):
        return c["bh"], c["i"], 0

    def v_j(c):
        return kv_plane(p, c["bh"]), c["j"], 0

    def tile_ij(c):
        return c["bh"], c["i"], c["j"]

    dp = k.kernel("naive_bwd_dp", tiles, np.zeros(tiles["i"].size), [
        Access(LOAD, "do", bm, d, q_i), Access(LOAD, "v", bn, d, v_j),
        k.matmul_step(lambda c: c["i"], lambda c: c["j"]),
        Access(STORE, "dp", bm, bn, tile_ij)], [], [], (bm + bn) * d * s, mma_rows=bm,
        dot=Dot(bm, bn, d))

    blocks = k.row_grid()

    def tile_it(c):
        return c["bh"], c["i"], c["t"]

    def kv_t(c):
        return kv_plane(p, c["bh"]), c["t"], 0

    ds = k.kernel("naive_bwd_ds", blocks, np.full(blocks["i"].size, k.tc), [
        Access(LOAD, "do", bm, d, q_i), Access(LOAD, "o", bm, d, q_i),
        Compute(lambda c: (0, 0, 2 * k.rows(c["i"]) * d), issued=lambda c: (0, 0, 2 * bm * d))],
        [
        Access(LOAD, "p", bm, bn, tile_it), Access(LOAD, "dp", bm, bn, tile_it),
        k.tile_step(lambda rows, cols: (0, 0, 2 * rows * cols), lambda c: c["i"],
                    lambda c: c["t"]),
        Access(STORE, "ds", bm, bn, tile_it)], [],
        2 * bm * d * s + t.num_stages * 2 * bm * bn * s)

    dq = k.kernel("naive_bwd_dq", blocks, np.full(blocks["i"].size, k.tc), [], [
        Access(LOAD, "ds", bm, bn, tile_it), Access(LOAD, "k", bn, d, kv_t),
        k.matmul_step(lambda c: c["i"], lambda c: c["t"])],
        [Access(STORE, "dq", bm, d, q_i)], t.num_stages * (bm * bn + bn * d) * s,
        mma_rows=bm, dot=Dot(bm, d, bn))

    dk = k.kernel("naive_bwd_dk", kv_blocks, np.full(kv_blocks["j"].size, per_kv_block), [],
                  [Access(LOAD, "ds", bm, bn, looped_tile("ds")),
                   Access(LOAD, "q", bm, d, looped_q),
                   k.matmul_step(loop_i, own_j)],
                  [Access(STORE, "dk", bn, d, own_kv)], streamed, mma_rows=bn,
                  dot=Dot(bn, d, bm))
    return [dv, dp, ds, dq, dk]
