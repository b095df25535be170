"""How long a compute step takes on one SM: unit throughput and the CTA's own critical path.

A step's work is counted by the schedules as tensor-core FLOPs, exps (special-function unit)
and other FLOPs (FMA-free elementwise work on the FP32 ALUs). Each unit runs at its chip rate
divided evenly over the SMs:

- tensor cores: ``tensor_flops_per_s[dtype] x tensor_efficiency`` (fp32 inputs mean TF32)
  when the kernel's matmuls compile to Hopper's asynchronous wgmma, ``x
  tensor_sync_efficiency`` when they compile to synchronous mma.sync (``uses_wgmma`` says which);
- special-function unit: ``exp_ops_per_s`` (FA3 §3.1 counts 16 ops/SM/clock);
- FP32 ALUs: ``fp32_flops_per_s / 2`` operations per second, because the datasheet counts
  an FMA as two FLOPs and every "other" FLOP is one instruction at FMA throughput;
- shared memory (``smem``; the L1 data pipe it shares): the operand bytes mma.sync matmuls
  read from it, so many per tensor FLOP (``traces.schedules.mma_layout.matmul_costs``),
  plus the bytes any kernel with matmuls moves through it to stage its tiles
  (``program.staged_bytes``: every tile loaded is written into it, every tile stored
  written and read back) and the global loads and stores of those tiles, which the same
  pipe carries (``program.global_pipe_bytes``: every stored tile, and every tile loaded
  through registers rather than by ``cp.async``, two passes a byte), at
  ``smem_bandwidth_bytes_per_clk_per_sm x sm_clock_hz``, and
  the warp shuffles of the kernel's row reductions, a clock each (``mma_layout.shuffles``).
  Measured on the H200, this traffic is what holds back small mma.sync tiles: a 32 x 32
  FA2 forward kept the L1 data pipe 73-85% busy and its tensor pipe 16-22%
  (``validation/records/raw/h200-stalls-2026-11-30``), the warps stalled on
  short-scoreboard waits; Nsight Compute's shared-memory bytes of the records' mma.sync
  kernels are the reads plus the staging (``tests/test_mma_layout.py``).
  Registers a loop spills to local memory and loads back every iteration
  (``occupancy.CompiledResources.spill_bytes_per_iteration``, read from the compile) take
  the same L1 data path, in any kernel. wgmma reads its operands from shared memory
  itself, at the rate its efficiency covers (a matmul's measured throughput, its own
  operand reads included): a wgmma kernel's ``smem`` unit times its staging, its shuffles
  and its spills. The pipe's counter does see those reads: with them (B, and A unless it
  is in registers, by every 64-row tile of each matmul) the wavefronts of the FA2 wgmma
  launches were 0.70-1.51 times the model's bytes / 128, without them 1.55-8.3 times. But
  timed on the pipe as well, on top of the tensor rate that already covers them,
  they made the FA2 forward 5.7% and dQ 23% too slow on average (12-05), so the rate
  keeps them. That staging is the mma.sync
  kernels': our sm_90 compiles stage the same tiles with the same instructions (naive_qk
  at 64 x 64: ``LDG``, ``STS``, ``LDSM``, ``STG``, 56 KB per CTA, of which Nsight Compute's
  shared bytes are the 32 KB the rule gives them; the loops' ``LDGSTS``), and in every wgmma
  launch of the H200 stall profiles the pipe's measured wavefronts took 1.1-8.6 times the
  time the model gives those bytes, never less (``tests/test_mma_layout.py``).

Clock. The exp unit's, the FP32 ALUs' and shared memory's rates are counts per clock
(16 exps, 128 FP32 lanes, 128 bytes per SM and clock) at the preset's ``sm_clock_hz``. A
kernel with matmuls runs them at ``sm_clock_tensor_hz`` where the preset gives it
(``Hardware.at_tensor_clock``, applied per kernel in ``program.kernel_program``): the H200
ran every profiled launch of our kernels with matmuls at 1.79 GHz (median), those without
at 1.97 (``validation.stalls``). The tensor rate stays: its efficiency is a matmul's
measured throughput, at the clock it ran.

Overlap model. An SM is ``sm_subpartitions`` processing blocks, each with its own tensor
core, exp unit and ALUs and its own warps (the architecture whitepapers); a CTA's warps are
spread evenly over them. Within one warp the work of a step is a dependent chain — the
scores' matmul, then their softmax, then the second matmul (FA3 §3.1–3.2: FlashAttention-2
runs softmax and GEMMs one after the other within a warpgroup; overlapping them needs more
warps or explicit ping-pong scheduling) — so one warp per processing block runs its units in
turn, and ``c`` warps per block (``num_warps / sm_subpartitions``) could overlap one
another's units. Measured, they overlap only in part. The preset's ``unit_overlap`` is the
share of the other units' time that overlaps the busiest one (0: the units take turns; 1:
only the busiest counts), one share for all four units: the tensor, exp (XU) and FMA
pipes and the L1 data pipe that shared memory, shuffles and global loads and stores go
through. Nsight Compute measures each pipe's busy share of a launch
(``validation/records/raw/h200-stalls-2026-11-30``; the data pipe as its LSU wavefronts):
where the four sum past 100%, at least ``(sum - 100%) / (sum - busiest)`` of the other
pipes' time ran while the busiest one was busy, since time spent by one pipe at a time adds
up to at most 100%. In 72 of the 143 profiled launches of our kernels on the H200 they
did, by 3-78 points: the bounds run 0.05-0.82, median 0.53 (``python -m validation.stalls``).
The median is the preset's value. A bound is a least value, and a launch that sums below
100% bounds nothing (its pipes may take turns and still leave the SM idle some of the
time), so the share is what the launches that are busy enough to show it show. Until
2026-12-05 the three math pipes overlapped by the median of their own bounds (0.19, from
9 launches: the three alone rarely pass 100%) and shared memory by a second share (0.63)
against them; with the L1 data pipe counted as the fourth pipe the bound is tighter and
the split unneeded. What the one share leaves out: the bounds grow with the CTAs an SM
holds (their registers and shared memory as the device compiled them): median 0.27 over
the 9 launches with one resident CTA, 0.48 with two (17), 0.53-0.68 with three to six
(30), 0.44-0.79 with eight to sixteen (12, naive attention's QK^T). Independent CTAs are
what fill one another's gaps; the warps of one CTA meet at a barrier every iteration. A
share by CTA count drawn through these medians (``1 - 0.73 x ctas ** -0.4``) did worse
on the H200 records than the one share overall (12-05, with the device's loop facts):
FA2's forward 7.0% time MAPE against 5.5%, two of its shapes' predicted-best tilings over
5% slower than their best against none (the one-CTA forwards at d = 128, 8 warps, ran
faster than so little overlap gives); its backward 7.4% against 8.6%. So the trend is
recorded, not modelled. Two numbers per step follow:

- ``busy`` (*throughput*): seconds the SM's units are occupied,
  ``max + (1 - unit_overlap) x (sum - max)`` over the four units — what the step takes from
  the SM that other resident CTAs cannot use;
- ``path`` (*critical path*): how long the step takes for its CTA alone,
  ``max(busy, sum / c)`` (with fewer warps than blocks, ``c = 1`` and the
  CTA uses only ``num_warps`` of the blocks, so every unit time is scaled up by
  ``sm_subpartitions / num_warps``).

CTAs resident on one SM share its units: a step ends ``path`` after it starts, but not
before the SM's units have done the ``busy`` seconds queued before it and its own.
"""

