"""The building blocks every schedule is made of: tensors, tile accesses, kernels.

A schedule describes each kernel launch as a grid of CTAs (in hardware launch order) and one
program template that every CTA runs: a prologue, a loop of iterations and an epilogue. Each
phase is an ordered list of steps; a step is a tile load, a tile store or a compute step.
Tile coordinates and compute amounts are functions of the CTA's coordinates and the loop
index, evaluated on numpy arrays for all CTAs (and iterations) at once, so a schedule of
tens of millions of accesses expands in a fraction of a second.

The compact form (``Kernel``) is what the timing simulator consumes; ``traces.trace`` expands
it into one record per access.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from traces.schedules.mma_layout import Dot

ALIGN_BYTES = 256

LOAD, STORE, COMPUTE = 0, 1, 2
PRE, LOOP, POST = 0, 1, 2


@dataclass(frozen=True)
class Tensor:
    """A row-major tensor viewed as ``[planes, rows, cols]`` at a virtual base address."""

    name: str
    planes: int
    rows: int
    cols: int
    elem_bytes: int
    base: int = 0

    @property
    def nbytes(self) -> int:
        return self.planes * self.rows * self.cols * self.elem_bytes


def allocate(tensors: list[Tensor]) -> dict[str, Tensor]:
    """Place tensors one after another, each base aligned to 256 bytes, in list order."""
    placed, address = {}, 0
    for t in tensors:
        address = -(-address // ALIGN_BYTES) * ALIGN_BYTES
        placed[t.name] = Tensor(t.name, t.planes, t.rows, t.cols, t.elem_bytes, address)
        address += t.nbytes
    return placed


Coords = Callable[[dict], tuple]  # ctx -> (plane, row_block, col_block) arrays
ComputeFn = Callable[[dict], tuple]  # ctx -> (tensor_flops, exp_ops, other_flops) arrays


@dataclass(frozen=True)
class Access:
    """A tile load or store: ``tile_rows x tile_cols`` elements at block coordinates."""

    kind: int  # LOAD or STORE
    tensor: str
    tile_rows: int
    tile_cols: int
    coords: Coords
    when: Callable[[dict], np.ndarray] | None = None  # the step happens only where True


@dataclass(frozen=True)
class Compute:
    """A compute step; ``amounts`` gives tensor-core FLOPs, exps and other FLOPs.

    ``amounts`` counts the valid elements (what ``count`` reports and FLOP/s conventions
    use). ``issued`` counts the work the hardware executes, which the simulator times: a
    Triton kernel computes whole tiles — the masked rows and columns of a partial tile at
    the end of a sequence, and rows padded up to the matmul's minimum — so it is evaluated
    on the full (padded) tile. ``None``: the same as ``amounts``.
    """

    amounts: ComputeFn
    when: Callable[[dict], np.ndarray] | None = None
    kind: int = COMPUTE
    issued: ComputeFn | None = None


def tile_compute(work: Callable, rows: Callable[[dict], np.ndarray],
                 cols: Callable[[dict], np.ndarray], tile_rows: int, tile_cols: int,
                 when: Callable[[dict], np.ndarray] | None = None) -> Compute:
    """A compute step on a ``tile_rows x tile_cols`` tile: ``work(rows, cols)`` counted on
    the valid ``rows(ctx) x cols(ctx)`` elements, issued on the whole tile."""
    return Compute(lambda c: work(rows(c), cols(c)), when=when,
                   issued=lambda c: work(tile_rows, tile_cols))


Step = Access | Compute


def step_mask(step: Step, ctx: dict) -> np.ndarray:
    """Where (per CTA or per iteration) ``step`` happens."""
    size = ctx["cta"].shape
    if step.when is None:
        return np.ones(size, dtype=bool)
    return np.broadcast_to(np.asarray(step.when(ctx), dtype=bool), size)


@dataclass
class Kernel:
    """One kernel launch: CTAs in launch order and the program they run.

    ``ctas`` maps coordinate names (e.g. ``"b"``, ``"h"``, ``"i"``) to int64 arrays of length
    ``grid``; ``loop_count`` gives each CTA's number of loop iterations. Loop steps see the
    CTA's coordinates plus ``"t"`` (the iteration index, 0-based) in their context.
    ``sram_bytes`` is the shared memory one CTA holds (streamed tiles times ``num_stages``).
    ``mma_rows`` is the M (rows) of every tensor-core matmul one CTA of the kernel's Triton
    twin issues, 0 if it has none: the compiler picks the tensor-core instruction by it
    (``simulator.sim.compute.uses_wgmma``; ``tests/test_kernels_aot.py`` checks the rule
    against the compiled kernels). ``dots`` are the matmuls of one step of the kernel (one
    loop iteration, or the one product of a kernel without a loop), in program order, on
    whole tiles: how the compiler lays the CTA's warps over them decides how many times
    each is computed and, with mma.sync, what the warps read from shared memory
    (``traces.schedules.mma_layout.matmul_costs``).
    """

    name: str
    ctas: dict[str, np.ndarray]
    loop_count: np.ndarray
    pre: list[Step]
    loop: list[Step]
    post: list[Step]
    sram_bytes: int
    tensors: dict[str, Tensor]
    notes: str = ""
    extra: dict = field(default_factory=dict)
    mma_rows: int = 0
    dots: tuple[Dot, ...] = ()
    # Per loop iteration (its context, as a loop step's), whether it runs the loop's masked
    # copy: the kernel's Triton twin runs the blocks that need a mask (the causal diagonal,
    # a partial tile at the end of a sequence) in a loop of their own, which issues more
    # instructions an iteration (``simulator.sim.program``). None: no iteration is masked.
    loop_masked: Callable[[dict], np.ndarray] | None = None

    @property
    def grid(self) -> int:
        return int(self.loop_count.shape[0])

    @property
    def accesses(self) -> list[Access]:
        """Every tile access of the kernel, prologue, loop and epilogue, in order."""
        return [s for s in self.pre + self.loop + self.post if isinstance(s, Access)]

    def loop_context(self, ctas: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Context of the loop iterations of ``ctas`` (default: every CTA), CTA after CTA:
        their coordinates, ``t`` and ``cta``."""
        if ctas is None:
            ctas = np.arange(self.grid, dtype=np.int64)
        counts = self.loop_count[ctas].astype(np.int64)
        owner = np.repeat(ctas, counts)
        first = np.cumsum(counts) - counts
        ctx = {name: values[owner] for name, values in self.ctas.items()}
        ctx["t"] = np.arange(owner.size, dtype=np.int64) - np.repeat(first, counts)
        ctx["cta"] = owner
        return ctx

    def masked_iterations(self, ctas: np.ndarray | None = None) -> np.ndarray:
        """Per loop iteration of ``ctas`` (default: every CTA), in ``loop_context``'s
        order, whether it runs the loop's masked copy (``loop_masked``; all False without)."""
        ctx = self.loop_context(ctas)
        if self.loop_masked is None:
            return np.zeros(ctx["cta"].shape, dtype=bool)
        return np.broadcast_to(np.asarray(self.loop_masked(ctx), dtype=bool), ctx["cta"].shape)

    def cta_context(self) -> dict[str, np.ndarray]:
        ctx = dict(self.ctas)
        ctx["cta"] = np.arange(self.grid, dtype=np.int64)
        return ctx


