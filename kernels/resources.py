"""Shared memory and registers each kernel really uses, from ahead-of-time compilation.

No GPU is needed: ``triton.compile`` targets sm_90 or sm_80 on the CPU, ``.metadata.shared``
gives the shared memory a CTA allocates, and the cuobjdump that ships inside Triton's wheel
reads the registers per thread (and local-memory spill bytes) from the cubin. These feed
the simulator's occupancy and legality checks.

Compilation runs in worker processes with the interpreter switched off, because kernels
defined under ``TRITON_INTERPRET=1`` cannot be compiled; it also uses every core.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import inspect
import itertools
import multiprocessing
import os
import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import triton.language as tl

from traces.tiling import Tiling

# kernel name -> module that defines it, in schedule order
KERNELS = {
    "naive_qk": "naive", "naive_softmax": "naive", "naive_pv": "naive",
    "naive_bwd_dv": "naive", "naive_bwd_dp": "naive", "naive_bwd_ds": "naive",
    "naive_bwd_dq": "naive", "naive_bwd_dk": "naive",
    "fa1_fwd": "fa1",
    "fa2_fwd": "fa2", "fa2_bwd_preprocess": "fa2", "fa2_bwd_dkdv": "fa2", "fa2_bwd_dq": "fa2",
    "decode_split": "decode", "decode_reduce": "decode",
}
ARCHS = (80, 90)
# Largest dynamic shared memory one CTA may use, bytes (CUDA programming guide, table of
# compute capabilities: 163 KB on sm_80, 227 KB on sm_90).
MAX_SHARED_BYTES = {80: 163 * 1024, 90: 227 * 1024}
# Tensors held in fp32 whatever the problem dtype.
_FP32_POINTERS = {"LSE", "L", "M", "DELTA", "O_PARTIAL", "LSE_PARTIAL"}
_FLOAT_ARGS = {"sm_scale"}
_DTYPES = {"fp16": "fp16", "bf16": "bf16"}


def sweep_tilings(block_m=(64, 128), block_n=(32, 64, 128), num_stages=(2, 3, 4),
                  num_warps=(4, 8)) -> list[Tiling]:
    """The tilings compiled by default: every combination of the given values."""
    return [Tiling(block_m=m, block_n=n, num_stages=s, num_warps=w)
            for m, n, s, w in itertools.product(block_m, block_n, num_stages, num_warps)]


@dataclass(frozen=True)
class KernelResources:
    """What one compiled kernel uses per CTA, for one tiling."""

    kernel: str
    arch: int
    dtype: str
    head_dim: int
    block_m: int
    block_n: int
    num_stages: int
    num_warps: int
    shared_bytes: int | None
    registers: int | None
    spill_bytes: int | None
    error: str | None = None

    @property
    def fits(self) -> bool:
        """Compiled, and its shared memory is within the per-CTA limit of its arch."""
        return self.error is None and (self.shared_bytes or 0) <= MAX_SHARED_BYTES[self.arch]

    def to_dict(self) -> dict:
        return asdict(self) | {"fits": self.fits}


def constexprs(kernel: str, head_dim: int, tiling: Tiling, causal: bool = False,
               seq_kv: int = 4096, decode_rows: int = 16) -> dict:
    """The constexpr values a launch of ``kernel`` would use for this tiling.

    ``seq_kv`` sets naive_softmax's row width (the whole row is one register tile);
    ``decode_rows`` is the decode group tile, G*Nq rows, padded to a power of two.
    """
    values = {"BLOCK_M": tiling.block_m, "BLOCK_N": tiling.block_n, "HEAD_DIM": head_dim,
              "CAUSAL": causal, "DOT_FP32": False,
              "ROW": max(16, 1 << (seq_kv - 1).bit_length()),
              "BLOCK_R": max(16, 1 << (decode_rows - 1).bit_length()),
              "BLOCK_Q": 1 << (min(decode_rows, 16) - 1).bit_length()}
    return {name: values[name] for name in _constexpr_names(kernel)}


def _kernel_fn(kernel: str):
    module = importlib.import_module(f"kernels.{KERNELS[kernel]}")
    return getattr(module, kernel)


def _constexpr_names(kernel: str) -> list[str]:
    raw = getattr(_kernel_fn(kernel), "fn", None) or _kernel_fn(kernel)
    return [name for name, p in inspect.signature(raw).parameters.items()
            if p.annotation is tl.constexpr]


def _signature(kernel: str, dtype: str) -> dict:
    fn = _kernel_fn(kernel)
    names = list(inspect.signature(fn.fn).parameters)
    consts = set(_constexpr_names(kernel))
    signature = {}
    for name in names:
        if name in consts:
            signature[name] = "constexpr"
        elif name in _FLOAT_ARGS:
            signature[name] = "fp32"
        elif name.isupper():
            signature[name] = "*fp32" if name in _FP32_POINTERS else f"*{_DTYPES[dtype]}"
        else:
            signature[name] = "i32"
    return signature


def _cuobjdump_usage(cubin: bytes) -> tuple[int | None, int | None]:
    """(registers per thread, local-memory bytes) from the bundled cuobjdump, or Nones."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return None, None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        out = subprocess.run([str(tool), "--dump-resource-usage", str(path)],
                             capture_output=True, text=True, check=False).stdout
    reg = re.search(r"REG:(\d+)", out)
    local = re.search(r"LOCAL:(\d+)", out)
    return (int(reg.group(1)) if reg else None, int(local.group(1)) if local else None)


