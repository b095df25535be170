"""Shared memory and registers each kernel really uses, from ahead-of-time compilation.

No GPU is needed: ``triton.compile`` targets sm_90 or sm_80 on the CPU, ``.metadata.shared``
gives the shared memory a CTA allocates, and the cuobjdump that ships inside Triton's wheel
reads the registers per thread (and local-memory spill bytes) from the cubin. These feed
the simulator's occupancy and legality checks. The PTX says which tensor-core instruction
the matmuls became (asynchronous ``wgmma`` or synchronous ``mma.sync``), which sets the
tensor-core rate the simulator uses.

Compilation runs in worker processes (``python -m kernels.resources``) with the interpreter
switched off, because kernels defined under ``TRITON_INTERPRET=1`` cannot be compiled; it
also uses every core.

What a compilation reports depends only on the kernels' source, Triton's version and the
job (kernel, arch, dtype, constexprs, warps, stages), so results are kept in a cache file
(``cache_path``: JSON Lines, one result per job) and a job found there is not compiled
again: a warm ``--compiled-resources`` run skips the workers' start-up as well as the
compile. ``TILESIM_CACHE_DIR`` sets the folder; set to the empty string it turns the
cache off.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import importlib
import importlib.util
import inspect
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from traces.schedules.base import cdiv, pow2_at_least
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
# Largest dynamic shared memory one CTA may use, bytes (CUDA programming guide, table of
# compute capabilities: 163 KB on sm_80, 227 KB on sm_90).
MAX_SHARED_BYTES = {80: 163 * 1024, 90: 227 * 1024}
# Tensors held in fp32 whatever the problem dtype.
_FP32_POINTERS = {"LSE", "L", "M", "DELTA", "O_PARTIAL", "LSE_PARTIAL"}
_FLOAT_ARGS = {"sm_scale"}
# A wgmma whose A operand is a register list: "wgmma.mma_async... {D regs}, {A regs}, descB".
WGMMA_RS = re.compile(r"\bwgmma\.mma_async\S*\s+\{[^}]*\},\s*\{")
# Any wgmma with its shape and operand types, e.g. "wgmma.mma_async.sync.aligned.m64n16k16
# .f32.bf16.bf16 {D regs}, descA, descB" (group 6 is "{" when A is in registers).
WGMMA_SHAPE = re.compile(r"\bwgmma\.mma_async\.sync\.aligned\.m(\d+)n(\d+)k(\d+)\.\w+"
                         r"\.(\w+)\.(\w+)\s+\{[^}]*\},\s*(\{)?")
# Bytes per element of a wgmma operand type (PTX ISA: wgmma.mma_async data types).
_OPERAND_BYTES = {"f16": 2, "bf16": 2, "tf32": 4, "e4m3": 1, "e5m2": 1, "s8": 1, "u8": 1}
# A tensor-core layout of the TTGIR: "#mma1 = #ttg.nvidia_mma<{versionMajor = 3, ...,
# warpsPerCTA = [4, 2], ...}>", and a matmul with its result type: "tt.dot ... -> tensor<
# 64x128xf32, #mma>" (mma.sync) or "ttng.warp_group_dot ... -> tensor<64x128xf32, #mma>".
MMA_LAYOUT = re.compile(r"^#(\w+) = #ttg\.nvidia_mma<\{.*?warpsPerCTA = \[(\d+), (\d+)\]",
                        re.MULTILINE)
DOT_RESULT = re.compile(r"\b(?:tt\.dot|ttng\.warp_group_dot) .*?-> tensor<(\d+)x(\d+)x\w+, "
                        r"#(\w+)>")
# The TTGIR ops that show a loop's software pipeline: a loop's start, an asynchronous copy
# of global memory into shared memory and its commit group, the wait for copies in flight
# ("{num = N}": that many commit groups may stay pending), and a matmul.
_FOR = re.compile(r"\bscf\.for\b")
_ASYNC_COPY = re.compile(r"\bttg\.async_copy_global_to_local\b")
_ASYNC_COMMIT = re.compile(r"\bttg\.async_commit_group\b")
_ASYNC_WAIT = re.compile(r"\bttg\.async_wait\b.*?\{num = (\d+) : i32\}")
_MATMUL = re.compile(r"\b(?:tt\.dot|ttng\.warp_group_dot)\b(?!_wait)")
_SEQ_ARGS = {"n_q", "n_kv"}
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
    wgmma_ops: int | None = None  # wgmma.mma_async instructions in the PTX
    mma_sync_ops: int | None = None  # mma.sync instructions in the PTX
    # Of the wgmma, those whose A operand is in registers ("RS"); the others read A from
    # shared memory ("SS"). B is always read from shared memory (PTX ISA).
    wgmma_rs_ops: int | None = None
    # Bytes the wgmma read from shared memory per tensor-core FLOP they do (B always, A where
    # SS): over the mix of wgmma instructions in the PTX, and of the most demanding one
    # (``wgmma_operand_demand``). What shared memory must deliver to keep the tensor cores busy.
    wgmma_smem_bytes_per_flop: float | None = None
    wgmma_smem_bytes_per_flop_max: float | None = None
    # How the compiler laid the warps over the matmuls (``dot_layouts``).
    mma_layouts: str | None = None
    # The software pipeline of its innermost loops that copy global memory into shared
    # memory (``loop_pipeline``): iterations whose loads are in flight when an iteration
    # waits for its own, and whether the copies for a later iteration are issued after
    # the loop body's matmuls (into the buffer they have just read). None without such loop.
    loads_in_flight: int | None = None
    loads_issued_after_compute: bool | None = None
    # One iteration of the main loop, from the SASS (``main_loop``): the instructions each
    # warp issues, the local-memory (spill) bytes per thread it loads and stores, and the
    # times a warp waits for reloaded spills (``reload_waits``). None without a loop with
    # matmuls.
    loop_instructions: int | None = None
    spill_load_bytes_per_iteration: int | None = None
    spill_store_bytes_per_iteration: int | None = None
    spill_reload_waits: int | None = None
    # Warp shuffles (SHFL) a warp issues per iteration of the main loop: its row
    # reductions (``traces.schedules.mma_layout.shuffles``). None without the loop.
    loop_shuffles: int | None = None
    # The instructions each warp issues in a kernel without loops (``straight_instructions``:
    # naive_softmax, the backward's preprocess). None for a kernel with a loop.
    straight_instructions: int | None = None
    # In a kernel with loops, the instructions each warp issues outside them on the way
    # through (``outside_loop_instructions``): before its first loop (the prologue) and
    # after it (between loops and the epilogue). None without a loop.
    prologue_instructions: int | None = None
    epilogue_instructions: int | None = None
    # The instructions each warp issues per iteration of the main loop's masked copy
    # (``masked_loop_instructions``). None without one.
    masked_loop_instructions: int | None = None

    @property
    def fits(self) -> bool:
        """Compiled, and its shared memory is within the per-CTA limit of its arch."""
        return self.error is None and (self.shared_bytes or 0) <= MAX_SHARED_BYTES[self.arch]

    def to_dict(self) -> dict:
        return asdict(self) | {"fits": self.fits}

    @classmethod
    def of_job(cls, result: dict, tiling: Tiling, head_dim: int) -> KernelResources:
        """A job's result (``to_dict()``, as the cache and tilesim's table of compiles keep
        it) labelled with the tiling and head_dim asked for: a job stands for every tiling
        and head_dim with its constexprs (naive_softmax has none of either)."""
        record = dict(result, head_dim=head_dim, block_m=tiling.block_m,
                      block_n=tiling.block_n, num_stages=tiling.num_stages,
                      num_warps=tiling.num_warps)
        record.pop("fits", None)
        return cls(**record)


def wgmma_operand_demand(ptx: str) -> tuple[float | None, float | None]:
    """Shared-memory operand bytes per FLOP of the PTX's wgmma instructions: over their mix,
    and of the most demanding instruction; Nones if there are none.

    Each ``wgmma.mma_async`` of shape mMnNkK does 2*M*N*K FLOPs and reads its B operand
    (K x N) from shared memory, and its A operand (M x K) too unless A is a register list
    (PTX ISA, wgmma operands). The mix is counted over the instructions as they stand in
    the PTX: a loop body peeled or unrolled repeats all its matmuls alike, so it is one
    iteration's. Shared memory delivers about 128 B per clock per SM (CUDA programming
    guide; Luo et al. measured 127) and the tensor cores do 4096 dense bf16 FLOPs per clock
    per SM on H100/H200 (989 TFLOP/s at 1830 MHz on 132 SMs): an instruction above
    128 / 4096 = 0.031 B per FLOP cannot run at the tensor peak, and a mix above it cannot
    either, however the matmuls of resident CTAs overlap
    (``simulator.hardware.Hardware.smem_operand_limit``).
    """
    nbytes = flops = 0
    worst = None
    for m, n, k, a_type, b_type, a_in_registers in WGMMA_SHAPE.findall(ptx):
        if a_type not in _OPERAND_BYTES or b_type not in _OPERAND_BYTES:
            continue  # a type this table does not know: left out, not guessed
        m, n, k = int(m), int(n), int(k)
        operand = n * k * _OPERAND_BYTES[b_type] + (0 if a_in_registers
                                                    else m * k * _OPERAND_BYTES[a_type])
        work = 2 * m * n * k
        nbytes, flops = nbytes + operand, flops + work
        worst = max(worst or 0.0, operand / work)
    return (nbytes / flops if flops else None), worst


def dot_layouts(ttgir: str) -> str | None:
    """The distinct ``MxN:WMxWN`` of a TTGIR's matmuls, sorted and comma-separated: each
    result's rows and columns and the warps its tensor-core layout puts along them
    (``warpsPerCTA``); None if it has no matmul on the tensor cores."""
    from traces.schedules.mma_layout import layout_label

    warps = {name: (int(wm), int(wn)) for name, wm, wn in MMA_LAYOUT.findall(ttgir)}
    found = {layout_label(int(m), int(n), warps[name])
             for m, n, name in DOT_RESULT.findall(ttgir) if name in warps}
    return ",".join(sorted(found)) or None


def _innermost_loops(ttgir: str) -> list[list[str]]:
    """The body lines of every ``scf.for`` of a TTGIR that holds no other loop."""
    loops, stack = [], []
    for line in ttgir.splitlines():
        if _FOR.search(line) and line.rstrip().endswith("{"):
            stack.append({"depth": 0, "lines": [], "nested": False})
            for outer in stack[:-1]:
                outer["nested"] = True
            continue
        if not stack:
            continue
        for loop in stack:
            loop["lines"].append(line)
        top = stack[-1]
        top["depth"] += line.count("{") - line.count("}")
        if top["depth"] < 0:  # the loop's closing brace
            stack.pop()
            if not top["nested"]:
                loops.append(top["lines"][:-1])
    return loops


def loop_pipeline(ttgir: str) -> tuple[int | None, bool | None]:
    """``(loads in flight, issued after compute)`` of a TTGIR's pipelined loops.

    In each innermost loop that copies global memory into shared memory asynchronously, an
    iteration waits (``async_wait {num = N}``) until at most ``N`` commit groups are still
    pending; with ``g`` groups committed per iteration, the iteration's own loads and those
    of the ``N / g`` iterations after it are in flight as it waits: ``N / g + 1``
    iterations. The copies for a later iteration are issued after the body's matmuls when
    the first copy comes after the last matmul. The loops of one kernel agree (the causal
    forward has two); if they do not, the least overlap is reported (fewest in flight,
    issued after compute if any loop is). ``(None, None)`` without such a loop.
    """
    in_flight, after = [], []
    for body in _innermost_loops(ttgir):
        copies = [i for i, line in enumerate(body) if _ASYNC_COPY.search(line)]
        groups = sum(1 for line in body if _ASYNC_COMMIT.search(line))
        waits = [int(m.group(1)) for line in body if (m := _ASYNC_WAIT.search(line))]
        if not copies or not groups or not waits:
            continue
        in_flight.append(min(waits) // groups + 1)
        matmuls = [i for i, line in enumerate(body) if _MATMUL.search(line)]
        after.append(bool(matmuls) and copies[0] > matmuls[-1])
    if not in_flight:
        return None, None
    return min(in_flight), any(after)


def constexprs(kernel: str, head_dim: int, tiling: Tiling, causal: bool = False,
               seq_kv: int = 4096, decode_rows: int = 16, seq_q: int = 1,
               heads: int | None = None, group: int | None = None) -> dict:
    """The constexpr values a launch of ``kernel`` would use for this tiling.

    ``seq_kv`` sets naive_softmax's row width (the whole row is one register tile);
    ``decode_rows`` is decode_split's group tile, G*Nq rows, padded to a power of two;
    ``seq_q`` decode_reduce's query rows (Nq, padded), as ``kernels.decode`` launches them.
    Given the launch's ``heads`` and ``group`` (query heads per K/V head), its integer
    arguments that equal 1 are constexprs too, as Triton makes them (``launch_ints``).
    """
    values = {"BLOCK_M": tiling.block_m, "BLOCK_N": tiling.block_n, "HEAD_DIM": head_dim,
              "CAUSAL": causal, "DOT_FP32": False,
              "ROW": pow2_at_least(seq_kv, 16),
              "BLOCK_R": pow2_at_least(decode_rows, 16),
              "BLOCK_Q": pow2_at_least(seq_q)}
    ones = {name: 1 for name, value in launch_ints(kernel, tiling, seq_q, seq_kv, heads,
                                                   group).items() if value == 1}
    return {name: values[name] for name in _constexpr_names(kernel)} | ones


def launch_shape(seq_q: int, heads: int, group: int) -> dict:
    """``measure``'s shape entries of a launch with ``seq_q`` query rows, ``heads`` query
    heads and ``group`` of them per K/V head: decode's group tile (G*Nq rows) and the
    integers Triton specializes it on (``launch_ints``)."""
    return {"heads": heads, "group": group, "seq_q": seq_q, "decode_rows": group * seq_q}


def problem_shape(problem) -> dict:
    """``measure``'s launch keywords of an attention problem (a
    ``traces.problem.AttentionProblem``) as ``kernels`` launch it: its mask, its key length
    and ``launch_shape``."""
    return {"causal": problem.causal, "seq_kv": problem.seq_kv,
            **launch_shape(problem.seq_q, problem.heads, problem.group_size)}


def launch_ints(kernel: str, tiling: Tiling, seq_q: int, seq_kv: int, heads: int | None,
                group: int | None) -> dict:
    """The integer arguments a launch of ``kernel`` passes, by name (``kernels``' launches:
    the sequence lengths, the query heads, the group size, decode's split count and the
    K/V blocks of its chunks); empty where the launch's ``heads`` or ``group`` is not known.

    Triton specializes each at launch: an integer equal to 1 becomes a constexpr, one that
    is a multiple of 16 carries that divisibility to the compiler (its JIT's
    ``specialize_impl``: ``tests/test_kernels_aot.py`` checks the rule against Triton's
    own). A GPU's compile of the kernel is that specialization's: for the backward's dK/dV
    with one query head per K/V head (``group`` 1) the loop over the group disappears, and
    the H200 records' registers are those of the compile that knows it (118 and 129 at
    d = 64, 16 x 64, against 139 and 220 without).
    """
    if heads is None or group is None:
        return {}
    values = {"n_q": seq_q, "n_kv": seq_kv, "n_heads": heads, "group": group,
              "n_split": tiling.split_kv,
              "chunk": cdiv(cdiv(seq_kv, tiling.block_n), tiling.split_kv)}
    return {name: values[name] for name in _int_arg_names(kernel)}


def divisible_ints(kernel: str, tiling: Tiling, seq_q: int = 1, seq_kv: int = 4096,
                   heads: int | None = None, group: int | None = None, **_) -> list[str]:
    """The integer arguments of a launch that are multiples of 16 (``launch_ints``); where
    the launch is not known, the sequence lengths, as every launch of these kernels in our
    matrices has them."""
    ints = launch_ints(kernel, tiling, seq_q, seq_kv, heads, group)
    if not ints:
        return sorted(_SEQ_ARGS & set(_int_arg_names(kernel)))
    return sorted(name for name, value in ints.items() if value % 16 == 0)


def _kernel_fn(kernel: str):
    module = importlib.import_module(f"kernels.{KERNELS[kernel]}")
    return getattr(module, kernel)


@functools.cache
def _int_arg_names(kernel: str) -> list[str]:
    """The kernel's integer arguments, in order: the parameters that are neither
    constexprs, pointers (upper case) nor floats (``_signature``'s rule, read from the
    source as ``_constexpr_names`` does)."""
    consts = set(_constexpr_names(kernel))
    return [name for name in _param_names(kernel)
            if name not in consts and not name.isupper() and name not in _FLOAT_ARGS]


def _param_names(kernel: str) -> list[str]:
    return [a.arg for a in _source_args(kernel)]


@functools.cache
def _constexpr_names(kernel: str) -> list[str]:
    """The kernel's ``tl.constexpr`` parameters, in order."""
    return [a.arg for a in _source_args(kernel)
            if isinstance(a.annotation, ast.Attribute) and a.annotation.attr == "constexpr"
            and isinstance(a.annotation.value, ast.Name) and a.annotation.value.id == "tl"]


