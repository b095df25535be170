"""The groups a validation matrix measures: problems, sequence lengths, candidate tilings.

A group is every shape that shares one set of tilings: a schedule, pass, head dim and mask,
over sequence lengths. Its candidate tilings are the ranges the Triton tutorial and
FlashAttention use (``CANDIDATES``, ``DECODE_CANDIDATES``), of which the model chooses
(``validation.choose``), or a probe's tilings, every one measured. Problems are sized so
that every shape moves several times the L2 and fills the SMs: 16k tokens a batch, 16
heads; decode 16 sequences of 32 query heads over 8 K/V heads. Naive attention runs only
where its N x N tensors fit (``naive_fits``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from traces.problem import AttentionProblem, ProblemError
from traces.tiling import Tiling

# Naive attention keeps S and P ([B, H, N, N]) in HBM, and the MATH peer two more such
# tensors; a shape runs only while those four fit in this fraction of the GPU's memory.
NAIVE_MEMORY_FRACTION = 0.5
NAIVE_NXN_TENSORS = 4

# Candidate tilings (block_m, block_n, num_stages, num_warps), per schedule and pass: the
# ranges the Triton tutorial and FlashAttention use; the model picks among them.
CANDIDATES = {
    ("fa2", "fwd"): [(128, 64, 3, 8), (128, 128, 2, 8), (128, 32, 3, 4), (128, 64, 2, 4),
                     (64, 64, 3, 4), (64, 128, 2, 4), (64, 32, 2, 4), (32, 64, 2, 4),
                     (32, 32, 2, 4), (16, 64, 2, 4)],
    ("fa2", "bwd"): [(64, 64, 2, 4), (32, 64, 2, 4), (64, 32, 2, 4), (32, 32, 2, 4),
                     (128, 64, 2, 8), (64, 128, 2, 8), (32, 128, 2, 4), (128, 32, 2, 4),
                     (16, 64, 2, 4)],
    ("naive", "fwd"): [(64, 64, 2, 4), (128, 64, 2, 8), (64, 128, 2, 8), (128, 128, 2, 8),
                       (32, 64, 2, 4), (64, 32, 2, 4), (32, 32, 2, 4), (16, 32, 2, 4)],
}
# Decode: block_n and split_kv matter (block_m is unused); (block_n, split_kv, stages, warps).
DECODE_CANDIDATES = [(32, 4, 2, 4), (32, 16, 2, 4), (32, 32, 2, 4), (64, 4, 2, 4),
                     (64, 8, 2, 4), (64, 16, 2, 4), (128, 2, 2, 4), (128, 4, 2, 4),
                     (128, 8, 2, 4)]
# The "mlp" probe: decode's split kernel with the same 8 KB (d = 64) or 16 KB (d = 128) tiles
# and 2, 3 and 4 stages, so 1, 2 and 3 tiles ahead per CTA, and with larger tiles at 2
# stages. Does HBM's rate follow the bytes in flight (BENCHMARKS.md, "What is left")? Every
# tiling is measured: a probe chooses nothing.
PROBE_DECODE = ((32, 4, 2, 4), (32, 4, 3, 4), (32, 4, 4, 4), (64, 4, 2, 4), (128, 4, 2, 4))
# And FA2's kernels with the same tiles at 2 and 3 stages: Triton issues an iteration's
# next loads after its matmuls (``kernels.resources.loop_pipeline``), so at 2 stages a CTA
# cannot overlap them with its own compute, and at 3 it can. How much slower are 2 stages
# where one CTA holds an SM (BENCHMARKS.md, "Loads in the compile's order")? As
# CANDIDATES writes them: (block_m, block_n, stages, warps).
PROBE_FA2 = {"fwd": ((128, 128, 2, 8), (128, 128, 3, 8), (128, 64, 2, 4), (128, 64, 3, 4)),
             "bwd": ((128, 64, 2, 8), (128, 64, 3, 8), (64, 64, 2, 4), (64, 64, 3, 4))}
PROBE = "probe"  # the role of a probe's configs in the plan


@dataclass(frozen=True)
class Group:
    """Shapes that share one set of tilings: everything fixed but the sequence length."""

    schedule: str
    pass_: str
    head_dim: int
    causal: bool
    seqs: tuple[int, ...]
    # A probe's tilings, every one measured, as the schedule's candidates write them:
    # decode's (block_n, split_kv, stages, warps), the others' (block_m, block_n, stages,
    # warps). Empty: the schedule's candidates, of which the model chooses.
    probe: tuple[tuple[int, int, int, int], ...] = ()

    def problem(self, n: int) -> AttentionProblem:
        if self.schedule == "decode":  # one query per head, GQA group of 4, K/V of length n
            return AttentionProblem(batch=16, heads=32, kv_heads=8, seq_q=1, seq_kv=n,
                                    head_dim=self.head_dim, dtype="bf16", causal=self.causal)
        # 16k tokens per batch: every shape moves several times the L2 and fills the SMs.
        return AttentionProblem(batch=max(1, 16384 // n), heads=16, seq_q=n,
                                head_dim=self.head_dim, dtype="bf16", causal=self.causal,
                                pass_=self.pass_)

    def candidates(self) -> list[Tiling]:
        if self.schedule == "decode":
            return [Tiling(block_m=16, block_n=bn, split_kv=s, num_stages=st, num_warps=w)
                    for bn, s, st, w in self.probe or DECODE_CANDIDATES]
        return [Tiling(block_m=bm, block_n=bn, num_stages=st, num_warps=w)
                for bm, bn, st, w in self.probe or CANDIDATES[(self.schedule, self.pass_)]]

    @property
    def label(self) -> str:
        return (f"{self.schedule} {self.pass_} d={self.head_dim}"
                f"{' causal' if self.causal else ''}")


SEQS = (1024, 2048, 4096, 8192, 16384)
# Measurement order of the sequence lengths: a run cut short still spans small and large.
SEQ_PRIORITY = (4096, 1024, 16384, 2048, 8192)


def groups_for(name: str) -> list[Group]:
    """The groups of a named matrix (``default``, ``quick`` or the ``mlp`` probe)."""
    if name == "default":
        out = []
        for schedule, pass_ in (("fa2", "fwd"), ("fa2", "bwd"), ("naive", "fwd")):
            for d, causal in itertools.product((64, 128), (False, True)):
                out.append(Group(schedule, pass_, d, causal, SEQS))
        # decode has one query row: a causal mask (bottom-right) hides nothing, so "causal"
        # would measure the same kernel twice.
        out += [Group("decode", "fwd", d, False, SEQS) for d in (64, 128)]
        return out
    if name == "quick":
        return [Group("fa2", "fwd", 128, False, (2048, 8192)),
                Group("fa2", "fwd", 128, True, (8192,)),
                Group("fa2", "bwd", 128, True, (4096,)),
                Group("naive", "fwd", 128, False, (2048,)),
                Group("decode", "fwd", 128, False, (16384,))]
    if name == "mlp":
        return ([Group("decode", "fwd", d, False, (16384,), probe=PROBE_DECODE)
                 for d in (64, 128)]
                + [Group("fa2", pass_, 64, False, (4096,), probe=PROBE_FA2[pass_])
                   for pass_ in ("fwd", "bwd")])
    raise ProblemError(f'unknown matrix "{name}"; known: default, quick, mlp (or a plan .json '
                       'path)')


def naive_fits(problem: AttentionProblem, hbm_bytes: int) -> bool:
    nxn = problem.batch * problem.heads * problem.seq_q * problem.seq_kv * problem.elem_bytes
    return NAIVE_NXN_TENSORS * nxn <= NAIVE_MEMORY_FRACTION * hbm_bytes
