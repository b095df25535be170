"""The overheads probe's calls (``validation.overheads``): what each is and how it is built.

Each call is built on a device (the GPU, or the CPU through Triton's interpreter for a
dry run, at tiny sizes): empty kernels, pointer chases, chains of dependent matmuls,
streaming reads, decode configs of the default matrix (whole and kernel by kernel), a
compute-bound FA2 forward, and the CTAs-per-SM sweep (``validation.ctas_per_sm``). Why
each is there: ``validation.overheads``' docstring.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from validation import ctas_per_sm


@dataclass(frozen=True)
class Call:
    """One timed call: ``name``, what it is, and how to build it on a device."""

    name: str
    detail: dict
    build: Callable  # (device, dry_run) -> the call, a function of no arguments
    warm_only: bool = False  # timed only warm (no flush, no do_bench): the sweep's calls


def _empty_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def probe_empty(X):
        """Does nothing a compiler could see through: one lane may store one value."""
        if tl.program_id(0) < 0:
            tl.store(X, 0.0)

    return probe_empty


def _build_empty(launches: int):
    def build(device, dry_run):
        import torch

        kernel = _empty_kernel()
        x = torch.zeros(1, dtype=torch.float32, device=device)

        def call():
            for _ in range(launches):
                kernel[(1,)](x)
        return call
    return build


def _chase_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def probe_chase(NEXT, AT, steps):
        """A pointer chase: each load's address is the value the one before returned. It
        starts where the last call stopped (``AT``), so that calls walk on to lines they
        have not touched until the cycle comes round."""
        i = tl.load(AT)
        for _ in range(steps):
            i = tl.load(NEXT + i)
        tl.store(AT, i)

    return probe_chase


CHASE_STRIDE = 64  # int64 entries from one node to the next: 512 B, four 128-B lines apart
CHASE_STEPS = 4000
DRY_STEPS = 50  # a chase's or a matmul chain's steps in a CPU rehearsal, through the interpreter


def chase_table(nodes: int, device):
    """The chase's memory: ``nodes`` entries ``CHASE_STRIDE`` apart, each holding the index
    of the next, in one random cycle through all of them (so no walk shorter than
    ``nodes`` steps touches a node twice); int64, zeros between the entries."""
    import torch

    gen = torch.Generator(device=device).manual_seed(0)
    order = torch.randperm(nodes, device=device, generator=gen)
    following = torch.zeros(nodes * CHASE_STRIDE, dtype=torch.int64, device=device)
    following[order * CHASE_STRIDE] = torch.roll(order, -1) * CHASE_STRIDE
    return following


def _build_chase(footprint_bytes: int):
    """One warp following a random cycle through ``footprint_bytes``: each step is one
    load latency (L2's if the footprint fits and the mode leaves it there, else HBM's)."""
    def build(device, dry_run):
        import torch

        nodes = max(2, (4096 if dry_run else footprint_bytes) // (CHASE_STRIDE * 8))
        following = chase_table(nodes, device)
        at = torch.zeros(1, dtype=torch.int64, device=device)
        kernel, steps = _chase_kernel(), DRY_STEPS if dry_run else CHASE_STEPS
        return lambda: kernel[(1,)](following, at, steps, num_warps=1)
    return build


def _mma_chain_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def probe_mma_chain(A, B, OUT, steps, M: tl.constexpr, K: tl.constexpr,
                        DOT_FP32: tl.constexpr):
        """A chain of dependent matmuls, (M x K) @ (K x K): each step's A operand is the
        step before's result, converted to bf16 in registers as FA2's P and dS are, so each
        matmul waits for the one before to finish. One CTA: nothing else runs beside it.
        (``DOT_FP32``: upcast the operands where bf16 dots are unavailable, the
        interpreter; ``kernels.common.mma_operand`` inline, since the interpreter looks up
        a kernel's helpers in its module's globals, which this lazily built one lacks.)"""
        rows = tl.arange(0, M)[:, None]
        cols = tl.arange(0, K)[None, :]
        acc = tl.load(A + rows * K + cols).to(tl.float32)
        b = tl.load(B + tl.arange(0, K)[:, None] * K + cols)
        if DOT_FP32:
            b = b.to(tl.float32)
        for _ in range(steps):
            a = acc.to(tl.bfloat16)
            if DOT_FP32:
                a = a.to(tl.float32)
            acc = tl.dot(a, b)
        tl.store(OUT + rows * K + cols, acc.to(tl.bfloat16))

    return probe_mma_chain


MMA_CHAIN_STEPS = 2000
# (rows, K, warps): 64 rows per warpgroup of 4 warps compile to wgmma on sm_90 (m64nKk16, K/16
# of them chained on the accumulator), the FA kernels' shapes at K = block_n or head_dim; 128
# rows with 8 warps are two warpgroups sharing the SM's tensor cores; 16 rows with one warp
# compile to mma.sync (HMMA.16816), as the small tilings do.
MMA_CHAINS = ((64, 16, 4), (64, 32, 4), (64, 64, 4), (64, 128, 4), (128, 64, 8), (16, 64, 1))


def _build_mma_chain(rows: int, k: int, warps: int):
    """One CTA stepping through ``MMA_CHAIN_STEPS`` dependent matmuls: each step is one
    matmul's latency, issue to result, and the conversion of its result (the launch
    included but spread over the steps)."""
    def build(device, dry_run):
        import torch

        from kernels.common import dot_fp32

        gen = torch.Generator(device="cpu").manual_seed(0)
        a = torch.randn(rows, k, generator=gen).to(torch.bfloat16).to(device)
        # Scaled so that a step keeps the values' size: a @ b has a's spread.
        b = (torch.randn(k, k, generator=gen) / k ** 0.5).to(torch.bfloat16).to(device)
        out = torch.empty(rows, k, dtype=torch.bfloat16, device=device)
        kernel, steps = _mma_chain_kernel(), DRY_STEPS if dry_run else MMA_CHAIN_STEPS
        fp32 = dot_fp32(torch.bfloat16)
        return lambda: kernel[(1,)](a, b, out, steps, M=rows, K=k, DOT_FP32=fp32,
                                    num_warps=warps)
    return build


def _build_read(nbytes: int):
    def build(device, dry_run):
        import torch

        n = (4096 if dry_run else nbytes) // 2
        x = torch.ones(n, dtype=torch.bfloat16, device=device)
        return lambda: torch.sum(x, dtype=torch.float32)
    return build


def _problem_inputs(problem: dict, small: dict, device, dry_run: bool):
    """The problem (``small``'s sizes in a dry run) and its inputs on ``device``."""
    from traces.problem import AttentionProblem
    from validation.workloads import make_inputs

    p = AttentionProblem(**dict(problem, **(small if dry_run else {})))
    return p, make_inputs(p, device)


def _build_kernel(schedule: str, problem: dict, tiling: dict, small: dict):
    def build(device, dry_run):
        from traces.tiling import Tiling
        from validation.workloads import kernel_call

        p, inputs = _problem_inputs(problem, small, device, dry_run)
        return kernel_call(schedule, p, Tiling(**tiling), inputs)
    return build


def _build_decode_part(problem: dict, tiling: dict, small: dict, part: str):
    """One of a decode call's two kernels alone (``part``: "split" or "reduce"); the split
    runs once first, so that the reduce reads real partials."""
    def build(device, dry_run):
        from kernels.decode import launches
        from traces.tiling import Tiling

        p, inputs = _problem_inputs(problem, small, device, dry_run)
        split, reduce, _ = launches(inputs.q, inputs.k, inputs.v, p.causal, Tiling(**tiling),
                                    inputs.sm_scale)
        split()
        return split if part == "split" else reduce
    return build


_DECODE = {"batch": 16, "heads": 32, "kv_heads": 8, "seq_q": 1, "head_dim": 64,
           "dtype": "bf16", "causal": False, "pass_": "fwd"}
_DECODE_SMALL = {"batch": 1, "heads": 4, "kv_heads": 2, "seq_kv": 256}


def calls() -> list[Call]:
    """The probe's calls, in the order they run."""
    out = [Call("empty", {"launches": 1}, _build_empty(1)),
           Call("empty_x2", {"launches": 2}, _build_empty(2))]
    for mb in (4, 512, 2048):
        out.append(Call(f"chase_{mb}mb", {"footprint_bytes": mb * 1024 * 1024,
                                          "steps": CHASE_STEPS},
                        _build_chase(mb * 1024 * 1024)))
    for rows, k, warps in MMA_CHAINS:
        out.append(Call(f"mma_chain_m{rows}_k{k}_w{warps}",
                        {"rows": rows, "k": k, "num_warps": warps, "steps": MMA_CHAIN_STEPS},
                        _build_mma_chain(rows, k, warps)))
    for mb in (16, 64, 256, 1024):
        out.append(Call(f"read_{mb}mb", {"read_bytes": mb * 1024 * 1024},
                        _build_read(mb * 1024 * 1024)))
    for n_kv, d, bn, split in ((1024, 64, 128, 2), (16384, 64, 128, 2), (16384, 64, 32, 4),
                               (4096, 128, 32, 32)):
        problem = dict(_DECODE, seq_kv=n_kv, head_dim=d)
        tiling = {"block_m": 16, "block_n": bn, "num_stages": 2, "num_warps": 4,
                  "split_kv": split}
        name = f"decode_k{n_kv}_n{bn}_sp{split}" + ("" if d == 64 else f"_d{d}")
        detail = {"schedule": "decode", "problem": problem, "tiling": tiling}
        small = dict(_DECODE_SMALL, seq_kv=max(_DECODE_SMALL["seq_kv"], bn * split))
        out.append(Call(name, detail, _build_kernel("decode", problem, tiling, small)))
        if n_kv == 16384 and bn == 128:
            continue  # its parts: the other configs bracket it
        for part in ("split", "reduce"):
            out.append(Call(f"{name}_{part}", dict(detail, kernel=f"decode_{part}"),
                            _build_decode_part(problem, tiling, small, part)))
    fa2 = {"batch": 16, "heads": 16, "kv_heads": 16, "seq_q": 1024, "seq_kv": 1024,
           "head_dim": 128, "dtype": "bf16", "causal": True, "pass_": "fwd"}
    tiling = {"block_m": 64, "block_n": 64, "num_stages": 3, "num_warps": 4, "split_kv": 1}
    out.append(Call("fa2_fwd_1k_d128_causal", {"schedule": "fa2", "problem": fa2,
                                                "tiling": tiling},
                    _build_kernel("fa2", fa2, tiling,
                                  {"batch": 1, "heads": 2, "kv_heads": 2, "seq_q": 64,
                                   "seq_kv": 64, "head_dim": 64})))
    out += [Call(name, {"sweep": detail}, ctas_per_sm.build(detail), warm_only=True)
            for name, detail in ctas_per_sm.specs()]
    return out
