"""A kernel's program as flat arrays: what every CTA loads, stores and computes.

The schedules describe a kernel as one program template (prologue, loop, epilogue) whose
steps are numpy functions of the CTA coordinates and the loop index. The engines need the
evaluated steps as arrays. Prologue and epilogue are evaluated for every CTA. The loop is
where the volume is (a causal FA2 forward at N = 131072 has 33 million iterations), so it
is evaluated for one *period* of CTAs only when the grid repeats over the batch*heads
planes (``traces.schedules.period``, which the trace expander shares): CTA ``c`` runs the
loop of CTA ``c % P`` with every access moved by a constant plane offset per step
(``plane_offset[step, c]``). The period is checked exactly on the grid and verified on the
loops of a spread of CTAs; otherwise the whole grid is evaluated.

Compute steps count the work the hardware issues (``Compute.issued``: whole tiles, padded
rows), not only the valid elements ``count`` reports, times the copies the compiler's warp
layout makes of them (``traces.schedules.mma_layout``: a result with fewer rows than the
warps laid along them is computed by several warps). They are folded, per unit (CTA or
iteration), into seconds of the tensor cores, the exp unit, the FP32 ALUs and the shared
memory of one SM (for a kernel with matmuls: its tiles' staging — each loaded tile written
into shared memory, each stored tile written and read back for coalesced stores — and the
global loads and stores of those tiles, which pass through the same pipe (each stored
tile, and each tile loaded through registers outside a pipelined loop, twice more;
``global_pipe_bytes``), charged to the phase's first compute step, or to a step of its own
in a phase without one; ``staged_bytes``; the shuffles of its row reductions; where its
matmuls are mma.sync, their operand reads, which for wgmma its tensor rate covers; and, in
any kernel whose compile says so,
the registers its loop spills to local memory and loads back every iteration, which pass
through the same L1 data path), into busy seconds (how long the SM's
units are occupied, ``compute.busy_seconds``) and into critical-path seconds (how long the
CTA waits; ``simulator.sim.compute``).
Every loop iteration's path also carries the preset's ``iteration_overhead_s``, and, in a
loop that spills, an L2 round trip (the preset's ``l2_latency_s``) for each time its warps
wait for reloaded spills (``kernels.resources.reload_waits``, from the compile's SASS; one
where only the spilled bytes are known); the bytes of its spills that reach L2 (the
stores, and the reloads that miss L1: ``simulator.spills``) cross L2 and the SM's port
each iteration as its tiles do (``KernelProgram.spill``). The reloads reach L2: in the H200
records, FA2's forward at d = 128, 128 x 64, 4 warps (255 registers, spilling in its loop)
read 12-20 KB and wrote 15-17 KB more of L2 per CTA and iteration than its tiles (it
stores 14.8 KB and reloads 32.8 KB of spills; the rule gives 12.5 KB of them from L2), and
Nsight Compute has its warps waiting on long scoreboards (L1TEX: global and local memory)
3.6 cycles per instruction, where the same forward at 128 x 32 does not show the stall, and
L1 hitting 5% of its sectors (``validation/records/raw/h200-stalls-2026-11-30``).
No warp goes through its instructions faster than the preset's
``warp_cycles_per_instruction`` each (``issue_floor_s``; ``validation.pace`` measured it:
the fewest cycles per instruction of any loop in the H200 records). Where the compile gives
the count, a loop iteration's path is at least its main loop's instructions at that pace,
and a kernel without loops (naive softmax, the backward's preprocess) has all of its
instructions at that pace as the least path of its one compute step. Naive softmax at
N = 16k, causal, with 4 warps issues 2,253 instructions a warp for its one row: 5.9 us at
5.15 cycles each, where its units would do the row's work in 0.8 us; measured, its CTAs
took 8.9 us each (two resident per SM; the H200 records). In a kernel with loops the
instructions outside them set the least path of the prologue (those before the first
loop) and of the epilogue (those after it; ``kernels.resources.outside_loop_instructions``):
setting up pointers, the software pipeline's first loads and last waits, normalizing and
storing the result. FA2's forward issues 422-1,601 of them a warp (16 x 64 at d = 64 to
128 x 64 at d = 128, Triton 3.6), 1.2-3.6 iterations' worth, and on the H200 records each
of its CTAs took 1.6-7.2 us more than the model gave it (the intercepts of its kernel
durations against the iterations per CTA, N = 1k to 16k), the slopes within 7%. The
iterations over the blocks that need a mask (the causal diagonal, a partial last tile) run
the loop's masked copy, which issues more instructions (``Kernel.loop_masked``,
``kernels.resources.masked_loop_instructions``): FA2's causal forward at 128 x 128 with 8
warps, d = 128, 499 unmasked and 1,006 masked (Triton 3.6), one masked iteration a CTA;
at N = 1k its CTAs average 4.5 iterations, so the masked one is a fifth of their
instructions.

**HBM reads of parts of lines** (``hbm_line_cost``). A load whose contiguous runs of bytes
are shorter than an L2 line (the preset's ``l2_line_bytes``, 128 B) misses a part of each
line, and HBM serves that part in the time of the whole line: each missed byte takes
``line / run`` bytes of its capacity (``costs``), the DRAM bytes counted as they are. A
tile's run is one of its rows, or the whole tile where its rows are whole rows of the
tensor (Q, K, V, O and their gradients in every schedule); the run is rounded up to the
32-byte sectors L2 moves. Naive attention's P·V at ``BN = 32`` reads P (N x N, bf16) in
rows of 64 B, half a line each, and reads the other half an iteration later, when the
first fetch has long completed. On the H200 (the records of 2026-11-30) it read P at
2.27-2.33 TB/s at every N from 1k to 16k, where the same kernel at ``BN = 64`` (128-byte
rows) read it at 3.8 TB/s and HBM's effective rate is 4.40; the rule gives 2.20. What
limits it (row activations, or the memory controller's requests per second) is not
modelled, only the cost. Stores are whole lines by the time L2 writes them back: a kernel
that writes S in 64-byte rows writes the other half of each line from the next CTA at
about the same time.

Within a phase the engines issue all loads together, run the compute when they have
arrived, then issue the stores; every schedule's phases are written in that order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simulator.hardware import L2_SECTOR_BYTES, Hardware
from simulator.occupancy import CompiledResources, Residency, kernel_residency
from simulator.sim.compute import UNITS, busy_seconds, path_seconds, unit_seconds, uses_wgmma
from simulator.spills import NO_SPILLS, SpillTraffic, spill_traffic
from traces.schedules import Schedule
from traces.schedules.base import LOAD, STORE, Access, Kernel, valid_extent
from traces.schedules.mma_layout import MatmulCosts, matmul_costs
from traces.schedules.period import evaluate_steps, periodic_loop


@dataclass
class Phase:
    """Steps of one phase evaluated for ``u`` units; access steps are rows, in program order."""

    kind: np.ndarray  # [k] LOAD or STORE
    tensor: np.ndarray  # [k] index into the schedule's tensors
    tile_rows: np.ndarray  # [k]
    tile_cols: np.ndarray  # [k]
    mask: np.ndarray  # [k, u] the access happens
    plane: np.ndarray  # [k, u]
    row_block: np.ndarray  # [k, u]
    col_block: np.ndarray  # [k, u]
    nbytes: np.ndarray  # [k, u] valid bytes moved, 0 where masked
    # [k] HBM capacity each missed byte of the access takes, before ``costs.miss_occupancy``
    # (``hbm_line_cost``: more than 1 where a load's rows are shorter than a line)
    hbm_cost: np.ndarray
    work: np.ndarray  # [3, u] tensor FLOPs, exps, other FLOPs issued (Compute.issued)
    unit_s: np.ndarray  # [4, u] seconds of tensor cores, exp unit, FP32 ALUs, shared memory
    compute_s: np.ndarray  # [u] seconds the units are busy (compute.busy_seconds), summed
    path_s: np.ndarray  # [u] critical-path seconds, summed over the compute steps
    # [u] bytes of global loads and stores the L1 data pipe moves beside shared memory's,
    # each ``GLOBAL_PIPE_PASSES`` times (``global_pipe_bytes``; in kernels with matmuls,
    # where the pipe is timed; else 0)
    pipe_bytes: np.ndarray

    @property
    def units(self) -> int:
        return self.compute_s.shape[0]

    def bytes_of(self, kind: int) -> np.ndarray:
        """Bytes per unit moved by the steps of ``kind`` (LOAD or STORE)."""
        rows = self.kind == kind
        return self.nbytes[rows].sum(axis=0) if rows.any() else np.zeros(self.units, np.int64)


@dataclass
class KernelProgram:
    """Everything the engines need about one kernel launch."""

    name: str
    grid: int
    sram_bytes: int
    residency: Residency
    loop_count: np.ndarray  # [grid]
    period: int  # CTA c runs the loop of CTA c % period (moved by plane_offset)
    pre: Phase  # units: CTAs
    loop: Phase  # units: iterations of CTAs 0..period-1, CTA after CTA
    post: Phase  # units: CTAs
    loop_first: np.ndarray  # [period] first loop unit of each CTA of the period
    plane_offset: np.ndarray  # [k_loop, grid] plane shift of CTA c against CTA c % period
    # What each loop iteration's spills move through L2 and the SM's port (``spills``)
    spill: SpillTraffic = NO_SPILLS
    _totals: dict = field(default_factory=dict, repr=False)

    @property
    def iterations(self) -> int:
        return int(self.loop_count.sum())

    def loop_units(self, cta: int) -> range:
        start = int(self.loop_first[cta % self.period])
        return range(start, start + int(self.loop_count[cta]))

    def totals(self) -> dict[str, np.ndarray]:
        """Per-CTA sums over all three phases: load and store bytes, compute seconds, work
        issued, global bytes through the L1 data pipe (``global_pipe_bytes``)."""
        if not self._totals:
            reps = np.arange(self.grid) % self.period
            count, first = self.loop_count[: self.period], self.loop_first

            def per_cta(pick):
                loop = segment_sums(pick(self.loop), first, count)[..., reps]
                return loop + pick(self.pre) + pick(self.post)

            self._totals.update(
                load_bytes=per_cta(lambda p: p.bytes_of(LOAD)),
                store_bytes=per_cta(lambda p: p.bytes_of(STORE)),
                compute_s=per_cta(lambda p: p.compute_s),
                unit_s=per_cta(lambda p: p.unit_s),
                work=per_cta(lambda p: p.work),
                pipe_bytes=per_cta(lambda p: p.pipe_bytes),
            )
        return self._totals


def segment_sums(x: np.ndarray, first: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Sums of ``x[..., first[i] : first[i] + count[i]]`` (segments are contiguous, in order)."""
    out = np.zeros(x.shape[:-1] + (first.shape[0],), dtype=x.dtype)
    nonempty = count > 0
    if nonempty.any():
        out[..., nonempty] = np.add.reduceat(x, first[nonempty], axis=-1)
    return out