def compile_one(kernel: str, arch: int, dtype: str, head_dim: int, tiling: Tiling,
                **shape) -> KernelResources:
    """Compile one kernel for one tiling and report what it uses (in this process)."""
    import triton
    from triton.backends.compiler import GPUTarget

    fields = {"kernel": kernel, "arch": arch, "dtype": dtype, "head_dim": head_dim,
              "block_m": tiling.block_m, "block_n": tiling.block_n,
              "num_stages": tiling.num_stages, "num_warps": tiling.num_warps}
    try:
        src = triton.compiler.ASTSource(fn=_kernel_fn(kernel), signature=_signature(kernel, dtype),
                                        constexprs=constexprs(kernel, head_dim, tiling, **shape))
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                                  options={"num_warps": tiling.num_warps,
                                           "num_stages": tiling.num_stages})
    except Exception as exc:  # a tiling the compiler rejects is a result, not a crash
        message = str(exc).strip().splitlines()
        return KernelResources(**fields, shared_bytes=None, registers=None, spill_bytes=None,
                               error=(message[-1] if message else type(exc).__name__)[:200])
    registers, spill = _cuobjdump_usage(compiled.asm["cubin"])
    return KernelResources(**fields, shared_bytes=int(compiled.metadata.shared),
                           registers=registers, spill_bytes=spill)


def _worker_init() -> None:
    # Kernels defined under the interpreter are not compilable: define them for real.
    os.environ["TRITON_INTERPRET"] = "0"


def _compile_task(args: tuple) -> dict:
    kernel, arch, dtype, head_dim, tiling, shape = args
    return compile_one(kernel, arch, dtype, head_dim, Tiling.from_dict(tiling), **shape).to_dict()


def measure(kernels=None, archs=(90,), dtype: str = "bf16", head_dim: int = 128,
            tilings: list[Tiling] | None = None, workers: int | None = None, progress=None,
            **shape) -> list[KernelResources]:
    """Compile every (kernel, arch, tiling) and return their resources, in that order.

    Tilings that give a kernel the same constexprs and launch options are compiled once
    (naive_softmax, for one, does not depend on block sizes). ``progress(done, total)`` is
    called as compilations finish.
    """
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    kernels = list(KERNELS) if kernels is None else list(kernels)
    unknown = [k for k in kernels if k not in KERNELS]
    if unknown:
        raise ValueError(f"unknown kernel(s) {', '.join(unknown)}; known: {', '.join(KERNELS)}")
    tilings = sweep_tilings() if tilings is None else tilings
    jobs, keys = {}, []
    for kernel, arch, tiling in itertools.product(kernels, archs, tilings):
        consts = tuple(sorted(constexprs(kernel, head_dim, tiling, **shape).items()))
        key = (kernel, arch, consts, tiling.num_warps, tiling.num_stages)
        keys.append((key, kernel, arch, tiling))
        jobs.setdefault(key, (kernel, arch, dtype, head_dim, tiling.to_dict(), shape))
    results = {}
    workers = workers or min(len(jobs), os.cpu_count() or 1)
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context,
                                                initializer=_worker_init) as pool:
        futures = {pool.submit(_compile_task, job): key for key, job in jobs.items()}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            results[futures[future]] = future.result()
            if progress is not None:
                progress(done, len(futures))
    out = []
    for key, kernel, arch, tiling in keys:
        record = results[key] | {"block_m": tiling.block_m, "block_n": tiling.block_n,
                                 "num_stages": tiling.num_stages,
                                 "num_warps": tiling.num_warps}
        record.pop("fits")
        out.append(KernelResources(**record))
    return out
