"""Exact traffic and work counts in closed form, written independently of the schedules' code.

For every kernel of every schedule this module gives, from formulas over the block
structure (sums over block rows where causal masking makes them differ), the global bytes
each tensor reads and writes, and the tensor-core FLOPs, exps and other FLOPs. The trace
replay must agree with these numbers exactly; ``tests/test_counting.py`` checks that with
hypothesis over random problems and tilings.

Notation as in docs/schedules.md: ``s`` dtype bytes, ``Tr``/``Tc`` block counts, ``G``
group size. Counts are per (batch, head) or per (batch, kv head) and then multiplied.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from traces.problem import STATS_BYTES, AttentionProblem
from traces.tiling import Tiling

PARTIAL_BYTES = 4


@dataclass
class KernelCount:
    name: str
    grid: int
    reads: dict[str, int] = field(default_factory=dict)
    writes: dict[str, int] = field(default_factory=dict)
    tensor_flops: int = 0
    exp_ops: int = 0
    other_flops: int = 0

    def read(self, tensor: str, nbytes: int) -> None:
        self.reads[tensor] = self.reads.get(tensor, 0) + int(nbytes)

    def write(self, tensor: str, nbytes: int) -> None:
        self.writes[tensor] = self.writes.get(tensor, 0) + int(nbytes)

    def work(self, tensor_flops: int, exp_ops: int, other_flops: int) -> None:
        self.tensor_flops += int(tensor_flops)
        self.exp_ops += int(exp_ops)
        self.other_flops += int(other_flops)


class Blocks:
    """Block structure of a problem under a tiling, as plain formulas."""

    def __init__(self, p: AttentionProblem, t: Tiling):
        self.p, self.t = p, t
        self.bm, self.bn = t.block_m, t.block_n
        self.tr = -(-p.seq_q // self.bm)
        self.tc = -(-p.seq_kv // self.bn)
        i = np.arange(self.tr, dtype=np.int64)
        j = np.arange(self.tc, dtype=np.int64)
        self.rows = np.minimum(self.bm, p.seq_q - i * self.bm)  # valid rows of Q block i
        self.cols = np.minimum(self.bn, p.seq_kv - j * self.bn)  # valid cols of K/V block j
        offset = p.seq_kv - p.seq_q
        if p.causal:
            # Q block i needs K/V blocks up to the one holding column last_row(i) + offset.
            last_row = i * self.bm + self.rows - 1
            self.visible = np.clip((last_row + offset) // self.bn + 1, 0, self.tc)
            # K/V block j is needed by Q blocks from the one holding row j*BN - offset on.
            first_row = np.maximum(j * self.bn - offset, 0)
            self.first = np.where(first_row < p.seq_q, first_row // self.bm, self.tr)
        else:
            self.visible = np.full(self.tr, self.tc, dtype=np.int64)
            self.first = np.zeros(self.tc, dtype=np.int64)
        # Valid key columns Q block i visits, and valid query rows K/V block j visits.
        self.span = np.minimum(self.visible * self.bn, p.seq_kv)
        self.qrows = np.maximum(p.seq_q - self.first * self.bm, 0)
        self.visits = self.tr - self.first  # Q blocks K/V block j visits

    @property
    def rows_x_span(self) -> int:
        """Sum over visited (i, j) blocks of valid rows x valid cols."""
        return int((self.rows * self.span).sum())

    @property
    def rows_x_visible(self) -> int:
        return int((self.rows * self.visible).sum())


def fa2_forward(p: AttentionProblem, t: Tiling) -> list[KernelCount]:
    b, s, d = Blocks(p, t), p.elem_bytes, p.head_dim
    bh = p.batch * p.heads
    k = KernelCount("fa2_fwd", b.tr * bh)
    k.read("q", bh * p.seq_q * d * s)
    k.read("k", bh * int(b.span.sum()) * d * s)
    k.read("v", bh * int(b.span.sum()) * d * s)
    k.write("o", bh * p.seq_q * d * s)
    k.write("lse", bh * p.seq_q * STATS_BYTES)
    rs, rv = b.rows_x_span, b.rows_x_visible
    k.work(bh * 4 * d * rs, bh * (rs + rv + p.seq_q),
           bh * (4 * rs + d * rv + p.seq_q * d + p.seq_q))
    return [k]


def fa2_backward(p: AttentionProblem, t: Tiling) -> list[KernelCount]:
    b, s, d, g = Blocks(p, t), p.elem_bytes, p.head_dim, p.group_size
    bh, bkv = p.batch * p.heads, p.batch * p.kv_heads
    q_bytes, stat_bytes = p.seq_q * d * s, p.seq_q * STATS_BYTES

    pre = KernelCount("fa2_bwd_preprocess", b.tr * bh)
    pre.read("o", bh * q_bytes)
    pre.read("do", bh * q_bytes)
    pre.write("delta", bh * stat_bytes)
    pre.work(0, 0, bh * 2 * p.seq_q * d)

    dkdv = KernelCount("fa2_bwd_dkdv", b.tc * bkv)
    kv_bytes = p.seq_kv * d * s
    visited_rows = g * int(b.qrows.sum())
    for name in ("k", "v"):
        dkdv.read(name, bkv * kv_bytes)
    for name in ("q", "do"):
        dkdv.read(name, bkv * visited_rows * d * s)
    for name in ("lse", "delta"):
        dkdv.read(name, bkv * visited_rows * STATS_BYTES)
    dkdv.write("dk", bkv * kv_bytes)
    dkdv.write("dv", bkv * kv_bytes)
    area = g * int((b.cols * b.qrows).sum())
    dkdv.work(bkv * 8 * d * area, bkv * area, bkv * 4 * area)

    dq = KernelCount("fa2_bwd_dq", b.tr * bh)
    for name in ("q", "do"):
        dq.read(name, bh * q_bytes)
    for name in ("lse", "delta"):
        dq.read(name, bh * stat_bytes)
    for name in ("k", "v"):
        dq.read(name, bh * int(b.span.sum()) * d * s)
    dq.write("dq", bh * q_bytes)
    rs = b.rows_x_span
    dq.work(bh * 6 * d * rs, bh * rs, bh * 4 * rs)
    return [pre, dkdv, dq]


def fa1_forward(p: AttentionProblem, t: Tiling) -> list[KernelCount]:
    b, s, d = Blocks(p, t), p.elem_bytes, p.head_dim
    bh = p.batch * p.heads
    k = KernelCount("fa1_fwd", bh)
    # Initialisation of O, l, m in HBM.
    k.write("o", bh * p.seq_q * d * s)
    k.write("l", bh * p.seq_q * STATS_BYTES)
    k.write("m", bh * p.seq_q * STATS_BYTES)
    loaded = b.visits > 0  # K/V blocks some Q block needs are loaded once each
    for name in ("k", "v"):
        k.read(name, bh * int(b.cols[loaded].sum()) * d * s)
    pair_rows = int(b.qrows.sum())  # valid Q rows summed over all (j, i) pairs
    for name in ("q", "o"):
        k.read(name, bh * pair_rows * d * s)
    k.write("o", bh * pair_rows * d * s)
    for name in ("l", "m"):
        k.read(name, bh * pair_rows * STATS_BYTES)
        k.write(name, bh * pair_rows * STATS_BYTES)
    area = int((b.cols * b.qrows).sum())
    k.work(bh * 4 * d * area, bh * (area + 2 * pair_rows), bh * (4 * area + 3 * d * pair_rows))
    return [k]


def naive_forward(p: AttentionProblem, t: Tiling) -> list[KernelCount]:
    b, s, d = Blocks(p, t), p.elem_bytes, p.head_dim
    bh, nn = p.batch * p.heads, p.seq_q * p.seq_kv
    qk = KernelCount("naive_qk", b.tc * b.tr * bh)
    qk.read("q", bh * b.tc * p.seq_q * d * s)
    qk.read("k", bh * b.tr * p.seq_kv * d * s)
    qk.write("s", bh * nn * s)
    qk.work(bh * 2 * nn * d, 0, bh * nn)
    softmax = KernelCount("naive_softmax", p.seq_q * bh)
    softmax.read("s", bh * nn * s)
    softmax.write("p", bh * nn * s)
    softmax.work(0, bh * nn, bh * 4 * nn)
    pv = KernelCount("naive_pv", b.tr * bh)
    pv.read("p", bh * nn * s)
    pv.read("v", bh * b.tr * p.seq_kv * d * s)
    pv.write("o", bh * p.seq_q * d * s)
    pv.work(bh * 2 * nn * d, 0, 0)
    return [qk, softmax, pv]


def naive_backward(p: AttentionProblem, t: Tiling) -> list[KernelCount]:
    b, s, d, g = Blocks(p, t), p.elem_bytes, p.head_dim, p.group_size
    bh, bkv, nn = p.batch * p.heads, p.batch * p.kv_heads, p.seq_q * p.seq_kv
    q_bytes, kv_bytes = p.seq_q * d * s, p.seq_kv * d * s

    def per_kv_block(name, tile, other, out):
        k = KernelCount(name, b.tc * bkv)
        k.read(tile, bkv * g * nn * s)
        k.read(other, bkv * g * b.tc * q_bytes)
        k.write(out, bkv * kv_bytes)
        k.work(bkv * g * 2 * nn * d, 0, 0)
        return k

    dp = KernelCount("naive_bwd_dp", b.tc * b.tr * bh)
    dp.read("do", bh * b.tc * q_bytes)
    dp.read("v", bh * b.tr * kv_bytes)
    dp.write("dp", bh * nn * s)
    dp.work(bh * 2 * nn * d, 0, 0)
    ds = KernelCount("naive_bwd_ds", b.tr * bh)
    ds.read("do", bh * q_bytes)
    ds.read("o", bh * q_bytes)
    ds.read("p", bh * nn * s)
    ds.read("dp", bh * nn * s)
    ds.write("ds", bh * nn * s)
    ds.work(0, 0, bh * (2 * p.seq_q * d + 2 * nn))
    dq = KernelCount("naive_bwd_dq", b.tr * bh)
    dq.read("ds", bh * nn * s)
    dq.read("k", bh * b.tr * kv_bytes)
    dq.write("dq", bh * q_bytes)
    dq.work(bh * 2 * nn * d, 0, 0)
    return [per_kv_block("naive_bwd_dv", "p", "do", "dv"), dp, ds, dq,
            per_kv_block("naive_bwd_dk", "ds", "q", "dk")]


def decode_forward(p: AttentionProblem, t: Tiling) -> list[KernelCount]:
    b, s, d, n_split = Blocks(p, t), p.elem_bytes, p.head_dim, t.split_kv
    bkv, bh, rows = p.batch * p.kv_heads, p.batch * p.heads, p.group_size * p.seq_q
    split = KernelCount("decode_split", n_split * bkv)
    split.read("q", bkv * n_split * rows * d * s)
    # The chunks partition the K/V blocks, so each K/V row is read once per group.
    split.read("k", bkv * p.seq_kv * d * s)
    split.read("v", bkv * p.seq_kv * d * s)
    split.write("o_partial", bkv * n_split * rows * d * PARTIAL_BYTES)
    split.write("lse_partial", bkv * n_split * rows * STATS_BYTES)
    area = rows * p.seq_kv
    split.work(bkv * 4 * area * d, bkv * (area + rows * b.tc + n_split * rows),
               bkv * (4 * area + rows * d * b.tc + n_split * (rows * d + rows)))
    reduce = KernelCount("decode_reduce", bh)
    reduce.read("lse_partial", bh * n_split * p.seq_q * STATS_BYTES)
    reduce.read("o_partial", bh * n_split * p.seq_q * d * PARTIAL_BYTES)
    reduce.write("o", bh * p.seq_q * d * s)
    reduce.work(0, bh * n_split * p.seq_q, bh * n_split * (3 * p.seq_q * d + p.seq_q))
    return [split, reduce]


FORMULAS = {
    "fa2": (fa2_forward, fa2_backward),
    "fa1": (fa1_forward, None),
    "naive": (naive_forward, naive_backward),
    "decode": (decode_forward, None),
}


def closed_form(p: AttentionProblem, t: Tiling, schedule: str) -> list[KernelCount]:
    """Kernel counts of the problem's pass, in launch order."""
    forward, backward = FORMULAS[schedule]
    kernels = []
    if p.pass_ in ("fwd", "fwd+bwd"):
        kernels += forward(p, t)
    if p.pass_ in ("bwd", "fwd+bwd"):
        kernels += backward(p, t)
    return kernels