@functools.cache
def _source_args(kernel: str) -> list[ast.arg]:
    """The kernel's parameters, read from its module's source (importing the module would
    import torch, seconds this process may not need)."""
    path = Path(__file__).resolve().parent / f"{KERNELS[kernel]}.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == kernel:
            return node.args.args
    raise ValueError(f"kernels/{KERNELS[kernel]}.py defines no function {kernel}")


def _signature(kernel: str, dtype: str) -> dict:
    names = list(inspect.signature(_kernel_fn(kernel).fn).parameters)
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


def _alignment_hints(signature: dict, divisible: list[str]) -> dict:
    """The divisibility-by-16 facts a real launch gives the compiler.

    At launch Triton tells the compiler which pointers are 16-byte aligned and which integers
    are multiples of 16, and without that it neither vectorises loads nor pipelines them
    (shared memory would then not grow with num_stages). Assumed here as in every real
    launch of these kernels: all tensors are aligned (torch allocations are); the integers
    ``divisible`` are multiples of 16 (``divisible_ints``).
    """
    return {(i,): [["tt.divisibility", 16]] for i, (name, ty) in enumerate(signature.items())
            if ty.startswith("*") or (ty == "i32" and name in divisible)}


def _cuobjdump_usage(cubin: bytes) -> tuple[int | None, int | None]:
    """(registers per thread, local-memory bytes per thread) from the bundled cuobjdump, or
    Nones. The local bytes are the stack frame (``STACK``: where ptxas puts the registers it
    spills; a Triton kernel makes no calls, so its frame is nothing else) plus any local
    arrays (``LOCAL``). ``LOCAL`` alone is 0 for a spilling kernel: read as the spill size
    until 2026-12-02, it reported none where the H200 records' L2 writes show kilobytes
    per loop iteration (BENCHMARKS.md, "Register spills")."""
    out = _cuobjdump(cubin, "--dump-resource-usage")
    if out is None:
        return None, None
    reg = re.search(r"REG:(\d+)", out)
    frame = [int(m.group(1)) for key in ("STACK", "LOCAL")
             if (m := re.search(rf"{key}:(\d+)", out))]
    return (int(reg.group(1)) if reg else None, sum(frame) if frame else None)