def _evaluate(steps: list, evaluated: tuple[np.ndarray, np.ndarray], schedule: Schedule,
              hw: Hardware, wgmma: bool, costs: MatmulCosts, staging: bool = False,
              spilled: float = 0.0, pipelined: bool = False) -> Phase:
    """A phase from its steps' values and masks (``traces.schedules.period.evaluate_steps``)
    for every unit; ``wgmma``: the kernel's matmuls are asynchronous (``compute.uses_wgmma``);
    ``costs``: what the compiler's warp layout adds to its compute steps (replicated work
    and, with mma.sync, shared-memory reads: ``mma_layout.matmul_costs``); ``spilled``:
    local-memory bytes every unit moves through the L1 data path (spills); ``pipelined``:
    the phase is a loop whose loads Triton pipelines (``cp.async``: global to shared memory
    directly, ``global_pipe_bytes``)."""
    values, masks = evaluated
    units = masks.shape[1]
    names = schedule.tensor_names
    rows = [k for k, s in enumerate(steps) if isinstance(s, Access)]
    accesses = [steps[k] for k in rows]
    mask = masks[rows]
    plane, row_block, col_block = (values[rows, f] for f in range(3))
    nbytes = np.zeros(mask.shape, dtype=np.int64)  # valid bytes of each tile moved
    for row, step in enumerate(accesses):
        tensor = schedule.tensors[step.tensor]
        nbytes[row] = (valid_extent(row_block[row], step.tile_rows, tensor.rows)
                       * valid_extent(col_block[row], step.tile_cols, tensor.cols)
                       * tensor.elem_bytes)
    phase = Phase(
        kind=np.array([s.kind for s in accesses], dtype=np.int64),
        tensor=np.array([names.index(s.tensor) for s in accesses], dtype=np.int64),
        tile_rows=np.array([s.tile_rows for s in accesses], dtype=np.int64),
        tile_cols=np.array([s.tile_cols for s in accesses], dtype=np.int64),
        mask=mask, plane=plane, row_block=row_block, col_block=col_block,
        nbytes=np.where(mask, nbytes, 0),
        hbm_cost=np.array([hbm_line_cost(s, schedule.tensors[s.tensor], hw) for s in accesses],
                          dtype=np.float64),
        work=np.zeros((3, units)),
        unit_s=np.zeros((len(UNITS), units)),
        compute_s=np.zeros(units), path_s=np.zeros(units), pipe_bytes=np.zeros(units, np.int64),
    )
    scale = np.array([costs.tensor_scale, costs.elementwise_scale, costs.elementwise_scale])
    staged = None
    if staging:
        tile_bytes = np.array([s.tile_rows * s.tile_cols * schedule.tensors[s.tensor].elem_bytes
                               for s in accesses], dtype=np.int64)
        phase.pipe_bytes = global_pipe_bytes(phase, tile_bytes, pipelined)
        staged = (staged_bytes(phase, tile_bytes)
                  + GLOBAL_PIPE_PASSES * phase.pipe_bytes).astype(np.float64)
    if spilled:
        staged = (0.0 if staged is None else staged) + np.full(units, float(spilled))
    computes = [k for k, step in enumerate(steps) if not isinstance(step, Access)]
    for n, k in enumerate(computes or [None]):
        if k is None:  # a phase without compute: its staging alone
            amounts = np.zeros((3, units))
        else:
            amounts = values[k].astype(np.float64) * masks[k] * scale[:, None]
        phase.work += amounts
        seconds = unit_seconds(amounts, hw, schedule.problem.dtype, wgmma,
                               costs.smem_bytes_per_flop,
                               staged if n == 0 else None, costs.shuffles_per_flop)
        phase.unit_s += seconds
        phase.compute_s += busy_seconds(seconds, hw)
        phase.path_s += path_seconds(seconds, schedule.tiling.num_warps, hw)
    return phase