def valid_extent(block: np.ndarray, tile: int, length: int) -> np.ndarray:
    """Valid elements of block ``block`` of size ``tile`` in a dimension of ``length``."""
    return np.clip(length - block * tile, 0, tile)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pow2_at_least(n: int, lo: int = 1) -> int:
    """The smallest power of two >= ``n`` and >= ``lo``: the block a Triton twin allocates
    for ``n`` rows or columns (``tl.arange`` needs a power of two; ``tl.dot`` 16 rows)."""
    return max(lo, 1 << (max(n, 1) - 1).bit_length())


def grid_coords(*axes: tuple[str, int]) -> dict[str, np.ndarray]:
    """CTA coordinates of a grid, first axis fastest: ``grid_coords(("i", Tr), ("bh", BH))``."""
    sizes = [n for _, n in axes]
    total = int(np.prod(sizes))
    flat = np.arange(total, dtype=np.int64)
    coords = {}
    for name, n in axes:
        coords[name] = flat % n
        flat = flat // n
    return coords


def causal_last_block(
    row_block: np.ndarray, block_m: int, block_n: int, seq_q: int, seq_kv: int
) -> np.ndarray:
    """Number of K/V blocks a causal Q block ``row_block`` must visit (0 if none).

    Row ``r`` sees columns ``c <= r + seq_kv - seq_q``; the block's last valid row decides.
    """
    last_row = np.minimum((row_block + 1) * block_m, seq_q) - 1
    last_col = last_row + (seq_kv - seq_q)
    tc = cdiv(seq_kv, block_n)
    return np.clip(np.floor_divide(last_col, block_n) + 1, 0, tc)