def _cuobjdump(cubin: bytes, flag: str) -> str | None:
    """The bundled cuobjdump's output for ``flag`` on ``cubin``; None without the tool."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        return subprocess.run([str(tool), flag, str(path)],
                              capture_output=True, text=True, check=False).stdout


_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_SASS_BACK_BRANCH = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)\s*$")
_SASS_LOCAL = re.compile(r"^(?:@!?U?P\w+\s+)?(STL|LDL)(\.[\w.]+)?\s")
_SASS_MMA = re.compile(r"\b(?:HGMMA|HMMA)\b")


def sass_costs(cubin: bytes) -> tuple[int | None, ...]:
    """From one disassembly of a cubin (the bundled cuobjdump): ``main_loop``'s facts (its
    instructions per warp, the spill bytes per thread it loads and stores, and the waits
    for reloaded spills, per iteration; Nones without a loop with matmuls), then
    ``straight_instructions`` (None for a kernel with a loop), then
    ``outside_loop_instructions`` (two Nones without a loop), then
    ``masked_loop_instructions``; all None without the tool."""
    sass = _cuobjdump(cubin, "-sass")
    if not sass:
        return (None,) * SASS_COSTS
    found = main_loop(sass) or (None, None, None, None)
    return (*found, straight_instructions(sass), *(outside_loop_instructions(sass)
                                                   or (None, None)),
            masked_loop_instructions(sass))


SASS_COSTS = 8  # how many facts ``sass_costs`` returns


def _sass_code(sass: str) -> list[tuple[int, str]]:
    """The SASS instructions as ``(address, instruction)``, in order."""
    return [(int(m.group(1), 16), m.group(2).strip()) for m in _SASS_LINE.finditer(sass)]


def _loops(code: list[tuple[int, str]]) -> list[tuple[int, int]]:
    """The spans ``(first address, backward branch's address)`` that backward branches
    close in ``code`` (``_sass_code``)."""
    return [(int(m.group(1), 16), addr) for addr, op in code
            if (m := _SASS_BACK_BRANCH.search(op)) and int(m.group(1), 16) < addr]


def _matmul_loops(sass: str) -> list[list[str]]:
    """The SASS instructions of each innermost loop with matmuls (``HGMMA``/``HMMA``), in
    order: the kernels' copies of one loop body, masked and unmasked."""
    code = _sass_code(sass)
    loops = _loops(code)
    innermost = [(lo, hi) for lo, hi in loops
                 if not any(lo < a and b < hi for a, b in loops if (a, b) != (lo, hi))]
    bodies = [[op for addr, op in code if lo <= addr <= hi] for lo, hi in innermost]
    return [body for body in bodies if any(_SASS_MMA.search(op) for op in body)]


def main_loop_body(sass: str) -> list[str] | None:
    """The SASS instructions of one iteration of a kernel's main loop, in order; None if
    the SASS has no loop with matmuls.

    Loops are the spans a backward branch closes; the kernels' innermost loops with matmuls
    (``HGMMA``/``HMMA``) are copies of one loop body, masked and unmasked, and the main loop
    is the copy with the fewest instructions: masking only adds some."""
    bodies = _matmul_loops(sass)
    return min(bodies, key=len) if bodies else None


def masked_loop_instructions(sass: str) -> int | None:
    """The instructions a warp issues per iteration of the main loop's masked copy, the
    loop the kernel runs over the blocks that need a mask (the causal diagonal, a partial
    last tile): of the innermost loops with matmuls, the one with the most instructions
    (the mask's index arithmetic, compares and selects come on top of the unmasked body's);
    None with fewer than two such loops. A static count: FA2's forward and dQ issue it
    (within 2% on the H200), dK/dV's diagonal copy branches over part of its body and
    issues less (``tests/test_kernels_aot.py``)."""
    bodies = _matmul_loops(sass)
    return max(len(body) for body in bodies) if len(bodies) > 1 else None


def main_loop(sass: str) -> tuple[int, int, int, int] | None:
    """``(instructions, spill bytes loaded, spill bytes stored, reload waits)`` of one
    iteration of a kernel's main loop (``main_loop_body``), per warp and per thread, from
    its SASS.

    Each ``LDL``/``STL`` (local memory: spilled registers) counts its width, 4 bytes, or
    8/16 with ``.64``/``.128``; ``reload_waits`` counts the times a warp waits for reloaded
    spills. None if the SASS has no loop with matmuls. On the H200 stall profiles the
    instructions agree with Nsight Compute's count per warp and iteration
    (``tests/test_kernels_aot.py``).
    """
    body = main_loop_body(sass)
    return None if body is None else loop_facts(body)


def loop_facts(body: list[str]) -> tuple[int, int, int, int]:
    """``main_loop``'s facts of a loop ``body`` (``main_loop_body``)."""
    moved = {"LDL": 0, "STL": 0}
    for op in body:
        if m := _SASS_LOCAL.match(op):
            mods = m.group(2) or ""
            moved[m.group(1)] += 16 if ".128" in mods else 8 if ".64" in mods else 4
    return len(body), moved["LDL"], moved["STL"], reload_waits(body)


def straight_instructions(sass: str) -> int | None:
    """The instructions each warp issues in a kernel without loops: its SASS up to the
    first unconditional ``EXIT``, padding ``NOP``s not counted. None where the SASS has a
    loop (a backward branch) or no such ``EXIT``. What follows that ``EXIT`` is never
    issued on the way through: the final branch to itself, and the code of branches that
    are rarely taken."""
    code = _sass_code(sass)
    if _loops(code):
        return None
    issued = 0
    for _, op in code:
        if op == "EXIT":
            return issued + 1
        if not _SASS_GUARD.sub("", op).startswith("NOP"):
            issued += 1
    return None


def outside_loop_instructions(sass: str) -> tuple[int, int] | None:
    """The instructions each warp issues outside the loops of a kernel with loops, on the
    way through: ``(before the first loop, after it)``. The code up to the first
    unconditional ``EXIT`` (itself included) that no loop's span holds (the spans backward
    branches close, ``_loops``), padding ``NOP``s left out. Code after the first loop counts
    whether the loops between run or not, and forward branches are not followed: where a
    branch skips code (a loop with no iteration, its pipeline's set-up), the count is high.
    On the H200 stall profiles a warp of the non-causal looped launches (FA2, naive P·V,
    decode's split) issued 0.85-1.02 times these counts beside its main loop's iterations
    (median 0.95; under the device's Triton, ``tests/test_kernels_aot.py``). None without a
    loop or without that ``EXIT``."""
    code = _sass_code(sass)
    loops = _loops(code)
    if not loops:
        return None
    first = min(lo for lo, _ in loops)
    before = after = 0
    for address, op in code:
        if any(lo <= address <= hi for lo, hi in loops):
            continue
        if op == "EXIT":
            return before, after + 1
        if _SASS_GUARD.sub("", op).startswith("NOP"):
            continue
        if address < first:
            before += 1
        else:
            after += 1
    return None


def shuffles_in(body: list[str]) -> int:
    """The warp shuffles (``SHFL``) among SASS instructions ``body``, predicated or not."""
    return sum(1 for op in body if _SASS_GUARD.sub("", op).startswith("SHFL"))


_SASS_GUARD = re.compile(r"^@!?U?P\w+\s+")
_SASS_REGISTER = re.compile(r"\bR(\d+)(\.64|\.128)?\b")
_SASS_WIDTH = re.compile(r"\.(64|128)\b")
_SASS_HGMMA = re.compile(r"^HGMMA\.64x(\d+)x")
# Instructions whose first operand is read, not written: stores, and matmuls (their
# accumulator is read and written: it is their C operand too).
_SASS_READS_FIRST = ("ST", "RED", "ATOM", "HGMMA", "HMMA", "LDGSTS", "BAR", "BRA", "WARPGROUP")


def _mma_width(opcode: str, position: int) -> int | None:
    """Registers a thread holds of operand ``position`` of a matmul instruction, None if it
    is not one: ``HGMMA.64xN`` its accumulator (positions 0 and 3) N/2 with fp32 (N/4 with
    fp16), its A from registers (1) 4; ``HMMA.16816`` D and C 4, A 4, B 2 (PTX ISA fragment
    layouts)."""
    if m := _SASS_HGMMA.match(opcode):
        accumulator = int(m.group(1)) // (2 if ".F32" in opcode else 4)
        return {0: accumulator, 1: 4, 3: accumulator}.get(position)
    if opcode.startswith("HMMA."):
        return {0: 4, 1: 4, 2: 2, 3: 4}.get(position)
    return None


def _operand_registers(opcode: str, operand: str, position: int) -> set[int]:
    """The 32-bit registers one SASS operand names: ``R8`` one, ``R8.64`` two; the data
    register of a 64/128-bit load or store (``STL.64 [R1], R6``) as wide as the access; a
    matmul's operands as wide as ``_mma_width``."""
    found = set()
    mma = _mma_width(opcode, position)
    access = _SASS_WIDTH.search(opcode) if opcode.startswith(("LD", "ST")) else None
    for m in _SASS_REGISTER.finditer(operand):
        width = {".64": 2, ".128": 4}.get(m.group(2) or "", 1)
        if access and "[" not in operand:
            width = int(access.group(1)) // 32
        if mma is not None:
            width = mma
        found.update(range(int(m.group(1)), int(m.group(1)) + width))
    return found


def reload_waits(body: list[str]) -> int:
    """How many times per iteration a warp running the loop ``body`` (SASS instructions, in
    order) waits for spilled registers to come back from local memory.

    A warp issues in order and stalls only at the first instruction that needs a register
    an ``LDL`` is still loading (or overwrites one); every ``LDL`` issued before that point
    has been in flight as long, so one wait covers them all, and the ``LDL`` issued after it
    start a new round. The body is read twice and the second pass counted: reloads at the
    end of an iteration for the next one's start wait there. A wait that misses L1 lasts an
    L2 round trip (``simulator.sim.program``)."""
    pending: set[int] = set()
    waits = 0
    for counted in (False, True):
        for op in body:
            text = _SASS_GUARD.sub("", op)
            opcode, _, rest = text.partition(" ")
            operands = [o.strip() for o in rest.split(",")] if rest.strip() else []
            registers = [_operand_registers(opcode, o, i) for i, o in enumerate(operands)]
            writes_first = operands and not opcode.startswith(_SASS_READS_FIRST)
            read = set().union(*registers[1 if writes_first else 0:])
            written = registers[0] if writes_first else set()
            if pending & (read | written):
                waits += counted
                pending = set()
            if opcode.startswith("LDL"):
                pending |= written
    return waits


def require_compiler(option: str) -> None:
    """``ProblemError`` (one line) naming ``option`` unless torch and triton are installed
    here: looked for, not imported (the compile workers import them, the caller need not)."""
    from traces.problem import ProblemError

    missing = [m for m in ("torch", "triton") if importlib.util.find_spec(m) is None]
    if missing:
        raise ProblemError(f"{option} compiles the kernels here and needs torch and triton "
                           f"({missing[0]} is missing): pip install 'tilesim[kernels]'")


def compile_ahead(kernel: str, arch: int, dtype: str, head_dim: int, tiling: Tiling,
                  **shape):
    """Triton's compiled kernel for ``arch``, ahead of time (no GPU needed)."""
    import triton
    from triton.backends.compiler import GPUTarget

    signature = _signature(kernel, dtype)
    attrs = _alignment_hints(signature, divisible_ints(kernel, tiling, **shape))
    consts = constexprs(kernel, head_dim, tiling, **shape)
    signature.update({name: "constexpr" for name in consts})  # integers equal to 1 too
    src = triton.compiler.ASTSource(fn=_kernel_fn(kernel), signature=signature,
                                    constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": tiling.num_warps,
                                   "num_stages": tiling.num_stages})


