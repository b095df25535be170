"""Compile facts shipped with tilesim: the Triton kernels compiled ahead of time, once.

``--compiled-resources`` compiles a schedule's kernels for the preset's GPU (``resources``):
it needs Triton and takes seconds a kernel, minutes for a sweep. Without it the simulator
estimates registers from the tiles (``simulator.occupancy``) and knows no instruction
counts or spills, and a sweep then ranks first tilings that spill: FA2's forward at
d = 128 with 128 x 64 tiles and 4 warps compiles to 255 registers and spills 372 bytes a
thread every iteration, which the estimate (234 registers) does not see, and on the H200
it ran 33-42% slower than predicted without its compile (BENCHMARKS.md).

This module keeps a table of compiles made here with one Triton version per GPU
architecture (``TABLES``: JSON Lines, gzip, ``resources.measure``'s results by job key,
which names the architecture), covering the kernels and launches below over the whole
tiling space ``tilesim sweep`` searches. A lookup gives a job's result exactly as a
compile with that Triton would: each table holds the hash of the kernel sources it was
compiled from (``resources.sources_digest``) and is not used once they change
(``tests/test_kernel_table.py`` fails then: rebuild it).

Covered on sm_90 (``VARIANTS``), each over the sweep's 250 tilings, for a launch whose sequence
lengths and query heads are multiples of 16 and whose K/V heads are the query heads
(group 1): the keys ``resources.job_key`` makes of such a launch (and, through the
stand-ins below, fp16 where only bf16 is compiled and other head counts but 1).

- FA2's forward at head_dim 64 and 128, bf16 and fp16, causal and not, and its backward's
  three kernels the same in bf16;
- naive attention's forward: its two matmul kernels at head_dim 64 and 128 in bf16 and
  fp16 (they know no mask), and its softmax, which holds a row of scores in registers, for
  every row width from 16 to 131072 keys (``SOFTMAX_ROWS``; a launch's key length rounded
  up to a power of two), causal and not, bf16 and fp16; its backward's five kernels at
  head_dim 64 and 128 in bf16;
- FA2's forward and its backward's dQ and dK/dV (which loops over the group) with GQA, at
  head_dim 64 and 128, causal and not, in bf16: K/V heads shared by ``GQA_GROUP`` (4)
  query heads, which stands for every group size but 1 and the multiples of 16 (Triton's
  specialization);
- FA2 where queries and keys both have a length off the multiples of 16 (1000, 4095, ...:
  ``OFF_16_SEQ``, 1000, stands for them all, Triton specializing a length only on its
  divisibility by 16): its forward at head_dim 64 and 128, bf16 and fp16, causal and not,
  and its backward's three kernels the same in bf16; its forward, dQ and dK/dV with GQA
  (group 4) the same in bf16;
- FA2's forward where the keys alone have such a length, the queries a multiple of 16
  (``kv_seq``: a chunk of a prompt after a cached prefix, causal; cross-attention to an
  encoder's output, not), with and without GQA, at head_dim 64 and 128, in bf16;
- naive attention at lengths off the multiples of 16: its two matmul kernels at head_dim
  64 and 128 in bf16 and fp16, its softmax for every row width, compiled one key short of
  it (15 to 131071 keys), causal and not, bf16 and fp16, and its backward's five kernels
  in bf16;
- FA1's forward at head_dim 64 and 128, causal and not, in bf16 and fp16;
- FA2's forward at head_dim 256, causal and not, with and without GQA, in bf16;
- split-KV decode's two kernels (since 2026-12-07, twenty-third session) for one query a
  head (``n_q`` 1, a constexpr: generation), at head_dim 64 and 128, causal and not, in
  bf16, group 1 and ``GQA_GROUP``. Triton specializes its key length, split count and
  chunk (K/V blocks a split) on being 1 or a multiple of 16 (``INT_CLASSES``), so its
  variants are those classes, not lengths: the key length on or off the multiples, the
  split count and the chunk each 1, on or off them (every launch a sweep tries, whatever
  its length), each compiled over the sweep's 50 block_n, stages and warps (decode has no
  block_m) at a launch of those classes (``decode_launch``); its reduce, which knows
  neither keys nor chunks, over the split count's classes. Of those classes, a split
  count or chunk of 1 changes every compile and keys off the multiples nearly every one
  (their loads' alignment); splits and chunks on rather than off the multiples change
  none. Sampled (4 tilings a class, d and mask), fp16 equals the bf16 rows and the
  reduce at 12 heads its 16-head rows in every fact (672 and 96 jobs).

A kernel the table holds only in bf16 (the backward's) stands for its fp16 compile too
(``STAND_IN``): the two compile alike. Where the table holds both (FA2's forward and naive
attention's matmuls, every tiling) their facts are equal but for the dtype
(``tests/test_kernel_table.py``). A sample of the backward's kernels compiled in fp16 here
(Triton 3.6.0, 2026-12-06; 12 tilings, d = 64 and 128, FA2's causal and not) matched the
table's bf16 rows in every fact for the kernels whose work is matmuls: FA2's dQ and dK/dV
(96 jobs), its forward with GQA (48) and naive attention's dV, dP, dQ and dK (96 jobs).
The two elementwise kernels differ a little, by their conversions: FA2's preprocess
(registers within 19%, its instructions 5-15% fewer in fp16, and in 2 of 48 jobs no spills
where bf16 spills) and naive attention's dS (registers −15% to +3%, 5-15% fewer
instructions before its loop); their bf16 rows still stand in, where the estimate puts the
preprocess's registers 2-7 times off. Naive softmax, which the table holds in both, shows
the same kind of difference (fp16 up to 11% fewer instructions, other registers at the
longest rows), and so does FA1's forward, which it holds in both too (a sample of 16 fp16
jobs had 1-4% fewer loop instructions than bf16's rows in all, other spills in 4). The
rows added since (FA2's dQ and dK/dV with GQA at lengths off the multiples of 16, its
forward with the keys alone off them, causal and not, and at head_dim 256), sampled the
same way at 4 tilings, equal their bf16 rows in fp16 and their 16-head rows at 12 heads
in every fact, as FA1's do at 12 heads.

A launch whose query heads are neither 1 nor a multiple of 16 (12, 20, 40, ...; with GQA
too) takes the row of the table's 16 (``HEADS_STAND_IN``): Triton specializes
the head count on its divisibility, but the same sample at 12 heads (2026-12-06: FA2's
forward with and without GQA, dQ and dK/dV, 192 jobs; naive attention's six kernels that
take the head count, 144) compiled to the 16-head rows fact for fact. What does change a
compile has rows of its own or stays estimated: GQA has its own (a group-4 sample's
registers were 0.8-1.45 times the group-1 rows', with other spills; the table's dQ rows at
group 4 differ from group 1's in all 1,000 jobs, registers 0.74-1.48 times), and so do
lengths off the multiples of 16: each of FA2's forward, dQ and dK/dV rows differs from the
row at 4096 in some fact (registers 0.77-1.48 times, other spills in 12-46% of the
tilings; the preprocess's registers in some), and naive attention's rows differ from those
at 4096 (its softmax's, from those of its row width) in 68% (the softmax) to 98% of the
jobs, registers 0.13-4.6 times, other spills in 5-24% (its PV at 64 x 64, d = 128, takes
238 registers at N = 1000 against 94 at 1024, and 2.4 times the loop instructions: likely
its loads of P, whose rows the compiler no longer knows to be 16-byte aligned); and FA2's
forward with GQA at such lengths has its own (each row differs from group 4's at 4096,
registers 0.73-1.51 times, and from group 1's at 1000), and so do its dQ and dK/dV (each
row differs from group 4's at 4096 and from group 1's at 1000: registers 0.66-1.57 and
0.66-3.12 times, other spills in 15-65% of the tilings). Keys alone off the multiples of
16 are a compile of their own too: FA2's causal forward there differs from both of its
neighbours': in every job from the rows with both lengths on the multiples (registers
0.73-1.33 times, other spills in 31-32% of the tilings), in 30% of them from those with
both off (registers 0.77-1.01 times, other spills in 17-18%); its forward without a mask
in every job from the rows with both on (registers 0.78-1.51 times, other spills in
23-40%), in 10% (head_dim 64) and 50% (128) from those with both off (registers
0.73-1.06 times). At head_dim 256 a 128-row tile's accumulator alone is 256 fp32
registers a thread over 4 warps: of the 146 tilings whose shared memory fits the H200
(of 250), 47 or 48 spill in FA2's forward loop and 54 or 55 take all 255 registers; GQA's
rows differ from group 1's in every job there (registers 0.76-1.41 times, other spills
in 20-25%). One head (a constexpr), queries off the multiples of 16 with keys on them,
FA2's backward with the keys alone off them and at head_dim 256, and FA1 with GQA or at
lengths off the multiples stay estimated.

Covered on sm_80 (``SM80_VARIANTS``, the A100 presets; 2026-12-06, sixteenth session),
for the same launch: FA2's forward and its backward's three kernels at head_dim 64 and
128, causal and not, in bf16, with the same stand-ins (fp16 and other head counts but 1).
A sample compiled here (8 tilings, d x causal) bears them out on sm_80 as on sm_90: in
fp16 the forward, dQ and dK/dV equal their bf16 rows in every fact (32 jobs each) and the
preprocess differs as on sm_90 (registers 0.95-1.19 times in half the jobs, 6-16% fewer
instructions, no spills in 2 jobs where bf16 spills); at 12 heads the forward, dQ and
dK/dV equal their 16-head rows. sm_80 is a compile of its own (mma.sync, never wgmma;
164 KB of shared memory a CTA): of the tilings that fit it (FA2's forward 230 of 250 at
d = 64, 192 at d = 128; dQ 226 and 169; dK/dV 222 and 163), 63-84% take other registers
than on sm_90 (0.13-2.21 times; the preprocess 30-40%), and in 93 of the forward's, 93
of dQ's and 139 of dK/dV's ptxas keeps 32 registers and spills the rest to the stack
(FA2's forward at d = 64 with 128 x 256 tiles and 4 warps: 13,104 bytes a thread; sm_90
keeps 255 and 1,616), which no estimate sees. And with GQA (seventeenth session): FA2's
forward, dQ and dK/dV at group ``GQA_GROUP``, as on sm_90, the same four launches each.
Their rows differ from group 1's in every job: the forward's and dQ's registers 0.76-1.47
times, spilling in the same tilings; dK/dV's, which loops over the group, 0.13-7.97
times (some of group 1's 32-register spillers take 255 at group 4, and the other way
round), other spills in 1-5 tilings. From sm_90's group-4 rows they differ
in every job too (registers 0.13-2.23 times, other spills in 1-13% of the tilings). The
stand-ins hold for them (the same sample: fp16 and 12 heads equal their rows in every
fact, 32 jobs each). And (eighteenth session) FA2's forward at lengths off the multiples
of 16, both or the keys' alone, with and without GQA, and FA1's forward in bf16 and fp16,
as on sm_90. With both off the multiples, FA2's forward differs from its rows at 4096 in
some fact in all but 6 of the 1,688 fitting jobs (registers in 16-29% of them, 0.13-7.97
times, other spills in up to 7 tilings a launch); as many of its tilings keep 32
registers and spill (19 to 31 a launch; one more at d = 128, causal). With the keys'
alone off them, its rows differ from those with both off as on sm_90: in 10% of the jobs
at d = 64 (never in registers), in 50% at d = 128 (registers in 11-16%, 0.91-1.11
times). FA1's rows differ from sm_90's in every job but 2 (registers in 63-72%,
0.13-1.68 times) and from FA2's on sm_80 in all; in fp16 its registers differ from
bf16's in 9 to 38 tilings a launch. The stand-ins hold for them (the same sample: FA2's
forward off the multiples equals its rows in fp16, and it and FA1's forward their rows
at 12 heads, in every fact, 32 jobs each). And (nineteenth session) FA2's backward at
lengths off the multiples of 16 (group 1): its dQ and dK/dV differ from their rows at 4096
in every fitting job (registers in 23-47% of them, 0.13-7.97 times, other spills in 1-5
tilings a launch; 14 to 43 tilings a launch keep 32 registers and spill), its
preprocess in registers alone (10% of the jobs at d = 64, 50% at d = 128, 0.78-1.00
times); from sm_90's rows of the same launches they differ in every job. The stand-ins
hold for them (the same sample: dQ and dK/dV equal their rows in fp16 and at 12 heads in
every fact, 32 jobs each; the preprocess differs in fp16 as at 4096). And FA2's forward
at head_dim 256 (group 1): 122 of the 250 tilings fit sm_80's shared memory; of those, 36
(46 causal) spill in the loop and 16 keep 32 registers and spill; every job differs from
sm_90's row (registers in 70-72%, 0.13-1.62 times). The stand-ins hold for it (the same
sample: fp16 and 12 heads equal its rows in every fact, 16 jobs each). And (twentieth
session) naive attention at lengths on and off the multiples of 16, as on sm_90: its
matmuls in bf16 and fp16 (equal but for the dtype, as on sm_90), its softmax at every
row width, its backward's five kernels in bf16. At lengths on them, every matmul and
backward job differs from sm_90's row (registers in 64-90% of them, 0.13-3.57 times),
and 5 to 26 tilings a launch keep 32 registers and spill (naive_qk at d = 128: 20; dV
and dK at d = 128: 25 and 26); the softmax's registers differ from sm_90's at most row
widths (0.63-1.12 times), and at 65,536 and 131,072 keys it keeps 32 registers and
spills, as on sm_90. The stand-ins hold for it (the same sample): in fp16 its backward's
kernels equal their rows in every fact but dS, the elementwise one, as on sm_90
(registers in 4 of 16 jobs, 0.84-1.02 times; 5-15% fewer prologue instructions in all);
at 12 heads its matmuls and backward equal their rows in every fact, 16 jobs each. Off
the multiples of 16, its matmuls and backward differ from their rows at 4096 in all but
5 jobs a launch (registers 0.13-7.97 times), and from sm_90's rows there in all but 5 at
most; 3 to 32 tilings a launch keep 32 registers and spill. Its softmax, one key short
of each row width, equals the row width's own compile up to 128 keys and differs from
256 on (registers 0.80-1.70 times). The stand-ins hold there as at 4096 (dS in fp16:
registers in 3 of 16 jobs, 0.98 times; 5-14% fewer prologue instructions). And
(twenty-first session) FA2's dQ and dK/dV with GQA at lengths off the multiples of 16,
as on sm_90: every fitting job differs in some fact from its rows with GQA at 4096
(registers in 23-44% of them, 0.13-7.97 times), from group 1's off the multiples
(registers in 12-52%) and from sm_90's rows of the same launch (registers in 53-76%,
0.13-2.21 times, other spills in 6-26 tilings); 14 to 46 tilings a launch keep 32
registers and spill. The stand-ins hold for them (the same sample: fp16 and 12 heads
equal their rows in every fact, 32 jobs each). FA2's backward at head_dim 256 stays
estimated on sm_80. And (twenty-fourth session) split-KV decode's two kernels, the same
variants as on sm_90 (``_decode_variants``): every job differs from sm_90's row of the same
launch in some fact (registers in 4,720 of the 7,320, 0.66-1.52 times); 1,008 of the
7,200 split jobs ask more shared memory than the A100's 163 KB a CTA (720 more than the
H200's 227 KB on sm_90), and 36 spill in the loop (d = 128, block_n 256, 4 warps,
3 stages; 18 on sm_90), none keeps 32 registers. The stand-ins hold for
them (the same sample, 4 tilings a class, d and mask: fp16 equals the bf16 rows and the
reduce at 12 heads its 16-head rows in every fact, 672 and 96 jobs).

Any other launch, kernel, dtype or arch is looked up and not found, and the estimate
stands: decode with several queries a head (speculative decoding) or a group of 16 or
more, for one.

The samples are ``python -m kernels.table check-stand-in`` (under the table's Triton;
about eight minutes on two cores for the variants before GQA's dQ and the lengths off
the multiples of 16, which add some 20 more, seven at 4 samples; a minute once
``resources``' cache holds them): per stand-in, kernel and launch, the facts that differ
and by how much.

Build (36,640 jobs: about eleven hours on two cores from nothing; 46 minutes where
Triton's own cache holds the kernels, as after an edit to ``resources`` alone; jobs in
``resources``' cache are not redone, nor the rows of a current table of the same Triton,
so adding a variant compiles that variant alone: the forward's four GQA variants, 1,000
jobs, took 17 minutes, dK/dV's 50, dQ's 24; FA2 at lengths off the multiples of 16, 4,100
jobs, 106; naive attention there, 5,060 jobs, 60; FA2's forward with GQA there, 1,000
jobs, 19; its dQ and dK/dV with GQA there, 2,000 jobs, 80; its causal forward with the keys
alone off the multiples, 1,000 jobs, 27, and without a mask, 1,000 jobs, 17; FA1's
forward, 1,000 jobs in bf16, 9, and 1,000 in fp16, 12; FA2's forward at head_dim 256,
1,000 jobs, 65; decode, 7,320 jobs, 97, partly beside other work)::

    python -m kernels.table build        # under Triton 3.6.0, the H200 records' version
    python -m kernels.table build --arch 80

(sm_80's 3,100 jobs without GQA took 103 minutes on two cores: dK/dV 59 of them, dQ 24,
the forward 19; its 3,000 with GQA 120: dK/dV 62, dQ 28, the forward 30, partly beside
other work; FA2's forward off the multiples of 16, 2,000 jobs, 42, with the keys alone
off them, 2,000, 42, and FA1's forward, 2,000, 34, partly beside other work; FA2's
backward off the multiples, 3,000 jobs, 87: dK/dV 59, dQ 28; FA2's forward at head_dim
256, 500 jobs, 34; naive attention, 5,060 jobs, 41, and off the multiples, 5,060, 57,
partly beside other work; FA2's dQ and dK/dV with GQA off the multiples, 2,000 jobs, 83:
dK/dV 55, dQ 28, partly beside other work; decode, 7,320 jobs, 79, partly beside other
work.)
"""