def kv_blocks_unmasked(row_block: np.ndarray, block_m: int, block_n: int, seq_q: int,
                       seq_kv: int, causal: bool) -> np.ndarray:
    """How many K/V blocks, from the first, Q block ``row_block`` visits without a mask
    (``kernels.common.kv_blocks_visible``'s unmasked prefix): every row of the Q block sees
    every column of the K/V block, and the K/V block is whole; the blocks after them up to
    ``causal_last_block`` are masked."""
    whole = seq_kv // block_n
    if not causal:
        return np.full(np.shape(row_block), whole, dtype=np.int64)
    first = np.asarray(row_block) * block_m + (seq_kv - seq_q) + 1
    unmasked = np.where(first < 0, 0, np.minimum(first // block_n, whole))
    last = causal_last_block(np.asarray(row_block), block_m, block_n, seq_q, seq_kv)
    return np.minimum(unmasked, last).astype(np.int64)


def q_blocks_unmasked(col_block: np.ndarray, block_m: int, block_n: int, seq_q: int,
                      seq_kv: int, causal: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(mid, tail)`` of ``kernels.common.q_blocks_visible`` for K/V block ``col_block``:
    the Q blocks ``mid .. tail - 1`` see all of it without a mask (whole Q blocks whose first
    row sees its last column); those from ``causal_first_row_block`` up to ``mid``, and from
    ``tail`` on, are masked."""
    col_block = np.asarray(col_block)
    whole = seq_q // block_m
    if causal:
        start = causal_first_row_block(col_block, block_m, block_n, seq_q, seq_kv)
        last_col = col_block * block_n + block_n - 1 - (seq_kv - seq_q)
        full = np.where(last_col <= 0, 0, (last_col + block_m - 1) // block_m)
    else:
        start = full = np.zeros(col_block.shape, dtype=np.int64)
    mid = np.maximum(start, np.minimum(full, whole))
    return mid.astype(np.int64), np.maximum(mid, whole).astype(np.int64)


def causal_first_row_block(
    col_block: np.ndarray, block_m: int, block_n: int, seq_q: int, seq_kv: int
) -> np.ndarray:
    """First Q block that is not fully masked for K/V block ``col_block`` (Tr if none)."""
    tr = cdiv(seq_q, block_m)
    # Q block i visits column block j iff j < causal_last_block(i); that is monotone in i.
    first_col = col_block * block_n
    # Smallest row r with r + (seq_kv - seq_q) >= first_col.
    first_row = np.maximum(first_col - (seq_kv - seq_q), 0)
    return np.minimum(first_row // block_m, tr).astype(np.int64)