def compile_one(kernel: str, arch: int, dtype: str, head_dim: int, tiling: Tiling,
                **shape) -> KernelResources:
    """Compile one kernel for one tiling and report what it uses (in this process)."""
    fields = {"kernel": kernel, "arch": arch, "dtype": dtype, "head_dim": head_dim,
              "block_m": tiling.block_m, "block_n": tiling.block_n,
              "num_stages": tiling.num_stages, "num_warps": tiling.num_warps}
    try:
        compiled = compile_ahead(kernel, arch, dtype, head_dim, tiling, **shape)
    except Exception as exc:  # a tiling the compiler rejects is a result, not a crash
        message = str(exc).strip().splitlines()
        return KernelResources(**fields, shared_bytes=None, registers=None, spill_bytes=None,
                               error=(message[-1] if message else type(exc).__name__)[:200])
    registers, spill = _cuobjdump_usage(compiled.asm["cubin"])
    sass = _cuobjdump(compiled.asm["cubin"], "-sass")
    body = main_loop_body(sass) if sass else None
    prologue, epilogue = (sass and outside_loop_instructions(sass)) or (None, None)
    loop_instructions, spill_loaded, spill_stored, reloads = (
        loop_facts(body) if body else (None, None, None, None))
    ptx, ttgir = compiled.asm["ptx"], compiled.asm["ttgir"]
    in_flight, after_compute = loop_pipeline(ttgir)
    return KernelResources(**fields, shared_bytes=int(compiled.metadata.shared),
                           mma_layouts=dot_layouts(ttgir), loads_in_flight=in_flight,
                           loads_issued_after_compute=after_compute,
                           loop_instructions=loop_instructions,
                           spill_load_bytes_per_iteration=spill_loaded,
                           spill_store_bytes_per_iteration=spill_stored,
                           spill_reload_waits=reloads,
                           loop_shuffles=None if body is None else shuffles_in(body),
                           straight_instructions=straight_instructions(sass) if sass else None,
                           prologue_instructions=prologue, epilogue_instructions=epilogue,
                           masked_loop_instructions=(masked_loop_instructions(sass)
                                                     if sass else None),
                           registers=registers, spill_bytes=spill,
                           wgmma_ops=len(re.findall(r"\bwgmma\.mma_async\b", ptx)),
                           mma_sync_ops=len(re.findall(r"\bmma\.sync\b", ptx)),
                           wgmma_rs_ops=len(WGMMA_RS.findall(ptx)),
                           **dict(zip(("wgmma_smem_bytes_per_flop",
                                       "wgmma_smem_bytes_per_flop_max"),
                                      wgmma_operand_demand(ptx), strict=True)))


