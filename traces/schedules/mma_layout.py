"""How Triton lays a CTA's warps over its matmuls, and what that costs.

Triton spreads a CTA's warps over each matmul's result ``[M, N]`` as ``warps_m x warps_n``
(``layouts``). Each warp computes 16 rows (one mma.sync ``m16n8k16`` tile, or a quarter of a
wgmma warpgroup's 64) and, with mma.sync, at least 8 columns. Two consequences the model
counts (``matmul_costs``):

- **Replication.** When a result has fewer rows than ``16 x warps_m`` (or fewer columns than
  ``8 x warps_n``), several warps compute the same elements: the tensor cores do the product
  that many times over, and the elementwise work on the result (scale, exp, row max and sum)
  is done that many times too. FA2's dQ at 64 x 128 with 8 warps is the case that showed it:
  its score products are laid ``[8, 1]`` over 64 rows, so both warpgroups compute all of S
  and dP. On the H200, Nsight Compute's tensor-pipe activity per FLOP issued without copies,
  against the median of the kernels nothing is replicated in, was 1.65 there (5/3 expected)
  and 1.46-1.47 in dK/dV at 128 x 64 with 8 warps (S^T and dP^T replicated, dV and dK not:
  1.5 expected), with twice the exp instructions; the other wgmma FA2 launches 0.96-1.09
  (``validation/records/raw/h200-stalls-2026-11-30``, ``tests/test_mma_layout.py``).
- **Shared-memory reads of mma.sync.** With the synchronous ``mma.sync`` (every matmul on
  sm_80, and on sm_90 where wgmma does not apply: ``simulator.sim.compute.uses_wgmma``) the
  tensor cores take their operands from registers, so every warp first loads the fragments
  it multiplies from shared memory (``ldmatrix``), every iteration: ``A [M, K]`` by each of
  the ``warps_n`` warps along N, ``B [K, N]`` by each of the ``warps_m`` warps along M, and
  replicated rows or columns once per copy. Operands the loop keeps (FlashAttention's Q in
  the forward, K and V in dK/dV) are read again every iteration too: the compiled loop's
  ``ldmatrix`` count (sm_90 PTX, FA2 forward and dK/dV at 32 x 32) is what re-reading gives,
  twice what holding them in registers would. An earlier matmul's result used as the A
  operand (P in P·V) stays in registers if each warp holds whole rows (``warps_n == 1``);
  otherwise it goes through shared memory once (written once, read by each warp along N).
  Asynchronous wgmma reads its shared operands in the tensor core itself, which its rate
  covers: for wgmma nothing is counted here.
- **Warp shuffles of row reductions.** A step that reduces its scores along each row (the
  forward's running max and sum: ``Dot.row_reductions``) does so with ``SHFL`` across the
  four lanes that hold a row's columns (two butterfly levels; each thread holds two rows of
  every 16 the warp computes), and, where warps are laid along N, once more over the
  partials the warps exchange (``log2(warps_n)`` levels): ``shuffles``. The sm_90 SASS of
  our kernels has exactly that many per iteration (FA2 forward, decode's split; none in the
  backward, ``tests/test_kernels_aot.py``). A shuffle goes through the L1 data pipe (Nsight
  Compute's pipeline description: the LSU pipe issues shuffles to L1TEX), one wavefront
  each: in the H200 stall profiles the pipe's wavefronts over the shared bytes / 128 were
  1.40-1.52 in the mma.sync forwards at 32 x 32 and 16 x 64 (d = 64) without them and
  1.03-1.26 with them, 0.87-1.12 in the backward's mma.sync kernels, which have none. For
  mma.sync they are timed with the operand reads, one clock of shared memory each.

The layout rules are Triton's (``lib/Dialect/TritonGPU/Transforms/AccelerateMatmul.cpp``),
checked against the compiled kernels' ``nvidia_mma`` layouts (``tests/test_kernels_aot.py``):

- mma.sync (``warpsPerTileV2``): a chain of matmuls (one feeds another) shares one layout,
  set by the chain's last matmul, which the compiler lays first: every warp along M if its
  ``M >= N``, else along N. A lone matmul doubles the warps along M or N, whichever has more
  16 x 8 instruction tiles left, until all are placed (extra warps go along M).
- wgmma (``warpsPerTileV3``): a matmul whose result feeds another puts every warp along M;
  any other starts from one warpgroup along M (4 x 1) and doubles along M while M has rows
  for it, else along N.

Measured on the H200 (``sm__sass_data_bytes_mem_shared``, validation/records/h200-default-
2026-11-30), the reads plus the tiles' staging (each loaded tile copied into shared memory,
each stored tile written and read back: ``simulator.sim.program.staged_bytes``), which the
simulator times together on the SM's shared memory, give naive_qk's shared bytes exactly,
naive_pv's within 7%, the FA2 kernels' within 31% and decode's split within 42%
(``tests/test_mma_layout.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

MMA_TILE_M, MMA_TILE_N = 16, 8  # rows and columns of one mma.sync m16n8k16 result
WARPGROUP_WARPS = 4  # a wgmma warpgroup: 4 warps, 16 rows each


@dataclass(frozen=True)
class Dot:
    """One matmul ``[m, k] x [k, n]`` of a CTA's step. ``a``: ``"smem"`` (a tile in shared
    memory) or ``"result"`` (an earlier matmul's result, re-laid out as the A operand: P in
    P·V). ``feeds_dot``: its result is an operand of a later matmul of the same step.
    ``row_reductions``: how many reductions along its result's rows the step does (the
    forward's row max and row sum of the scores: 2)."""

    m: int
    n: int
    k: int
    a: str = "smem"
    feeds_dot: bool = False
    row_reductions: int = 0

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k