def hbm_line_cost(access: Access, tensor, hw: Hardware) -> float:
    """HBM capacity one missed byte of ``access`` takes, in bytes (module docstring, "HBM
    reads of parts of lines"): ``line / segment`` for a load whose contiguous run of bytes
    (a tile row, or the whole tile where its rows are whole rows of the tensor), rounded
    up to 32-byte sectors as L2 moves it, is shorter than the preset's ``l2_line_bytes``;
    1 otherwise and for stores."""
    if access.kind != LOAD:
        return 1.0
    if access.tile_cols < tensor.cols:
        segment = access.tile_cols * tensor.elem_bytes
    else:
        segment = access.tile_rows * tensor.cols * tensor.elem_bytes
    sectors = -(-segment // L2_SECTOR_BYTES) * L2_SECTOR_BYTES
    return max(1.0, hw.l2_line_bytes / sectors)


def staged_bytes(phase: Phase, tile_bytes: np.ndarray) -> np.ndarray:
    """Bytes per unit of ``phase`` that a kernel with matmuls (mma.sync or wgmma) moves
    through shared memory to stage its tiles (module docstring), whole tiles
    (``tile_bytes``, one per access row) as its matmuls issue them: each loaded tile (not a
    vector of one column) is copied in once; each stored tile is written in the matmul's
    layout and read back in a coalesced one."""
    return _tiles_per_unit(phase, tile_bytes, np.where(phase.kind == STORE, 2, 1))


def _tiles_per_unit(phase: Phase, tile_bytes: np.ndarray, passes: np.ndarray) -> np.ndarray:
    """Bytes per unit of ``phase``: each access row's whole tile (``tile_bytes``; not a
    vector of one column) ``passes[row]`` times, where the access happens."""
    factor = passes * (phase.tile_cols > 1) * tile_bytes
    return (factor[:, None] * phase.mask).sum(axis=0, dtype=np.int64)


# Passes of the L1 data pipe each byte of a global load through registers (``LDG``) or a
# global store (``STG``) takes (``global_pipe_bytes``), where a byte of shared memory or of
# ``cp.async`` takes one. Counted from Nsight Compute's LSU wavefronts, not fitted
# (``validation/records/raw/h200-stalls-2026-11-30``, ``tests/test_mma_layout.py``): naive
# QK^T, whose loads and stores are all of that kind, kept the pipe busy 1.14-1.72 times
# what the model gave it at one pass, 0.91-1.19 times at two, the range of the mma.sync
# launches that move none (0.74-1.21). Which of the pipe's stages takes the second pass
# no source we have says.
GLOBAL_PIPE_PASSES = 2


def global_pipe_bytes(phase: Phase, tile_bytes: np.ndarray, pipelined: bool) -> np.ndarray:
    """Bytes per unit of ``phase`` of the global loads and stores of whole tiles that pass
    through the L1 data pipe beside their staging (``staged_bytes``; each byte takes
    ``GLOBAL_PIPE_PASSES`` of the pipe's): every stored tile (``STG``, after its trip
    through shared memory); every loaded tile that comes through registers (``LDG``, then
    ``STS`` into shared memory: outside a loop, which Triton does not pipeline), not in a
    pipelined loop (``LDGSTS``, ``cp.async``: global to shared memory in one pass, the
    staging's). Read
    from our sm_90 compiles: naive_qk loads Q and K with ``LDG.E.128`` and ``STS.128`` and
    stores S with ``STG.E.128`` after ``STSM``/``LDS``; naive_pv loads its P and V tiles in
    its loop with ``LDGSTS.E.BYPASS.128``; wgmma tilings of both do the same (naive_qk at
    64 x 64: ``LDG.E.128``, ``STS.128``, ``LDSM``, ``STG.E.128``). On the H200
    (``validation/records/raw/h200-stalls-2026-11-30``) naive_qk kept the L1 data pipe
    86-97% busy, its shared-memory bytes alone 30-63%."""
    through = (phase.kind == STORE) | ((phase.kind == LOAD) & (not pipelined))
    return _tiles_per_unit(phase, tile_bytes, through)


def issue_floor_s(instructions: int | None, hw: Hardware) -> float:
    """The least time a warp takes through ``instructions`` (module docstring): the
    preset's ``warp_cycles_per_instruction`` each, at the kernel's SM clock; 0 where either
    is not known."""
    if not instructions or not hw.warp_cycles_per_instruction:
        return 0.0
    return instructions * hw.warp_cycles_per_instruction / hw.sm_clock_hz


def loop_floor_s(kernel: Kernel, period: int, given: CompiledResources,
                 hw: Hardware) -> np.ndarray | float:
    """The least time of each loop iteration of CTAs ``0 .. period - 1`` (module
    docstring): its main loop's instructions at the pace, the masked copy's in the
    iterations the schedule marks masked (``Kernel.loop_masked``) where the compile counts
    them; 0 where neither is known."""
    floor = issue_floor_s(given.loop_instructions, hw)
    if kernel.loop_masked is None or not given.masked_loop_instructions or not kernel.loop:
        return floor
    masked = kernel.masked_iterations(np.arange(period, dtype=np.int64))
    return np.where(masked, issue_floor_s(given.masked_loop_instructions, hw), floor)


def spill_round_trips(given: CompiledResources) -> int:
    """L2 round trips one loop iteration waits for its reloaded spills (module docstring):
    the compile's count of waits, or one where it spills but the count is not known."""
    if not given.spill_bytes_per_iteration:
        return 0
    return 1 if given.spill_reload_waits is None else given.spill_reload_waits


def kernel_program(kernel: Kernel, schedule: Schedule, hw: Hardware,
                   compress: bool = True, compiled=None) -> KernelProgram:
    """Evaluate ``kernel`` for the engines; ``compress=False`` evaluates every CTA's loop;
    ``compiled``: the compiler's registers, shared memory and spill traffic by kernel name,
    where given."""
    res = kernel_residency(kernel, schedule.tiling, schedule.problem.head_dim, hw, compiled)
    if kernel.dots:  # its warps issue tensor-core instructions: the SMs' clock drops
        hw = hw.at_tensor_clock()
    cta_ctx = kernel.cta_context()
    wgmma = uses_wgmma(hw, kernel.mma_rows, schedule.tiling.num_warps)
    costs = matmul_costs(list(kernel.dots), schedule.tiling.num_warps,
                         schedule.problem.elem_bytes, wgmma)
    staging = bool(kernel.dots)  # its tiles pass through shared memory: timed on smem
    pre = _evaluate(kernel.pre, evaluate_steps(kernel.pre, cta_ctx, issued=True), schedule,
                    hw, wgmma, costs, staging)
    post = _evaluate(kernel.post, evaluate_steps(kernel.post, cta_ctx, issued=True), schedule,
                     hw, wgmma, costs, staging)
    loop_count = kernel.loop_count.astype(np.int64)
    periodic = periodic_loop(kernel, compress, issued=True)  # verified on a spread of CTAs
    period = periodic.period
    given = (compiled or {}).get(kernel.name) or CompiledResources()
    spill = given.spill_bytes_per_iteration or 0
    loop = _evaluate(kernel.loop, (periodic.values, periodic.masks), schedule, hw, wgmma,
                     costs, staging, spill * schedule.tiling.threads,
                     pipelined=schedule.tiling.num_stages > 1)
    loop.path_s += hw.iteration_overhead_s + spill_round_trips(given) * hw.l2_latency_s
    loop.path_s = np.maximum(loop.path_s, loop_floor_s(kernel, period, given, hw))
    if not kernel.loop:  # one straight run of instructions: the whole CTA's in the prologue
        pre.path_s = np.maximum(pre.path_s, issue_floor_s(given.straight_instructions, hw))
    else:  # the code around the loop: the prologue's before it, the rest after
        pre.path_s = np.maximum(pre.path_s, issue_floor_s(given.prologue_instructions, hw))
        post.path_s = np.maximum(post.path_s, issue_floor_s(given.epilogue_instructions, hw))
    accesses = [k for k, step in enumerate(kernel.loop) if isinstance(step, Access)]
    return KernelProgram(
        name=kernel.name, grid=kernel.grid, sram_bytes=res.smem_per_cta_bytes, residency=res,
        loop_count=loop_count, period=period, pre=pre, loop=loop, post=post,
        loop_first=periodic.loop_first, plane_offset=periodic.plane_offset[accesses],
        spill=spill_traffic(given, res, schedule.tiling.threads, hw),
    )


def schedule_programs(schedule: Schedule, hw: Hardware, compress: bool = True,
                      compiled=None) -> list[KernelProgram]:
    return [kernel_program(k, schedule, hw, compress, compiled) for k in schedule.kernels]