CACHE_ENV = "TILESIM_CACHE_DIR"


def cache_path() -> Path | None:
    """The cache file of this Triton version and these kernel sources; None if turned off.

    The folder is ``$TILESIM_CACHE_DIR``, else ``$XDG_CACHE_HOME/tilesim``, else
    ``~/.cache/tilesim``. The file name carries Triton's version and a hash of every source
    file the compiled kernels and this procedure come from, so an edit to a kernel or an
    upgrade of Triton starts a new file rather than reading stale results.
    """
    import triton

    folder = os.environ.get(CACHE_ENV)
    if folder == "":
        return None
    if folder is None:
        try:
            home = Path.home()
        except RuntimeError:  # no home directory to be found: no cache
            return None
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
        folder = os.path.join(base, "tilesim")
    return Path(folder) / f"kernel-resources-triton{triton.__version__}-{sources_digest()}.jsonl"


def sources_digest() -> str:
    """A hash of every source file the compiled kernels and this procedure come from (16
    hex digits): what a compile's results depend on besides Triton's version and the job.

    The text, comments and docstrings included: a hash of the code alone (its ``ast.dump``
    or tokens) would differ between Python versions (3.13's ``ast.dump`` leaves out empty
    fields, 3.12 tokenizes f-strings apart), and tilesim's table of compiles, which
    carries this hash, would look stale under another Python than the one that built it."""
    here = Path(__file__).resolve().parent
    sources = sorted({here / f"{module}.py" for module in KERNELS.values()}
                     | {here / "common.py", Path(__file__).resolve()})
    return hashlib.sha256(b"".join(path.read_bytes() for path in sources)).hexdigest()[:16]