from __future__ import annotations

import functools
import gzip
import itertools
import json
import os
import sys
import tempfile
from pathlib import Path

from kernels import resources
from traces.tiling import Tiling

COMPILED = Path(__file__).resolve().parent / "compiled"
# One table per GPU architecture, each with its own header (Triton version, sources hash)
# and variants (``VARIANTS_OF``): sm_90 (H100, H200) and sm_80 (A100).
TABLES = {90: COMPILED / "sm90.jsonl.gz", 80: COMPILED / "sm80.jsonl.gz"}
ARCH = 90  # the architecture a call names none of: the H200 records' Hopper
SCHEMA = "tilesim.kernel_table/1"
# The launch the table is compiled as: every integer argument a multiple of 16, group 1.
LAUNCH = {"seq_q": 4096, "seq_kv": 4096, "heads": 16, "group": 1, "decode_rows": 16}
# naive_softmax holds a whole row of scores in registers, ROW = the key length rounded up to
# a power of two: one compile per row width, launched with that many queries and keys.
SOFTMAX_ROWS = tuple(2 ** i for i in range(4, 18))  # 16 to 131072
# A dtype whose compile another's row stands for, where the table lacks its own (module
# docstring): fp16's backward kernels (on sm_80 its forward too), from their bf16 compiles.
STAND_IN = {"fp16": "bf16"}
# The query heads whose compile stands for any other count but 1 and the multiples of 16.
HEADS_STAND_IN = 16
# The group size (query heads per K/V head) the GQA variants are compiled with: Triton
# specializes it on being 1 or a multiple of 16, so one compile serves 2 to 15 and their
# like (the groups of Llama's and Mistral's GQA: 4, 5, 8).
GQA_GROUP = 4
# The sequence length the variants off the multiples of 16 are compiled at: Triton
# specializes a length only on being 1 or a multiple of 16, so one compile serves every
# other length (1000, 1023, 4095, ...) where queries and keys both have it.
OFF_16_SEQ = 1000
FA2_BACKWARD = ("fa2_bwd_preprocess", "fa2_bwd_dq", "fa2_bwd_dkdv")
NAIVE_MATMULS = ("naive_qk", "naive_pv")
NAIVE_BACKWARD = ("naive_bwd_dv", "naive_bwd_dp", "naive_bwd_ds", "naive_bwd_dq",
                  "naive_bwd_dk")