from __future__ import annotations

import numpy as np

from simulator.hardware import Hardware
from traces.schedules.mma_layout import WARPGROUP_WARPS

UNITS = ("tensor", "exp", "fp32", "smem")


# Triton emits wgmma for a matmul when the target is sm_90, the CTA has whole warpgroups
# (num_warps a multiple of 4) and the result's rows are a multiple of 64 (its MMA v3
# eligibility rule; tests/test_kernels_aot.py checks it against our compiled kernels).
WGMMA_ROWS = 64


def uses_wgmma(hw: Hardware, mma_rows: int, num_warps: int) -> bool:
    """Whether a kernel whose matmuls have ``mma_rows`` rows compiles to wgmma."""
    return (hw.compute_capability == 90 and mma_rows > 0 and mma_rows % WGMMA_ROWS == 0
            and num_warps % WARPGROUP_WARPS == 0)


def sm_rates(hw: Hardware, dtype: str, wgmma: bool = True) -> np.ndarray:
    """Operations per second of one SM's tensor cores, exp unit and FP32 ALUs, and bytes per
    second of its shared memory (``UNITS``)."""
    return np.array([
        hw.tensor_rate(dtype, wgmma) / hw.sm_count,
        hw.exp_ops_per_s / hw.sm_count,
        hw.fp32_flops_per_s / 2 / hw.sm_count,
        hw.smem_bandwidth_bytes_per_clk_per_sm * hw.sm_clock_hz,
    ])


def unit_seconds(amounts: np.ndarray, hw: Hardware, dtype: str, wgmma: bool = True,
                 smem_bytes_per_flop: float = 0.0,
                 staged_bytes: np.ndarray | None = None,
                 shuffles_per_flop: float = 0.0) -> np.ndarray:
    """Seconds each unit of one SM needs (``[4, n]``, ``UNITS``): ``amounts`` is ``[3, n]``
    (tensor FLOPs, exps, other FLOPs); the kernel issues ``shuffles_per_flop`` warp
    shuffles per tensor FLOP, each a clock of the shared-memory data path (as many bytes as
    it moves per clock), and ``staged_bytes`` (``[n]``) move through it to stage the step's
    tiles; an mma.sync kernel (``wgmma`` False) also reads ``smem_bytes_per_flop`` bytes of
    shared memory per tensor FLOP there (wgmma's operand reads its tensor rate covers)."""
    amounts = np.asarray(amounts, dtype=np.float64)
    operands = 0.0 if wgmma else smem_bytes_per_flop
    per_flop = operands + shuffles_per_flop * hw.smem_bandwidth_bytes_per_clk_per_sm
    smem = amounts[0] * per_flop
    if staged_bytes is not None:
        smem = smem + staged_bytes
    return np.vstack([amounts, smem[None]]) / sm_rates(hw, dtype, wgmma)[:, None]


def busy_seconds(unit_s: np.ndarray, hw: Hardware) -> np.ndarray:
    """Seconds a step occupies the SM's units (module docstring): the busiest unit's
    seconds and ``1 - unit_overlap`` of the others'. ``unit_s`` is ``[units, n]`` (or
    ``[units]``, one step: the roofline's kernel totals) in ``UNITS`` order, or its first
    three (the math pipes alone)."""
    busiest = unit_s.max(axis=0)
    return busiest + (1.0 - hw.unit_overlap) * (unit_s.sum(axis=0) - busiest)


def path_seconds(unit_s: np.ndarray, num_warps: int, hw: Hardware) -> np.ndarray:
    """A step's critical path for its CTA alone (module docstring); ``unit_s`` is
    ``[units, n]``."""
    blocks = hw.sm_subpartitions
    used = min(num_warps, blocks)  # processing blocks the CTA's warps occupy
    per_block = unit_s * (blocks / used)  # seconds on the blocks the CTA uses
    warps_per_block = max(1.0, num_warps / blocks)
    return np.maximum(busy_seconds(per_block, hw), per_block.sum(axis=0) / warps_per_block)