def _read_cache(path: Path | None) -> dict[str, dict]:
    """Job key -> result from the cache file; lines that do not parse are skipped."""
    if path is None or not path.is_file():
        return {}
    found = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return {}
    fields = {f.name for f in dataclasses.fields(KernelResources)} | {"fits"}
    for line in lines:
        try:
            entry = json.loads(line)
            key, result = entry["key"], dict(entry["result"])
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # a torn or foreign line: that job is compiled again
        if isinstance(key, str) and set(result) == fields and _well_typed(result):
            found[key] = result
    return found


def _well_typed(result: dict) -> bool:
    """Counts are integers (or null), ratios numbers (or null), the error text or null:
    what ``compile_one`` writes, so that a hand-edited line cannot feed nonsense on."""
    counts = ("shared_bytes", "registers", "spill_bytes", "wgmma_ops", "mma_sync_ops",
              "wgmma_rs_ops", "loads_in_flight", "loop_instructions",
              "spill_load_bytes_per_iteration", "spill_store_bytes_per_iteration",
              "spill_reload_waits", "straight_instructions", "prologue_instructions",
              "epilogue_instructions", "masked_loop_instructions")
    ratios = ("wgmma_smem_bytes_per_flop", "wgmma_smem_bytes_per_flop_max")
    return (all(result[k] is None or (isinstance(result[k], int)
                                      and not isinstance(result[k], bool) and result[k] >= 0)
                for k in counts)
            and all(result[k] is None or (isinstance(result[k], (int, float))
                                          and not isinstance(result[k], bool))
                    for k in ratios)
            and all(result[k] is None or isinstance(result[k], str)
                    for k in ("error", "mma_layouts"))
            and result["loads_issued_after_compute"] in (None, True, False))


