"""How many CTAs of a kernel fit on one SM at once (residency), and whether one fits at all.

Residency is the minimum over four limits: shared memory (the schedule's SRAM per CTA plus
a small reserve the driver keeps per CTA), registers, threads and the hardware's CTA cap.
Where no compile says what shared memory a kernel takes, an attention forward loop on
sm_90 (FA2's forward, decode's split) takes what Triton allocates for it
(``triton_forward_shared_bytes``), the rest the schedule's SRAM.
Registers are estimated from the tiling unless the compiled kernel's count is given
(``CompiledResources``: from ``kernels resources`` or a device run's ``kernel_facts``): an
attention CTA keeps its fp32 accumulator (``block_m x head_dim``), its score tile
(``block_m x block_n``) and row statistics in registers, spread over its threads, plus a
fixed overhead for addresses and indices. That rule is FlashAttention's forward; other
kernels hold more (the backward's dK/dV) or far less (naive softmax's one row), so the
compiled counts are worth giving where they exist (docs/validation.md, "Occupancy").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from simulator.hardware import Hardware
from traces.schedules.base import LOAD, Access, Kernel
from traces.tiling import Tiling

SMEM_RESERVED_PER_CTA_BYTES = 1024  # CUDA reserves 1 KB of shared memory per block (sm_80+)
REGISTER_OVERHEAD_PER_THREAD = 40  # addresses, loop indices, masks: typical ptxas counts
REGISTER_ALLOCATION_UNIT = 8  # registers are allocated per thread in multiples of 8


@dataclass(frozen=True)
class Residency:
    ctas_per_sm: int
    limited_by: str  # "smem", "registers", "threads", "ctas" or "does not fit"
    smem_per_cta_bytes: int
    registers_per_thread: int


@dataclass(frozen=True)
class CompiledResources:
    """What the compiler gave one kernel; None where not known (the estimate stands). A
    register count of 0 is no count (a compile that reports none), so it is stored as None:
    this is the one place that decides it."""

    registers_per_thread: int | None = None
    shared_bytes: int | None = None
    # Local-memory bytes per thread one iteration of the main loop loads plus stores: the
    # registers it spills and reloads (``kernels.resources.main_loop``). They pass
    # through the SM's L1 data path, which shared memory uses too (``simulator.sim.program``).
    spill_bytes_per_iteration: int | None = None
    # The times per iteration a warp waits for reloaded spills (``kernels.resources.
    # reload_waits``): each an L2 round trip on the iteration's path (``simulator.sim.program``).
    spill_reload_waits: int | None = None
    # The instructions each warp issues per iteration of the main loop, and in a kernel
    # without loops the instructions each warp issues in all (``kernels.resources.
    # main_loop``, ``straight_instructions``): with the preset's ``warp_cycles_per_instruction``
    # the least time a warp takes through them (``simulator.sim.program``).
    loop_instructions: int | None = None
    straight_instructions: int | None = None
    # In a kernel with loops, the instructions each warp issues outside them: before its
    # first loop and after it (``kernels.resources.outside_loop_instructions``), at that
    # pace the least time of the CTA's prologue and epilogue (``simulator.sim.program``).
    prologue_instructions: int | None = None
    epilogue_instructions: int | None = None
    # The instructions each warp issues per iteration of the main loop's masked copy
    # (``kernels.resources.masked_loop_instructions``): the least path of the iterations
    # the schedule marks masked (``traces.schedules.base.Kernel.loop_masked``).
    masked_loop_instructions: int | None = None
    # Of ``spill_bytes_per_iteration``, the bytes a thread stores (the rest it reloads), and
    # the thread's stack frame, where ptxas keeps what it spills: which of them reach L2
    # (``simulator.spills``).
    spill_store_bytes_per_iteration: int | None = None
    stack_frame_bytes: int | None = None
    # Where they come from: "compiled" here (``--compiled-resources``, a record's facts) or
    # "table", tilesim's table of compiles (``kernels.table``).
    source: str = "compiled"

    def __post_init__(self):
        if self.registers_per_thread == 0:
            object.__setattr__(self, "registers_per_thread", None)


def spill_fields(loaded: int | None, stored: int | None, frame: int | None) -> dict:
    """``CompiledResources``' spill fields from a compile's spilled bytes loaded and stored
    per thread and main-loop iteration and its stack frame: their sum where both are known,
    the stores, and the frame only beside the sum (records made before 2026-12-02 read the
    frame from ``LOCAL`` alone, 0 for a kernel that spills, and carry no sum)."""
    total = None if loaded is None or stored is None else int(loaded) + int(stored)
    return {"spill_bytes_per_iteration": total,
            "spill_store_bytes_per_iteration": None if stored is None else int(stored),
            "stack_frame_bytes": None if total is None or frame is None else int(frame)}


def kernel_residency(kernel: Kernel, tiling: Tiling, head_dim: int, hw: Hardware,
                     compiled: Mapping[str, CompiledResources] | None = None) -> Residency:
    """``residency``, with the registers and shared memory of ``compiled[kernel.name]``
    where given."""
    given = (compiled or {}).get(kernel.name) or CompiledResources()
    return residency(kernel, tiling, head_dim, hw, given.registers_per_thread,
                     given.shared_bytes)


def estimated_registers_per_thread(kernel: Kernel, tiling: Tiling, head_dim: int,
                                   cap: int = 255) -> int:
    """Registers per thread from the fp32 tiles a CTA keeps in registers, at most ``cap``
    (the hardware's limit per thread; beyond it the compiler spills)."""
    fp32_values = tiling.block_m * head_dim + tiling.block_m * tiling.block_n + 2 * tiling.block_m
    per_thread = -(-fp32_values // tiling.threads) + REGISTER_OVERHEAD_PER_THREAD
    rounded = -(-per_thread // REGISTER_ALLOCATION_UNIT) * REGISTER_ALLOCATION_UNIT
    return min(rounded, cap)


def triton_forward_shared_bytes(kernel: Kernel, tiling: Tiling, hw: Hardware) -> int | None:
    """The shared memory Triton (3.6.0, the H200 records' compiler) gives an attention
    forward loop on sm_90, and FA2's forward at head_dim 64 and 128 on sm_80; None for
    another kernel or architecture.

    The loop is FA2's forward and decode's split: one tile loaded before it (Q), two per
    iteration (K and V), the scores' matmul, then P times V. Read off their compiles:
    the tile loaded before the loop stays (its rows padded to the matmul's); with two or
    more stages a wgmma kernel keeps ``num_stages`` buffers of each tile loaded in the loop
    and an mma.sync kernel ``num_stages - 1``, plus P, which it passes through shared
    memory to the second matmul (wgmma takes it from registers); with one stage, one
    buffer of the larger tile. It is every one of the 8,000 FA2 forward compiles of
    tilesim's table at d = 64 and 128 (``kernels/table.py``: bf16 and fp16, causal or not,
    the sweep's 250 tilings; in bf16 with GQA too; at lengths on the multiples of 16 and
    off them, both or the keys' alone) and of 80 compiles of decode's split
    (d = 64 and 128, block_n 16 to 256, 1 to 4 stages, 4 and 8 warps), byte for byte
    (``tests/test_occupancy_triton_smem.py``). The schedules' SRAM (``num_stages``
    buffers of each tile) is the wgmma kernel's at two stages or more, and up to twice
    the mma.sync kernel's.

    On sm_80 every matmul is mma.sync and the same rule holds but for P, which Triton
    passes through shared memory only where the tile has fewer rows than the head dim
    (block_m < head_dim; at 64 x 64 and two stages, 16 KB less than on sm_90 at d = 128,
    8 KB less at d = 64): every FA2 forward compile of tilesim's sm_80 table (6,000: the
    same launches in bf16, with GQA and without) and its sample in fp16, byte for byte.
    It is not taken for decode's split there, nor at other head dims, nor for fp32 or
    fp8 tiles, which no compile of ours bears out.
    """
    from simulator.sim.compute import uses_wgmma

    pre = [a for a in kernel.pre if isinstance(a, Access) and a.kind == LOAD
           and a.tile_cols > 1]
    loop = [a for a in kernel.loop if isinstance(a, Access) and a.kind == LOAD
            and a.tile_cols > 1]
    forward = ([d.a for d in kernel.dots] == ["smem", "result"] and len(pre) == 1
               and len(loop) == 2)
    # the compiles that bear it out are of bf16 and fp16 kernels (the only ones tilesim's
    # Triton twins compile): two-byte tiles
    two_bytes = all(kernel.tensors[a.tensor].elem_bytes == 2 for a in (*pre, *loop))
    if hw.compute_capability not in (80, 90) or not forward or not two_bytes:
        return None
    head_dim = pre[0].tile_cols
    if hw.compute_capability == 80 and (kernel.name != "fa2_fwd" or head_dim not in (64, 128)):
        return None  # only FA2's forward at these head dims bears the rule out on sm_80

    def nbytes(access: Access, rows: int) -> int:
        return rows * access.tile_cols * kernel.tensors[access.tensor].elem_bytes

    wgmma = uses_wgmma(hw, kernel.mma_rows, tiling.num_warps)
    total = sum(nbytes(a, max(a.tile_rows, kernel.mma_rows)) for a in pre)
    tiles = [nbytes(a, a.tile_rows) for a in loop]
    if tiling.num_stages < 2:
        total += max(tiles)
    else:
        total += sum(tiles) * (tiling.num_stages if wgmma else tiling.num_stages - 1)
    p_in_shared = hw.compute_capability == 90 or tiling.block_m < head_dim
    if not wgmma and p_in_shared:  # P, [rows, block_n], in the operands' type (V's)
        p_v = kernel.dots[1]
        total += p_v.m * p_v.k * kernel.tensors[loop[1].tensor].elem_bytes
    return total


def residency(kernel: Kernel, tiling: Tiling, head_dim: int, hw: Hardware,
              registers_per_thread: int | None = None,
              smem_bytes: int | None = None) -> Residency:
    """CTAs of ``kernel`` resident per SM; 0 when one CTA does not fit."""
    smem = smem_bytes
    if smem is None:
        smem = triton_forward_shared_bytes(kernel, tiling, hw)
    if smem is None:
        smem = kernel.sram_bytes
    given = CompiledResources(registers_per_thread, smem_bytes)  # decides what 0 means
    regs = given.registers_per_thread
    if regs is None:
        regs = estimated_registers_per_thread(kernel, tiling, head_dim,
                                              hw.max_registers_per_thread)
    allocated = -(-regs // REGISTER_ALLOCATION_UNIT) * REGISTER_ALLOCATION_UNIT
    if smem > hw.smem_per_cta_max_bytes:
        return Residency(0, "does not fit", smem, regs)
    limits = {
        "smem": hw.smem_per_sm_bytes // (smem + SMEM_RESERVED_PER_CTA_BYTES),
        "registers": hw.registers_per_sm // (allocated * tiling.threads),
        "threads": hw.max_threads_per_sm // tiling.threads,
        "ctas": hw.max_ctas_per_sm,
    }
    name = min(limits, key=lambda k: limits[k])
    return Residency(int(limits[name]), name if limits[name] > 0 else "does not fit", smem, regs)
