"""Shared-memory reads of matmuls that compile to mma.sync (Triton's MMAv2 path).

With the synchronous ``mma.sync`` instruction (every matmul on sm_80, and on sm_90 where
wgmma does not apply: ``simulator.sim.compute.uses_wgmma``) the tensor cores take their
operands from registers, so every warp first loads the fragments it multiplies from shared
memory (``ldmatrix``). Triton lays a CTA's warps over the matmul's result ``[M, N]`` as
``warps_m x warps_n`` (``warps_per_tile``), so an operand tile held in shared memory is read
once by every warp that needs it: ``A [M, K]`` by each of the ``warps_n`` warps along N, ``B
[K, N]`` by each of the ``warps_m`` warps along M. Asynchronous wgmma reads its shared
operands in the tensor core itself and is not counted here (the tensor rate covers it).

An operand is ``"smem"`` (loaded into shared memory: a streamed tile), ``"regs"`` (loaded
once per CTA and kept in registers: FlashAttention's Q in the forward, K and V in dK/dV) or
``"result"`` (an earlier matmul's result, re-laid out as the A operand: P in P·V). A result
whose rows each warp holds whole (``warps_n == 1``) is converted in registers; otherwise it
goes through shared memory once (written once, read by each of the ``warps_n`` warps).

The rule is Triton's ``warpsPerTileV2`` (``lib/Dialect/TritonGPU/Transforms/
AccelerateMatmul.cpp``): a matmul chained to another one (attention's two products) puts
every warp along M if ``M >= N``, else along N; a lone matmul doubles the warps along M or
N, whichever has more 16 x 8 instruction tiles left, until all are placed. Measured on the
H200 (``sm__sass_data_bytes_mem_shared``, validation/records/h200-default-2026-11-30): these
reads plus the streamed tiles' copies into shared memory give naive_qk's shared bytes
exactly (with its output's trip through shared memory), naive_pv's within 7%, the FA2
kernels' within 37% and decode's split within 53%: the chained products move more than this
rule knows of in some layouts and less in others (``tests/test_mma_layout.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

MMA_TILE_M, MMA_TILE_N = 16, 8  # rows and columns of one mma.sync m16n8k16 result


@dataclass(frozen=True)
class Dot:
    """One matmul ``[m, k] x [k, n]`` of a CTA and where its operands come from."""

    m: int
    n: int
    k: int
    a: str = "smem"  # "smem", "regs" or "result"
    b: str = "smem"  # "smem" or "regs"


def warps_per_tile(m: int, n: int, num_warps: int, chained: bool) -> tuple[int, int]:
    """``(warps_m, warps_n)``: how Triton lays ``num_warps`` over an ``[m, n]`` result."""
    if chained:
        return (num_warps, 1) if m >= n else (1, num_warps)
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


def smem_read_bytes(dots: list[Dot], num_warps: int, elem_bytes: int,
                    chained: bool) -> int:
    """Bytes the warps of one CTA read from (and, for re-laid results, write to) shared
    memory to run ``dots`` with mma.sync; the layout of the first dot holds for a chain."""
    if not dots:
        return 0
    total = 0
    first = warps_per_tile(dots[0].m, dots[0].n, num_warps, chained)
    for dot in dots:
        wm, wn = first if chained else warps_per_tile(dot.m, dot.n, num_warps, chained)
        a_bytes, b_bytes = dot.m * dot.k * elem_bytes, dot.k * dot.n * elem_bytes
        if dot.a == "smem":
            total += wn * a_bytes
        elif dot.a == "result" and wn > 1:
            total += (1 + wn) * a_bytes
        if dot.b == "smem":
            total += wm * b_bytes
    return total


def smem_bytes_per_flop(dots: list[Dot], num_warps: int, elem_bytes: int,
                        chained: bool) -> float:
    """``smem_read_bytes`` per tensor-core FLOP of ``dots`` (2 m n k each)."""
    flops = sum(2 * d.m * d.n * d.k for d in dots)
    return smem_read_bytes(dots, num_warps, elem_bytes, chained) / flops if flops else 0.0