def _write_cache(path: Path | None, results: dict[str, dict]) -> None:
    """Append ``results`` to the cache in one write; a cache that cannot be written is
    only a slower next run, never an error."""
    if path is None or not results:
        return
    text = "".join(json.dumps({"key": key, "result": result}, sort_keys=True) + "\n"
                   for key, result in results.items())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)
    except OSError:
        pass


def _run_worker(jobs: list[dict], on_result) -> None:
    """Compile ``jobs`` in a fresh Python process with the interpreter off."""
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, TRITON_INTERPRET="0",
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    with tempfile.TemporaryFile("w+") as errors:
        proc = subprocess.Popen([sys.executable, "-m", "kernels.resources"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors,
                                text=True, env=env, cwd=root)
        proc.stdin.write("".join(json.dumps(job) + "\n" for job in jobs))
        proc.stdin.close()
        for line in proc.stdout:
            on_result(json.loads(line))
        if proc.wait() != 0:
            errors.seek(0)
            tail = errors.read().strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"kernel compilation worker exited with code {proc.returncode}: "
                               f"{tail[0]}")


def job_key(kernel: str, arch: int, dtype: str, head_dim: int, tiling: Tiling, **shape) -> str:
    """What a compile of ``kernel`` depends on besides the sources and Triton's version:
    arch, dtype, the constexprs and launch options of this tiling and launch ``shape``
    (``measure``'s keyword arguments), and which integer arguments are multiples of 16.
    Tilings with the same key compile to the same kernel."""
    consts = json.dumps(constexprs(kernel, head_dim, tiling, **shape), sort_keys=True)
    divisible = ",".join(divisible_ints(kernel, tiling, **shape))
    return f"{kernel}/{arch}/{dtype}/{consts}/{tiling.num_warps}/{tiling.num_stages}/{divisible}"


