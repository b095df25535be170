"""What every kernel module shares: input checks, output allocation, block-range helpers.

The block-range helpers are the schedules' causal rules (docs/schedules.md, "Conventions")
written once as ``@triton.jit`` functions, so that each kernel skips exactly the blocks its
schedule skips and splits the rest into unmasked blocks (no mask arithmetic, unmasked loads)
and masked ones (the causal diagonal and the partial tile at the end of a sequence).
"""

import contextlib

import numpy as np
import torch
import triton
import triton.language as tl

from kernels import SUPPORTED_HEAD_DIMS
from traces.tiling import Tiling

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}

_poison = False


@contextlib.contextmanager
def poisoned_outputs():
    """Fill every tensor the kernels allocate with NaN, so that unwritten elements show.

    Used by the tests: a kernel that forgets a row or a tile leaves NaN behind, which no
    tolerance hides.
    """
    global _poison
    previous, _poison = _poison, True
    try:
        yield
    finally:
        _poison = previous


def alloc(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A contiguous output tensor: uninitialised, or NaN inside ``poisoned_outputs()``."""
    if _poison:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return bool(triton.knobs.runtime.interpret)


def dot_fp32(dtype: torch.dtype) -> bool:
    """Whether tl.dot operands must be upcast to fp32 before the product.

    Triton's interpreter multiplies bf16 tiles as raw 16-bit integers (numpy has no bf16), so
    there, and only there, bf16 operands are upcast. The products are the same: a bf16 x bf16
    product is exact in fp32, and accumulation is fp32 on tensor cores too. Every launcher
    calls this, so it is also where the interpreter's bf16 rounding gets fixed.
    """
    if not interpreting():
        return False
    _round_bf16_to_nearest_even()
    return dtype == torch.bfloat16


def _round_bf16_to_nearest_even() -> None:
    """Make the interpreter round fp32 -> bf16 to nearest even, as the GPU's cvt.rn does.

    Triton 3.9's interpreter truncates (and its RTNE path drops the mantissa carry), which
    doubles every bf16 rounding error and would fail the accuracy rule for no fault of the
    kernels. Only this one conversion is replaced; all others go to the original.
    """
    from triton.runtime import interpreter

    original = interpreter._convert_float
    if getattr(original, "_tilesim_rtne", False):
        return

    def convert(x, input_dtype, output_dtype, rounding_mode):
        if input_dtype == tl.float32 and output_dtype == tl.bfloat16:
            bits = np.ascontiguousarray(x).view(np.uint32).astype(np.uint64)
            rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            nan = np.isnan(np.ascontiguousarray(x).view(np.float32))
            return np.where(nan, np.uint16(0x7FC0), rounded).reshape(np.shape(x))
        return original(x, input_dtype, output_dtype, rounding_mode)

    convert._tilesim_rtne = True
    interpreter._convert_float = convert


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise ValueError/TypeError with a clear message unless q, k, v are valid kernel inputs."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be [batch, heads, seq, head_dim], got shape "
                             f"{tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} must be float16 or bfloat16, got {t.dtype}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    (b, h, n_q, d), (bk, h_kv, n_kv, dk) = q.shape, k.shape
    if bk != b:
        raise ValueError(f"q and k must have the same batch, got {b} and {bk}")
    if dk != d:
        raise ValueError(f"q and k must have the same head_dim, got {d} and {dk}")
    if h_kv == 0 or h % h_kv:
        raise ValueError(f"k/v heads ({h_kv}) must divide q heads ({h}) (grouped-query "
                         "attention)")
    if n_q == 0 or n_kv == 0 or b == 0:
        raise ValueError(f"batch and sequence lengths must be positive, got q {tuple(q.shape)}"
                         f", k {tuple(k.shape)}")
    if d not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {SUPPORTED_HEAD_DIMS} for the Triton kernels "
                         f"(tl.arange needs a power of two), got {d}")


def default_tiling(algorithm: str, head_dim: int, backward: bool = False) -> Tiling:
    """A reasonable tiling when the caller gives none (autotuning picks better ones).

    The backward kernels hold more tiles per CTA (K, V, dK, dV besides Q and dO), so they
    get smaller blocks that fit shared memory on sm_80 as on sm_90.
    """
    if backward:
        block = 64 if head_dim <= 128 else 32
        return Tiling(block_m=block, block_n=block, num_stages=2, num_warps=4)
    if algorithm == "fa2":
        return Tiling(block_m=128, block_n=64 if head_dim <= 128 else 32, num_stages=3,
                      num_warps=8 if head_dim >= 128 else 4)
    if algorithm == "decode":
        return Tiling(block_m=16, block_n=64, num_stages=2, num_warps=4, split_kv=8)
    return Tiling(block_m=64, block_n=64, num_stages=2, num_warps=4)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@triton.jit
def mma_operand(x, DOT_FP32: tl.constexpr):
    """A tile ready for tl.dot: as it is, or upcast where bf16 dots are unavailable."""
    if DOT_FP32:
        return x.to(tl.float32)
    else:
        return x


@triton.jit
def kv_blocks_visible(q_first, q_last, causal_off, n_kv, CAUSAL: tl.constexpr,
                      BLOCK_N: tl.constexpr):
    """K/V block range [0, end) seen by query rows q_first..q_last, and its unmasked prefix.

    Block j is fully masked when ``j*BN > q_last + causal_off`` (skipped), and needs no
    mask at all when every row sees every column and the block lies inside ``n_kv``:
    ``(j+1)*BN - 1 <= q_first + causal_off`` and ``(j+1)*BN <= n_kv``. Returns
    ``(n_unmasked, end)``; blocks ``n_unmasked..end-1`` are the masked ones.
    """
    n_blocks = tl.cdiv(n_kv, BLOCK_N)
    n_full = n_kv // BLOCK_N
    if CAUSAL:
        last = q_last + causal_off
        end = tl.where(last < 0, 0, tl.minimum(n_blocks, last // BLOCK_N + 1))
        first = q_first + causal_off + 1
        n_unmasked = tl.where(first < 0, 0, tl.minimum(first // BLOCK_N, n_full))
        n_unmasked = tl.minimum(n_unmasked, end)
    else:
        end = n_blocks
        n_unmasked = n_full
    return n_unmasked, end


@triton.jit
def q_blocks_visible(kv_first, n_q, causal_off, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    """Q block ranges that see the K/V block starting at column kv_first, in ascending order.

    Returns ``(start, mid, tail)``: blocks ``start..mid-1`` are masked (causal diagonal),
    ``mid..tail-1`` need no mask (fully visible, full tiles), ``tail..Tr-1`` are masked again
    (the partial Q tile at the end of the sequence, if any). ``start`` is the first block
    that is not fully masked: ``j*BN <= min((i+1)*BM, Nq) - 1 + causal_off``.
    """
    n_blocks = tl.cdiv(n_q, BLOCK_M)
    n_full = n_q // BLOCK_M
    if CAUSAL:
        # first row that sees column kv_first: r + causal_off >= kv_first
        t = kv_first - causal_off + 1
        start = tl.where(t <= 0, 0, (t + BLOCK_M - 1) // BLOCK_M - 1)
        start = tl.where(t > n_q, n_blocks, start)
        # first block whose top row sees the whole K/V block
        u = kv_first + BLOCK_N - 1 - causal_off
        full = tl.where(u <= 0, 0, (u + BLOCK_M - 1) // BLOCK_M)
    else:
        start = n_blocks * 0
        full = start
    mid = tl.maximum(start, tl.minimum(full, n_full))
    tail = tl.maximum(mid, n_full)
    return start, mid, tail