@dataclass(frozen=True)
class MatmulCosts:
    """What a step's matmuls cost beyond their useful FLOPs (module docstring):
    ``tensor_scale`` the tensor FLOPs issued over the useful ones, ``elementwise_scale`` how
    many times the elementwise work on the first matmul's result (the scores) is done, and
    ``smem_bytes_per_flop`` the bytes read from shared memory per tensor FLOP issued
    (mma.sync only), ``shuffles_per_flop`` the warp shuffles of row reductions (``shuffles``)
    per tensor FLOP issued."""

    smem_bytes_per_flop: float = 0.0
    tensor_scale: float = 1.0
    elementwise_scale: float = 1.0
    shuffles_per_flop: float = 0.0


def lone_layout_v2(m: int, n: int, num_warps: int) -> tuple[int, int]:
    """``warpsPerTileV2`` for a matmul chained to no other."""
    warps = [1, 1]
    reps = [max(1, -(-m // MMA_TILE_M)), max(1, -(-n // MMA_TILE_N))]
    while warps[0] * warps[1] < num_warps:
        if reps[0] >= reps[1]:
            warps[0] *= 2
            if reps[0] != 1:
                reps[0] //= 2
        else:
            warps[1] *= 2
            reps[1] //= 2
    return warps[0], warps[1]


def lone_layout_v3(m: int, num_warps: int) -> tuple[int, int]:
    """``warpsPerTileV3`` for a matmul whose result feeds no other."""
    warps = [WARPGROUP_WARPS, 1]
    while warps[0] * warps[1] < num_warps:
        if m > MMA_TILE_M * warps[0]:
            warps[0] *= 2
        else:
            warps[1] *= 2
    return warps[0], warps[1]


def layouts(dots: list[Dot], num_warps: int, wgmma: bool) -> list[tuple[int, int]]:
    """``(warps_m, warps_n)`` of each of ``dots`` (module docstring)."""
    if wgmma:
        return [(num_warps, 1) if dot.feeds_dot else lone_layout_v3(dot.m, num_warps)
                for dot in dots]
    if any(dot.feeds_dot for dot in dots):
        last = dots[-1]
        chain = (num_warps, 1) if last.m >= last.n else (1, num_warps)
        return [chain] * len(dots)
    return [lone_layout_v2(dot.m, dot.n, num_warps) for dot in dots]


def layout_label(m: int, n: int, layout: tuple[int, int]) -> str:
    """``"MxN:WMxWN"``: a matmul result's rows and columns and the warps laid along them, as
    the prediction JSON (``warp_layout``) and the compiled kernels' ``mma_layouts`` name it."""
    return f"{m}x{n}:{layout[0]}x{layout[1]}"


def parse_layout_label(label: str) -> tuple[Dot, tuple[int, int]]:
    """The result shape (a ``Dot`` with ``k`` 0) and layout a ``layout_label`` names."""
    shape, warps = label.split(":")
    (m, n), (wm, wn) = (tuple(int(x) for x in part.split("x")) for part in (shape, warps))
    return Dot(m, n, 0), (wm, wn)


def replication(dot: Dot, layout: tuple[int, int]) -> tuple[int, int]:
    """How many warps compute each row and each column of ``dot``'s result."""
    wm, wn = layout
    return max(1, MMA_TILE_M * wm // dot.m), max(1, MMA_TILE_N * wn // dot.n)


def smem_read_bytes(dots: list[Dot], num_warps: int, elem_bytes: int) -> int:
    """Bytes the warps of one CTA read from (and, for re-laid results, write to) shared
    memory to run ``dots`` with mma.sync."""
    total = 0
    for dot, (wm, wn) in zip(dots, layouts(dots, num_warps, wgmma=False), strict=True):
        rows, cols = replication(dot, (wm, wn))
        a_bytes, b_bytes = dot.m * dot.k * elem_bytes, dot.k * dot.n * elem_bytes
        if dot.a == "smem":
            total += wn * rows * a_bytes
        elif wn > 1:  # a result whose rows are spread over warps: through shared memory
            total += (1 + wn * rows) * a_bytes
        total += wm * cols * b_bytes
    return total


def shuffles(dots: list[Dot], num_warps: int, wgmma: bool) -> int:
    """Warp shuffle instructions one CTA issues per step for the row reductions of ``dots``
    (module docstring): per warp, two per row a thread holds and reduction within the warp,
    and ``log2(warps_n)`` more where the rows' columns are spread over warps."""
    total = 0
    for dot, (wm, wn) in zip(dots, layouts(dots, num_warps, wgmma), strict=True):
        if not dot.row_reductions:
            continue
        rows_per_thread = max(MMA_TILE_M, dot.m // wm) // 8  # 2 of every 16 a warp holds
        levels = 2 + (wn.bit_length() - 1 if wn > 1 else 0)  # quad butterfly, then warps
        total += num_warps * dot.row_reductions * rows_per_thread * levels
    return total


def matmul_costs(dots: list[Dot], num_warps: int, elem_bytes: int,
                 wgmma: bool) -> MatmulCosts:
    """The ``MatmulCosts`` of one step's ``dots`` on ``num_warps`` warps (none: no costs)."""
    flops = sum(dot.flops for dot in dots)
    if not flops:
        return MatmulCosts()
    copies = [r * c for r, c in (replication(dot, layout) for dot, layout in
                                 zip(dots, layouts(dots, num_warps, wgmma), strict=True))]
    issued = sum(n * dot.flops for n, dot in zip(copies, dots, strict=True))
    return MatmulCosts(
        smem_bytes_per_flop=0.0 if wgmma else smem_read_bytes(dots, num_warps,
                                                             elem_bytes) / issued,
        tensor_scale=issued / flops, elementwise_scale=float(copies[0]),
        shuffles_per_flop=shuffles(dots, num_warps, wgmma) / issued)