def measure(kernels=None, archs=(90,), dtype: str = "bf16", head_dim: int = 128,
            tilings: list[Tiling] | None = None, workers: int | None = None, progress=None,
            **shape) -> list[KernelResources]:
    """Compile every (kernel, arch, tiling) and return their resources, in that order.

    Tilings that give a kernel the same constexprs and launch options are compiled once
    (naive_softmax, for one, does not depend on block sizes), and jobs found in the cache
    (``cache_path``) not at all. ``progress(done, total)`` is called as compilations finish.
    Work is spread over ``workers`` processes (default: one per core).
    """
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    if not set(archs) <= set(MAX_SHARED_BYTES):
        raise ValueError(f"arch must be among {sorted(MAX_SHARED_BYTES)}, got {list(archs)}")
    kernels = list(KERNELS) if kernels is None else list(kernels)
    unknown = [k for k in kernels if k not in KERNELS]
    if unknown:
        raise ValueError(f"unknown kernel(s) {', '.join(unknown)}; known: {', '.join(KERNELS)}")
    tilings = sweep_tilings() if tilings is None else tilings
    jobs, keys = {}, []
    for kernel, arch, tiling in itertools.product(kernels, archs, tilings):
        key = job_key(kernel, arch, dtype, head_dim, tiling, **shape)
        keys.append((key, tiling))
        jobs.setdefault(key, {"key": key, "kernel": kernel, "arch": arch, "dtype": dtype,
                              "head_dim": head_dim, "tiling": tiling.to_dict(), "shape": shape})
    if not jobs:
        return []
    cache = cache_path()
    cached = _read_cache(cache)
    results: dict[str, dict] = {key: cached[key] for key in jobs if key in cached}
    lock = threading.Lock()

    def on_result(result: dict) -> None:
        with lock:
            results[result.pop("key")] = result
            if progress is not None:
                progress(len(results), len(jobs))

    failures: list[Exception] = []

    def work(chunk: list[dict]) -> None:
        try:
            _run_worker(chunk, on_result)
        except Exception as exc:  # re-raised in the calling thread below
            failures.append(exc)

    job_list = [job for key, job in jobs.items() if key not in results]
    if progress is not None and results:
        progress(len(results), len(jobs))
    workers = max(1, min(len(job_list), workers or os.cpu_count() or 1))
    threads = [threading.Thread(target=work, args=(job_list[w::workers],))
               for w in range(workers)] if job_list else []
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Only complete answers are kept: an error or a missing register count may be this
    # machine's passing trouble (ptxas killed, no cuobjdump), not the kernel's.
    _write_cache(cache, {key: results[key] for key in jobs
                         if key in results and key not in cached
                         and results[key]["error"] is None
                         and results[key]["registers"] is not None})
    if failures:
        raise failures[0]
    missing = len(jobs) - len(results)
    if missing:
        raise RuntimeError(f"{missing} kernel compilations did not report back")
    return [KernelResources.of_job(results[key], tiling, head_dim) for key, tiling in keys]


def schedule_resources(problem, tilings: list[Tiling], kernel_names: list[str], arch: int,
                       workers: int | None = None,
                       progress=None) -> list[dict[str, KernelResources]]:
    """For each tiling, the compiled resources of the named kernels of one problem's
    schedule (the shape constexprs from the problem: causal, naive softmax's row, decode's
    group rows; its integer arguments specialized as Triton does at launch,
    ``launch_ints``), each distinct kernel compiled once for ``arch`` in worker processes.
    ``ValueError`` if a kernel has no twin or the problem's dtype or head_dim none that
    compiles."""
    from kernels import SUPPORTED_HEAD_DIMS

    if problem.dtype not in _DTYPES:
        raise ValueError(f"the Triton kernels compile for {', '.join(_DTYPES)}, "
                         f"not {problem.dtype}")
    if problem.head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"the Triton kernels take head_dim in {SUPPORTED_HEAD_DIMS}, "
                         f"not {problem.head_dim}")
    rows = measure(kernel_names, archs=(arch,), dtype=problem.dtype,
                   head_dim=problem.head_dim, tilings=list(tilings), workers=workers,
                   progress=progress, **problem_shape(problem))
    # measure's order: kernel after kernel, each over every tiling.
    return [{name: rows[k * len(tilings) + i] for k, name in enumerate(kernel_names)}
            for i in range(len(tilings))]


def _serve() -> None:
    """Worker side: one JSON job per stdin line, one JSON result per stdout line. Whatever
    else a compile writes to stdout goes to stderr, so that stdout carries results alone:
    Triton prints the whole PTX of a kernel that ptxas rejects there ("Register allocation
    failed", as FA2's dQ at head_dim 256 with 128 x 256 tiles and 8 warps)."""
    results = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # ptxas and any other child process inherit fd 1
    sys.stdout = sys.stderr
    for line in sys.stdin:
        job = json.loads(line)
        result = compile_one(job["kernel"], job["arch"], job["dtype"], job["head_dim"],
                             Tiling.from_dict(job["tiling"]), **job["shape"])
        results.write(json.dumps(result.to_dict() | {"key": job["key"]}) + "\n")
        results.flush()


if __name__ == "__main__":
    _serve()