BOTH_DTYPES, BF16 = ("bf16", "fp16"), ("bf16",)


DEFAULT_HEAD_DIMS = (64, 128)

# How Triton specializes an integer argument at launch (``resources.launch_ints``): 1 (a
# constexpr), a multiple of 16, or neither. Decode's compile depends on the class of its
# key length, split count and chunk (K/V blocks a split), not on their values.
ONE, ON_16, OFF_16 = "1", "on 16", "off 16"
INT_CLASSES = (ONE, OFF_16, ON_16)
# Decode's launch: one query a head (``n_q`` 1, a constexpr), as in generation. Its
# ``block_m`` is no constexpr of either kernel; ``tilesim sweep`` names 128.
DECODE_QUERIES, DECODE_BLOCK_M = 1, 128
DECODE_KERNELS = ("decode_split", "decode_reduce")


def _variants(kernels, dtypes, causal=(False, True), head_dims=DEFAULT_HEAD_DIMS, **launch):
    """One variant per kernel, head dim, dtype and mask (in that order), each with the
    launch entries ``launch`` (``group``, ``seq``, ``kv_seq``) that ``variant_shape`` reads."""
    return [{"kernel": kernel, "head_dim": d, "dtype": dtype, "causal": masked, **launch}
            for kernel, d, dtype, masked in itertools.product(kernels, head_dims, dtypes,
                                                              causal)]


def _naive_softmax(seq_of_row) -> list[dict]:
    """naive_softmax at every row width of ``SOFTMAX_ROWS``, launched with
    ``seq_of_row(row)`` queries and keys; it knows no head_dim (128 is compiled)."""
    return [v for row in SOFTMAX_ROWS
            for v in _variants(("naive_softmax",), BOTH_DTYPES, head_dims=(128,),
                               seq=seq_of_row(row))]


def int_class(n: int) -> str:
    """The specialization Triton gives an integer argument of value ``n`` (``INT_CLASSES``)."""
    return ONE if n == 1 else ON_16 if n % 16 == 0 else OFF_16


def _splits_of(blocks: int, split: str, chunk: str) -> int | None:
    """A split count of ``blocks`` K/V blocks of the class ``split`` whose chunk
    (``ceil(blocks / splits)`` blocks a split) is of the class ``chunk``, no chunk left
    empty (as ``kernels.decode.check`` asks); None if there is none. The splits that leave
    none empty with chunks of ``c`` blocks are ``ceil(blocks / c)``."""
    chunks = {ONE: range(1, 2), ON_16: range(16, blocks + 1, 16),
              OFF_16: (c for c in range(2, blocks + 1) if c % 16)}[chunk]
    for per_split in chunks:
        splits = -(-blocks // per_split)
        if -(-blocks // splits) == per_split and int_class(splits) == split:
            return splits
    return None


@functools.cache
def decode_launch(keys: str, split: str, chunk: str) -> tuple[int, dict[int, int]]:
    """(key length, split count by block_n of ``BLOCKS``) of decode launches whose key
    length, split count and chunk are of the classes ``keys`` (``ON_16`` or ``OFF_16``),
    ``split`` and ``chunk`` at every block_n: the shortest such length (a multiple of 16,
    or one key short of it), and at each block_n the split count of the smallest chunk
    of its class."""
    for sixteens in itertools.count(1):
        n_kv = 16 * sixteens - (keys == OFF_16)
        splits = {}
        for bn in sorted(BLOCKS, reverse=True):  # the fewest blocks first: they fail first
            splits[bn] = _splits_of(-(-n_kv // bn), split, chunk)
            if splits[bn] is None:
                break
        else:
            return n_kv, {bn: splits[bn] for bn in BLOCKS}
    raise AssertionError("unreachable")  # itertools.count does not end


def _decode_variants(causal=(False, True)) -> list[dict]:
    """decode_split at head_dim 64 and 128, bf16, groups 1 and ``GQA_GROUP``, keys on and
    off the multiples of 16, over every class of its split count and chunk; decode_reduce,
    which knows neither keys nor chunks, over the split count's."""
    variants = []
    for d, group, masked, split in itertools.product(DEFAULT_HEAD_DIMS, (1, GQA_GROUP),
                                                     causal, INT_CLASSES):
        base = {"head_dim": d, "dtype": "bf16", "causal": masked, "group": group,
                "seq_q": DECODE_QUERIES, "split": split}
        variants += [{"kernel": "decode_split", **base, "keys": keys, "chunk": chunk}
                     for keys, chunk in itertools.product((ON_16, OFF_16), INT_CLASSES)]
        variants.append({"kernel": "decode_reduce", **base, "keys": ON_16, "chunk": ONE})
    return variants


VARIANTS = (_variants(("fa2_fwd",), BOTH_DTYPES)
            + _variants(FA2_BACKWARD, BF16)
            # naive attention's forward: its matmuls know no mask (one compile serves
            # causal and not), its softmax knows no head_dim
            + _variants(NAIVE_MATMULS, BOTH_DTYPES, causal=(False,))
            + _naive_softmax(lambda row: row)
            # and its backward's five kernels (no mask either), in bf16 as FA2's
            + _variants(NAIVE_BACKWARD, BF16, causal=(False,))
            # FA2's forward and backward with GQA: K/V heads shared by GQA_GROUP query
            # heads (since 2026-12-06; dK/dV loops over the group)
            + _variants(("fa2_fwd", "fa2_bwd_dkdv", "fa2_bwd_dq"), BF16, group=GQA_GROUP)
            # FA2 at lengths that are not multiples of 16 (since 2026-12-06): its forward
            # as above, its backward in bf16
            + _variants(("fa2_fwd",), BOTH_DTYPES, seq=OFF_16_SEQ)
            + _variants(FA2_BACKWARD, BF16, seq=OFF_16_SEQ)
            # naive attention there (since 2026-12-06): its matmuls as above; its softmax
            # at every row width, launched one key short of it (ROW is the key length
            # rounded up to a power of two); its backward
            + _variants(NAIVE_MATMULS, BOTH_DTYPES, causal=(False,), seq=OFF_16_SEQ)
            + _naive_softmax(lambda row: row - 1)
            + _variants(NAIVE_BACKWARD, BF16, causal=(False,), seq=OFF_16_SEQ)
            # FA2's forward with GQA there (since 2026-12-06): prefill of a prompt as it
            # comes, the commonest launch of a GQA model; and its backward's dQ and dK/dV
            # (since 2026-12-06, fourteenth session): fine-tuning on sequences as they come
            + _variants(("fa2_fwd",), BF16, group=GQA_GROUP, seq=OFF_16_SEQ)
            + _variants(("fa2_bwd_dkdv", "fa2_bwd_dq"), BF16, group=GQA_GROUP,
                        seq=OFF_16_SEQ)
            # FA2's forward with queries at a multiple of 16 and keys off them, with and
            # without GQA: causal (since 2026-12-06, fourteenth session), a chunk of a
            # prompt after a cached prefix of any length (chunked prefill); and not
            # (fifteenth session), cross-attention to an encoder's output (Whisper's
            # 448 decoder positions to its 1500 audio frames)
            + _variants(("fa2_fwd",), BF16, kv_seq=OFF_16_SEQ)
            + _variants(("fa2_fwd",), BF16, group=GQA_GROUP, kv_seq=OFF_16_SEQ)
            # FA1's forward (since 2026-12-06, fourteenth session), so that it and FA2
            # are predicted from compiles alike; in fp16 too, which compiles otherwise
            + _variants(("fa1_fwd",), BOTH_DTYPES)
            # FA2's forward at head_dim 256 (fifteenth session), with and without GQA:
            # Gemma's heads, where a tile's accumulator alone fills a thread's registers
            + _variants(("fa2_fwd",), BF16, head_dims=(256,))
            + _variants(("fa2_fwd",), BF16, head_dims=(256,), group=GQA_GROUP)
            # split-KV decode (since 2026-12-07, twenty-third session): one query a head,
            # without and with GQA, over every specialization of its integers
            + _decode_variants())

# sm_80 (the A100 presets; sixteenth session): FA2's forward and its backward's three
# kernels at head_dim 64 and 128, causal and not, in bf16 (fp16 takes them: ``STAND_IN``);
# with GQA (seventeenth session): Llama 2 70B's, Llama 3's and Mistral's attention; and
# (eighteenth session) FA2's forward at lengths off the multiples of 16, both (prefill
# of a prompt as it comes) or the keys' alone (chunked prefill, cross-attention), with and
# without GQA, and FA1's forward in both dtypes, as on sm_90; and (nineteenth session)
# FA2's backward at lengths off the multiples of 16 (training on samples as they come),
# and FA2's forward at head_dim 256 (Gemma), group 1; and (twentieth session) naive
# attention, forward and backward, at lengths on and off the multiples of 16, as on
# sm_90, so that `tilesim compare` on an A100 predicts both schedules from compiles; and
# (twenty-first session) FA2's dQ and dK/dV with GQA at lengths off the multiples of 16
# (fine-tuning a GQA model on samples as they come), as on sm_90; and (twenty-fourth
# session) split-KV decode, as on sm_90.
SM80_VARIANTS = (_variants(("fa2_fwd",), BF16)
                 + _variants(FA2_BACKWARD, BF16)
                 + _variants(("fa2_fwd", "fa2_bwd_dkdv", "fa2_bwd_dq"), BF16, group=GQA_GROUP)
                 + _variants(("fa2_fwd",), BF16, seq=OFF_16_SEQ)
                 + _variants(("fa2_fwd",), BF16, group=GQA_GROUP, seq=OFF_16_SEQ)
                 + _variants(FA2_BACKWARD, BF16, seq=OFF_16_SEQ)
                 + _variants(("fa2_fwd",), BF16, kv_seq=OFF_16_SEQ)
                 + _variants(("fa2_fwd",), BF16, group=GQA_GROUP, kv_seq=OFF_16_SEQ)
                 + _variants(("fa1_fwd",), BOTH_DTYPES)
                 + _variants(("fa2_fwd",), BF16, head_dims=(256,))
                 + _variants(NAIVE_MATMULS, BOTH_DTYPES, causal=(False,))
                 + _naive_softmax(lambda row: row)
                 + _variants(NAIVE_BACKWARD, BF16, causal=(False,))
                 + _variants(NAIVE_MATMULS, BOTH_DTYPES, causal=(False,), seq=OFF_16_SEQ)
                 + _naive_softmax(lambda row: row - 1)
                 + _variants(NAIVE_BACKWARD, BF16, causal=(False,), seq=OFF_16_SEQ)
                 + _variants(("fa2_bwd_dkdv", "fa2_bwd_dq"), BF16, group=GQA_GROUP,
                             seq=OFF_16_SEQ)
                 + _decode_variants())
VARIANTS_OF = {90: VARIANTS, 80: SM80_VARIANTS}


def variant_shape(variant: dict) -> dict:
    """``resources.measure``'s launch keywords of one variant: ``LAUNCH``, its mask, and
    its sequence lengths (``seq``: queries and keys; ``kv_seq``: keys alone; ``seq_q``:
    queries alone) and group size (``group``) where it has its own; decode's group tile
    (``decode_rows``) is its group's query rows. A decode variant's key length is each
    launch's own (``variant_launches``)."""
    seq = variant.get("seq")
    lengths = {} if seq is None else {"seq_q": seq, "seq_kv": seq}
    if "kv_seq" in variant:
        lengths["seq_kv"] = variant["kv_seq"]
    if "seq_q" in variant:
        lengths["seq_q"] = variant["seq_q"]
    group = {} if "group" not in variant else {"group": variant["group"]}
    shape = dict(LAUNCH, causal=variant["causal"], **lengths, **group)
    if variant.get("kernel") in DECODE_KERNELS:
        shape["decode_rows"] = shape["group"] * shape["seq_q"]
    return shape


def variant_launches(variant: dict) -> list[tuple[dict, Tiling]]:
    """The (launch keywords, tiling) pairs a variant is compiled as: ``variant_shape``
    over the sweep space; a decode variant over its block_n, stages and warps at the key
    length of its classes and each block_n's split count (``decode_launch``), ``block_m``
    ``DECODE_BLOCK_M``."""
    shape = variant_shape(variant)
    if variant["kernel"] not in DECODE_KERNELS:
        return [(shape, tiling) for tiling in sweep_space()]
    n_kv, splits = decode_launch(variant["keys"], variant["split"], variant["chunk"])
    return [(dict(shape, seq_kv=n_kv), Tiling(DECODE_BLOCK_M, bn, stages, warps, splits[bn]))
            for bn, stages, warps in itertools.product(BLOCKS, STAGES, WARPS)]


# ``tilesim sweep``'s tiling space (simulator.cli.sweep_cmd: BLOCKS, STAGES, WARPS).
BLOCKS, STAGES, WARPS = (16, 32, 64, 128, 256), (1, 2, 3, 4, 5), (4, 8)


def sweep_space() -> list[Tiling]:
    return [Tiling(bm, bn, st, w) for bm, bn, st, w in
            itertools.product(BLOCKS, BLOCKS, STAGES, WARPS)]


# A row's line as ``build`` writes it (``json.dumps`` with sorted keys): the key, JSON
# escaped, between these two; an unescaped quote cannot occur inside it.
_ROW_START, _ROW_KEY_END = '{"key": "', '", "result": '


def _load(arch: int = ARCH) -> tuple[dict, dict[str, str]]:
    """(header, JSON-escaped key -> its row's line) of the table of ``arch``
    (``TABLES``); ({}, {}) where there is none."""
    return _read(TABLES[arch]) if arch in TABLES else ({}, {})


@functools.lru_cache(maxsize=2)
def _read(path: Path) -> tuple[dict, dict[str, str]]:
    """The header, and each row's line by its key as the line has it (JSON-escaped). A
    row's result is parsed when it is looked up (``_result``): parsing all of them (some
    24 MB of JSON) took a quarter of a second, which every prediction command paid. A
    missing or damaged table is no table: the estimate stands (and the test of the table
    fails)."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            lines = f.read().splitlines()
        header = json.loads(lines[0])
        rows = {}
        for line in lines[1:]:
            if not line.startswith(_ROW_START):
                raise ValueError("not a row")
            rows[line[len(_ROW_START):line.index(_ROW_KEY_END)]] = line
    except (OSError, EOFError, ValueError, IndexError):
        return {}, {}
    return (header, rows) if isinstance(header, dict) else ({}, {})


def _result(line: str) -> dict | None:
    """A row's result; None where the line is damaged (the estimate stands for it)."""
    try:
        result = json.loads(line)["result"]
    except (ValueError, KeyError, TypeError):
        return None
    return result if isinstance(result, dict) else None


def _all_rows(arch: int = ARCH) -> dict[str, dict]:
    """Every row of the table of ``arch`` whose result parses, key -> result (``build``
    keeps them; a damaged row is compiled again, as a lookup finds none)."""
    rows = {}
    for escaped, line in _load(arch)[1].items():
        result = _result(line)
        if result is not None:
            rows[json.loads(f'"{escaped}"')] = result
    return rows


def header(arch: int = ARCH) -> dict:
    """The first line of the table of ``arch``: schema, Triton version, sources digest,
    what it covers; {} where there is none."""
    return _load(arch)[0]


def current(arch: int = ARCH) -> bool:
    """Whether the table of ``arch`` was compiled from the kernel sources as they are now."""
    head = header(arch)
    return bool(head) and head.get("sources") == _sources_now()


@functools.lru_cache(maxsize=1)
def _sources_now() -> str:
    return resources.sources_digest()  # the files do not change under a running process


def lookup(key: str) -> dict | None:
    """The shipped result of job ``key`` (``resources.job_key``) from the table of the
    architecture the key names, or None: no table for it, not covered, or the table is
    stale."""
    arch = _key_arch(key)
    if arch is None or not current(arch):
        return None
    line = _load(arch)[1].get(json.dumps(key)[1:-1])
    return None if line is None else _result(line)


def _key_arch(key: str) -> int | None:
    """The architecture a job key names ("fa2_fwd/90/bf16/..."), None if none."""
    parts = key.split("/", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def problem_rows(problem, tiling: Tiling, names: list[str], arch: int = ARCH
                 ) -> dict[str, dict]:
    """The rows of the table of ``arch`` of the named kernels for one attention problem
    (a ``traces.problem.AttentionProblem``, launched as ``kernels`` launch it) and tiling,
    by kernel name: those it has (in the dtype that ``STAND_IN`` names where it has the
    problem's dtype not, at ``HEADS_STAND_IN`` query heads where it has the problem's
    not), none where it is stale; keyed as
    ``resources.schedule_resources`` compiles them."""
    shape = resources.problem_shape(problem)
    shapes = [shape]
    if shape["heads"] != 1 and shape["heads"] % 16:
        shapes.append(dict(shape, heads=HEADS_STAND_IN))
    dtypes = [problem.dtype] + ([STAND_IN[problem.dtype]] if problem.dtype in STAND_IN else [])
    rows = {}
    for name in names:
        if name not in resources.KERNELS:
            continue
        for dtype, launch in itertools.product(dtypes, shapes):
            row = lookup(resources.job_key(name, arch, dtype, problem.head_dim, tiling,
                                           **launch))
            if row is not None:
                rows[name] = row
                break
    return rows


def build(arch: int = ARCH, out: Path | None = None, workers: int | None = None) -> int:
    """Compile every variant of ``arch`` (``VARIANTS_OF``) over the sweep space
    (``resources.measure``, whose cache keeps what is done) and write its table
    (``TABLES``, or ``out``) atomically; returns the number of jobs. The rows of the table
    as it is are kept, not compiled again, where it is current and of this Triton: adding
    a variant compiles that variant alone."""
    import triton

    out = TABLES[arch] if out is None else out
    kept = (_all_rows(arch) if current(arch) and header(arch).get("triton") == triton.__version__
            else {})
    rows: dict[str, dict] = {}
    for v in VARIANTS_OF[arch]:
        launches = variant_launches(v)
        shape = launches[0][0]  # every launch of a variant has the same keywords
        keys = [resources.job_key(v["kernel"], arch, v["dtype"], v["head_dim"], tiling,
                                  **shape) for _, tiling in launches]
        rows.update({key: kept[key] for key in keys if key in kept})
        todo = [(key, tiling) for key, (_, tiling) in zip(keys, launches, strict=True)
                if key not in rows]
        if not todo:
            continue
        print(f"compiling {v} ...", file=sys.stderr, flush=True)
        results = resources.measure([v["kernel"]], archs=(arch,), dtype=v["dtype"],
                                    head_dim=v["head_dim"],
                                    tilings=[tiling for _, tiling in todo],
                                    workers=workers, **shape)
        for (key, _), result in zip(todo, results, strict=True):
            rows[key] = result.to_dict()
    head = {"schema": SCHEMA, "triton": triton.__version__, "arch": arch,
            "sources": resources.sources_digest(), "launch": LAUNCH,
            "variants": VARIANTS_OF[arch], "command": _build_command(arch)}
    text = "\n".join([json.dumps(head, sort_keys=True)]
                     + [json.dumps({"key": k, "result": rows[k]}, sort_keys=True)
                        for k in sorted(rows)]) + "\n"
    _write_atomically(out, gzip.compress(text.encode("utf-8"), mtime=0))
    return len(rows)


def _build_command(arch: int) -> str:
    return "python -m kernels.table build" + ("" if arch == ARCH else f" --arch {arch}")


def _write_atomically(out: Path, data: bytes) -> None:
    """``data`` to ``out`` through a temporary file beside it and a rename."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would keep it from other users of a checkout
    os.replace(tmp, out)


def check_stand_in(samples: int = 12, seed: int = 6, workers: int | None = None,
                   arch: int = ARCH) -> dict:
    """Compile for ``arch`` ``samples`` tilings (drawn with ``seed`` from the sweep space)
    of each launch a row of its table stands for and compare the compile's facts with that row
    (module docstring): per stand-in ("fp16": the kernels the table holds only in bf16,
    compiled in fp16; "heads 12": every bf16 kernel that takes the head count, at 12 query
    heads) and kernel (with its launch's group, lengths or head dim where they are its
    own: ``_launch_label``), the jobs compared, and per fact that differed, how many and the
    range of compiled / table; ``no_row`` counts the jobs the table has no row to compare
    with (a stale table, or a variant not built yet)."""
    import random

    # (stand-in, variant whose row stands in, its launches, dtype and shape compiled)
    cases = []
    variants = VARIANTS_OF[arch]
    for v in variants:
        launches = variant_launches(v)
        shape = launches[0][0]  # every launch of a variant has the same keywords
        for dtype, stand_in in STAND_IN.items():
            if v["dtype"] == stand_in and dict(v, dtype=dtype) not in variants:
                cases.append((dtype, v, launches, dtype, shape))
        if v["dtype"] == "bf16" and "n_heads" in resources._int_arg_names(v["kernel"]):
            cases.append(("heads 12", v, launches, "bf16", dict(shape, heads=12)))
    report: dict[str, dict] = {}
    for case, v, launches, dtype, shape in cases:
        own = launches[0][0]
        # the same draw for every variant (a decode variant's tilings carry its splits)
        tilings = random.Random(seed).sample([t for _, t in launches], samples)
        compiled = resources.measure([v["kernel"]], archs=(arch,), dtype=dtype,
                                     head_dim=v["head_dim"], tilings=tilings,
                                     workers=workers, **shape)
        entry = report.setdefault(case, {}).setdefault(_launch_label(v),
                                                       {"jobs": 0, "differ": {}})
        for tiling, result in zip(tilings, compiled, strict=True):
            row = lookup(resources.job_key(v["kernel"], arch, v["dtype"], v["head_dim"],
                                           tiling, **own))
            if row is None:  # stale, or not built yet: nothing to compare with, said so
                entry["no_row"] = entry.get("no_row", 0) + 1
                continue
            entry["jobs"] += 1
            _tally_differences(entry["differ"], result.to_dict(), row)
    return report


def _launch_label(variant: dict) -> str:
    """A variant's kernel, and the launch it is compiled as where that is not ``LAUNCH``'s,
    and its head dim where that is not one of ``_variants``' own (64, 128): "fa2_bwd_dq",
    "fa2_bwd_dq group 4", "fa2_fwd seq 1000", "fa2_fwd kv_seq 1000", "fa2_fwd d 256"."""
    extra = [f"{name} {variant[name]}" for name in ("group", "seq", "kv_seq", "seq_q",
                                                     "keys", "split", "chunk")
             if name in variant]
    if variant["head_dim"] not in DEFAULT_HEAD_DIMS:
        extra.append(f"d {variant['head_dim']}")
    return " ".join([variant["kernel"], *extra])


def _tally_differences(differ: dict, mine: dict, row: dict) -> None:
    """Add to ``differ`` (fact -> {"jobs", "ratio": (least, most) of mine / row}) each fact
    of a compile ``mine`` that differs from the ``row`` standing in for it; the tiling's
    own fields aside (a compile shared by tilings names its first)."""
    for fact, value in row.items():
        if fact in ("dtype", "block_m", "block_n", "num_stages", "num_warps") \
                or mine.get(fact) == value:
            continue
        d = differ.setdefault(fact, {"jobs": 0, "ratio": None})
        d["jobs"] += 1
        if isinstance(value, (int, float)) and value and \
                isinstance(mine.get(fact), (int, float)):
            r = mine[fact] / value
            lo, hi = d["ratio"] or (r, r)
            d["ratio"] = (min(lo, r), max(hi, r))


def main(argv: list[str]) -> int:
    """``build`` or ``check-stand-in``, for sm_90 or ``--arch 80``; 2 on a bad command line."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m kernels.table")
    parser.add_argument("command", choices=("build", "check-stand-in"))
    parser.add_argument("--arch", type=int, choices=sorted(TABLES), default=ARCH)
    parser.add_argument("--samples", type=int, default=12,
                        help="check-stand-in: tilings drawn per launch (default 12)")
    args = parser.parse_args(argv)
    if args.command == "build":
        print(f"{build(args.arch)} compiles in {TABLES[args.arch]}")
    else:
        print(json.dumps(check_stand_in(samples=args.samples, arch=args.arch), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
