"""What a timed call costs beyond its kernels' work: a probe for the next GPU session.

The records leave four costs the model does not know (BENCHMARKS.md, "What is left"):

- **do_bench's flush leaves L2 dirty.** ``triton.testing.do_bench`` zeroes a 256 MB buffer
  before every timed run; L2 is a write-back cache, so the run may begin with L2 full of
  dirty lines that its own misses must write to HBM. A memory-bound first kernel would pay
  for them, a compute-bound one would hide them: decode's records run 4-9 us slower under
  ``do_bench`` than the sum of their kernels' Nsight Compute durations, FA2's forward about
  0 us slower. Since 2026-12-03 the model predicts the records so (``l2_start`` "dirty",
  the preset's whole L2 dirty: ``simulator.sim.l2``); ``dirty - clean`` below says how
  much of L2 the flush really leaves dirty.
- **A kernel's fixed cost.** decode's reduce takes about 2.5 us more than its loads explain
  at every split count (its ncu duration against the split count), and so does PyTorch's
  own flash decoding at the same sizes (the peers' times at N = 1k).
- **The launch between two kernels** (the preset's ``kernel_launch_overhead_s``, 1 us,
  taken from the records' median gap, where timing noise of the long kernels swamps it).
- **A matmul's latency.** The FA kernels wait for each group of wgmma before the math that
  reads its result; the model times matmuls by throughput only (the chains below).

This probe times a few calls under four conditions, all with CUDA events around the call
alone, as ``do_bench`` does (its own modes also spin the GPU for 100 us before the start
event, so that the host's launch latency is never what is timed):

- ``do_bench``: ``triton.testing.do_bench`` itself (what the records used);
- ``dirty``: this module's loop, flushing as ``do_bench`` does (zero a 256 MB buffer);
- ``clean``: the same, then a read of a second 256 MB buffer, which evicts the dirty lines
  (their write-back happens before the timed call) and leaves clean ones;
- ``warm``: no flush at all;

and, with ``ncu``, Nsight Compute's durations of the kernels of an empty call and two
decode calls, with the caches flushed before each kernel as in the matrix's profile
(``ncu_flushed``) and without (``ncu_warm``): the empty kernel's is what a kernel's
duration holds however little it does, and the decode kernels' say how much the flush
adds to the small ones (the matrix's ncu durations of decode's reduce, 3-9 us, were taken
flushed).

``dirty - clean`` is the write-back the flush costs a call; it should grow with the bytes
the call reads and stop at what L2 held dirty. The calls:

- an empty kernel, and two of them (the launch gap);
- pointer chases through 4 MB, 512 MB and 2 GB: L2's and HBM's load latency on the H200
  itself, where the presets take Luo et al.'s H800 cycles (with the dirty mode, HBM's
  latency when every miss also writes a line back);
- chains of dependent matmuls in one CTA (``probe_mma_chain``: each step's A operand the
  step before's result, as FA2's P and dS are, waited for as the FA kernels wait for theirs,
  ``WARPGROUP.DEPBAR.LE gsb0, 0x0`` after each group in our sm_90 SASS): the latency of a
  wgmma group of ``m64nKk16`` at K = 16 to 128, two warpgroups sharing the tensor cores,
  and an mma.sync chain; no source we have gives these, and the backward's dK/dV, which
  waits for two such groups an iteration with one or two warpgroups per SM to hide them, is
  the kernel the model times worst (BENCHMARKS.md, "What is left");
- streaming reads of 16 MB to 1 GB (``torch.sum``);
- four decode configs of the default matrix, three of them also kernel by kernel (the
  split kernel alone, and the reduce alone on the partials the split left): where
  decode's fixed cost sits, in the split kernel, in the reduce, or between them (whole
  call - split - reduce); the reduce at split 32 against split 4 and 2 checks that it
  waits for 8 round trips, not 32 (``ptxas`` unrolls its loop four times);
- one FA2 forward that is compute-bound (the control: ``dirty - clean`` near 0);
- the CTAs-per-SM sweep (``validation.ctas_per_sm``, calls ``sms_*``, timed warm only):
  the kernels the model times worst, each alone with exactly 1, 2 (and 4) CTAs on every
  SM, which parts a CTA's loop iteration into its critical path and what its neighbours
  add.

    python -m validation.overheads run --out overheads.jsonl        # on the GPU, ~30 s
    python -m validation.overheads run --out /tmp/o.jsonl --dry-run  # CPU, interpreter
    python -m validation.overheads ncu --out overheads.jsonl        # on the GPU, ~1 min
    python -m validation.overheads summary overheads.jsonl           # anywhere
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from validation import ctas_per_sm
from validation.records import append_json_lines

SCHEMA = "tilesim.overheads/1"
MODES = ("do_bench", "dirty", "clean", "warm", "ncu_flushed", "ncu_warm")
# Nsight Compute's durations of a few calls' kernels, with the caches flushed before each
# kernel as the matrix's profile has them ("all") and without ("none"): an empty kernel's
# is the fixed cost inside a kernel's duration; decode's say what the flush adds to small
# kernels. Each call runs once to warm up (its launches dropped), then NCU_REPS times.
NCU_CALLS = {"empty": ("probe_empty",),
             "decode_k1024_n128_sp2": ("decode_split", "decode_reduce"),
             "decode_k16384_n32_sp4": ("decode_split", "decode_reduce")}
NCU_REPS = 5
NCU_FILTER = "regex:^(probe_empty|decode_)"
NCU_MODES = {"all": "ncu_flushed", "none": "ncu_warm"}
NCU_METRIC = "gpu__time_duration.sum"
FLUSH_BYTES = 256 * 1024 * 1024  # do_bench's flush buffer (Triton's get_empty_cache)
REP_MS = 40.0  # as the matrix's records (warmup 10 ms, rep 40 ms)
WARMUP_MS = 10.0
MAX_REPS = 400
PRECOMPILE_S = 45.0  # the most ``run`` spends compiling the attention kernels first (15
# kernel sets over the GPU machine's 16 cores: about one round; within run_device.sh's 80 s)
# Before each timed call the GPU spins this many clocks (``torch.cuda._sleep``; 100 us at
# the H200's 1.98 GHz), so that the host has queued the call's launches before the start
# event fires: without it a call on an idle GPU (the warm mode) would time the host's
# launch latency, tens of microseconds from Python, not the GPU's.
HIDE_HOST_CYCLES = 200_000


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


def _quantiles(times_s: list[float]) -> dict:
    ordered = sorted(times_s)

    def q(f):
        return ordered[min(len(ordered) - 1, int(f * len(ordered)))]
    return {"median_s": statistics.median(ordered), "p20_s": q(0.2), "p80_s": q(0.8),
            "n": len(ordered)}


class _Timer:
    """CUDA events around the call on a GPU; ``perf_counter`` in a dry run."""

    def __init__(self, device):
        import torch

        self.cuda = device.type == "cuda"
        self.sync = torch.cuda.synchronize if self.cuda else (lambda: None)
        self.torch = torch

    def run(self, call, before, reps: int) -> list[float]:
        """Times of ``reps`` calls, each after ``before()`` (the flush) and, on a GPU, the
        spin that hides the host (``HIDE_HOST_CYCLES``)."""
        if not self.cuda:
            times = []
            for _ in range(reps):
                before()
                t0 = time.perf_counter()
                call()
                times.append(time.perf_counter() - t0)
            return times
        starts = [self.torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [self.torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            before()
            self.torch.cuda._sleep(HIDE_HOST_CYCLES)
            starts[i].record()
            call()
            ends[i].record()
        self.sync()
        return [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends, strict=True)]


def measure(call: Callable, device, dry_run: bool,
            warm_only: bool = False) -> dict[str, dict]:
    """The call's timing under each mode (``MODES``; no ``do_bench`` in a dry run), or
    ``warm_only``."""
    import torch

    flush_bytes = 4096 if dry_run else FLUSH_BYTES
    cache = torch.empty(flush_bytes // 4, dtype=torch.int32, device=device)
    other = torch.ones(flush_bytes // 4, dtype=torch.int32, device=device)
    timer = _Timer(device)
    call()
    timer.sync()
    t0 = time.perf_counter()
    for _ in range(3):
        cache.zero_()
        call()
    timer.sync()
    estimate_s = max((time.perf_counter() - t0) / 3, 1e-6)
    reps = 3 if dry_run else max(5, min(MAX_REPS, int(REP_MS / 1e3 / estimate_s)))
    for _ in range(0 if dry_run else max(1, int(WARMUP_MS / 1e3 / estimate_s))):
        call()

    def clean():
        cache.zero_()
        torch.sum(other)

    flushes = {"dirty": cache.zero_, "clean": clean, "warm": lambda: None}
    if warm_only:
        flushes = {"warm": flushes["warm"]}
    out = {mode: _quantiles(timer.run(call, before, reps)) for mode, before in flushes.items()}
    if not dry_run and not warm_only:
        from validation.runner import bench

        out["do_bench"] = dict(bench(call, WARMUP_MS, REP_MS), n=None)
    return out


def compile_configs(chosen: list[Call]) -> list[dict]:
    """The attention kernels of ``chosen`` calls as configs for
    ``validation.compile.precompile`` (schedule, problem, tiling and a compile key; one
    per kernel set Triton compiles): the decode and FA2 calls and the CTAs-per-SM sweep,
    whose launches (2 to 8 heads, rows of 66 blocks) the matrix's compiles do not cover."""
    from kernels import resources
    from kernels.table import ARCH  # the Hopper the probe runs on
    from traces.problem import AttentionProblem
    from traces.schedules import build_schedule
    from traces.tiling import Tiling

    configs = {}
    for c in chosen:
        detail = c.detail.get("sweep", c.detail)
        if not {"schedule", "problem", "tiling"} <= detail.keys():
            continue  # the probe's own kernels: small, compiled as they first run
        # Launches that compile alike (``kernels.resources.job_key``: Triton specializes an
        # integer argument on being 1 or a multiple of 16) share one compile.
        problem, tiling = AttentionProblem.from_dict(detail["problem"]), Tiling(**detail["tiling"])
        shape = resources.problem_shape(problem)
        key = json.dumps([resources.job_key(k.name, ARCH, problem.dtype, problem.head_dim,
                                            tiling, **shape)
                          for k in build_schedule(problem, tiling, detail["schedule"]).kernels
                          if k.name in resources.KERNELS])
        configs.setdefault(key, {"compile_key": key, "schedule": detail["schedule"],
                                 "problem": detail["problem"], "tiling": detail["tiling"]})
    return list(configs.values())


def run(out_path: str, dry_run: bool, only: list[str] | None = None,
        log: Callable[[str], None] = print, precompile_s: float = PRECOMPILE_S) -> int:
    """Time every call (or those named in ``only``), appending one JSON line per call and
    mode to ``out_path``; a call that fails is logged and recorded with its error. On a
    GPU the attention kernels are compiled first, in parallel, for at most
    ``precompile_s`` (``compile_configs``): Triton would compile each as its call first
    ran, one after another, about a minute of the device's time."""
    import torch

    from validation.environment import collect

    if not dry_run and not torch.cuda.is_available():
        raise RuntimeError("no CUDA GPU here; run on the GPU machine or pass --dry-run")
    device = torch.device("cuda" if torch.cuda.is_available() and not dry_run else "cpu")
    env = collect(None)
    chosen = [c for c in calls() if not only or c.name in only]
    if not dry_run and precompile_s > 0:
        from simulator.cli.common import cores
        from validation.compile import precompile

        done = precompile(compile_configs(chosen), cores(), precompile_s, log)
        log(f"precompile: {done['done']} of {done['tasks']} kernel sets in "
            f"{done['seconds']:.0f} s, {len(done['failed'])} failed {done['failed'][:1]}")
    failed = 0
    for c in chosen:
        detail = c.detail
        if dry_run:
            detail = dict(detail, note="dry run: tiny sizes, not these",
                          **({"steps": DRY_STEPS} if "steps" in detail else {}))
        base = {"schema": SCHEMA, "call": c.name, "detail": detail, "dry_run": dry_run,
                "environment": env}
        try:
            results = measure(c.build(device, dry_run), device, dry_run, c.warm_only)
            rows = [dict(base, mode=mode, **t) for mode, t in results.items()]
            log(f"{c.name}: " + ", ".join(f"{m} {t['median_s'] * 1e6:.1f} us"
                                          for m, t in results.items()))
        except Exception as exc:  # one call's failure must not lose the others
            failed += 1
            rows = [dict(base, mode=None, error=f"{type(exc).__name__}: {exc}"[:300])]
            log(f"{c.name}: failed: {rows[0]['error']}")
        append_json_lines(out_path, rows)
    return failed


def profile_target(dry_run: bool = False, reps: int = NCU_REPS) -> None:
    """What ``ncu`` runs: each of ``NCU_CALLS`` once, then ``reps`` times, in order, with no
    flush and no timing between them."""
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() and not dry_run else "cpu")
    by_name = {c.name: c for c in calls()}
    for name in NCU_CALLS:
        call = by_name[name].build(device, dry_run)
        for _ in range(reps + 1):
            call()
        if device.type == "cuda":
            torch.cuda.synchronize()


def ncu_rows(launches: list, reps: int = NCU_REPS) -> list[dict]:
    """Per call of ``NCU_CALLS``, the median duration of each of its kernels over ``reps``
    (the warm-up's launches dropped) and their sum, from ncu's launches in launch order;
    ``NcuParseError`` if the launches are not exactly the calls' kernels in that order."""
    from validation.ncu import NcuParseError

    expected = [(name, kernel, rep) for name, kernels in NCU_CALLS.items()
                for rep in range(reps + 1) for kernel in kernels]
    got = [launch.name for launch in launches]
    if got != [kernel for _, kernel, _ in expected]:
        raise NcuParseError(f"expected {len(expected)} launches of the probe's kernels in "
                            f"order, got {len(got)}: {', '.join(got[:8])}"
                            + (" ..." if len(got) > 8 else ""))
    durations: dict[str, dict[str, list[float]]] = {n: {} for n in NCU_CALLS}
    for (name, kernel, rep), launch in zip(expected, launches, strict=True):
        value = launch.metrics.get(NCU_METRIC)
        if rep > 0 and value is not None:
            durations[name].setdefault(kernel, []).append(value)
    rows = []
    for name, kernels in durations.items():
        medians = {k: statistics.median(v) for k, v in kernels.items()}
        if len(medians) == len(NCU_CALLS[name]):
            rows.append({"call": name, "kernels_s": medians,
                         "median_s": sum(medians.values()), "n": reps})
    return rows


def run_ncu(out_path: str, log: Callable[[str], None] = print, budget_s: float = 240.0) -> int:
    """Profile ``NCU_CALLS`` under both cache controls (``NCU_MODES``), both within
    ``budget_s``, and append their rows; returns how many of the two profiles failed (0
    without ncu: nothing to do)."""
    from validation import ncu
    from validation.environment import collect

    exe = ncu.find_ncu()
    if exe is None:
        log("ncu: not found; no kernel durations")
        return 0
    deadline = time.monotonic() + budget_s
    helptext = ncu.run_tool([exe, "--help"]) or ""
    env, failed = collect(ncu.version(exe)), 0
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    child_env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (repo, os.environ.get("PYTHONPATH", "")) if p))
    target = [sys.executable, "-m", "validation.overheads", "profile-target"]
    for cache, mode in NCU_MODES.items():
        argv = ncu.command(exe, [NCU_METRIC], target, base_units="--print-units" in helptext,
                           kernel_filter=NCU_FILTER, cache_control=cache)
        base = {"schema": SCHEMA, "mode": mode, "dry_run": False, "environment": env}
        try:
            done = subprocess.run(argv, capture_output=True, text=True, cwd=repo, env=child_env,
                                  timeout=max(deadline - time.monotonic(), 5.0))
            try:
                launches = ncu.parse_csv(done.stdout)
            except ncu.NcuParseError as exc:
                said = ncu.first_error(done.stdout + "\n" + done.stderr)
                why = str(exc) + (f"; ncu said: {said}" if said else "")
                raise ncu.NcuParseError(why) from None
            rows = [dict(base, detail={"cache_control": cache}, **r)
                    for r in ncu_rows(launches)]
            log(f"{mode}: " + ", ".join(f"{r['call']} {r['median_s'] * 1e6:.2f} us"
                                        for r in rows))
        except (ncu.NcuParseError, subprocess.TimeoutExpired, OSError) as exc:
            failed += 1
            rows = [dict(base, call="ncu", detail={"cache_control": cache},
                         error=f"{type(exc).__name__}: {exc}"[:300])]
            log(f"{mode}: failed: {rows[0]['error']}")
        append_json_lines(out_path, rows)
    return failed


def load(path: str) -> list[dict]:
    """The rows of a probe file; a malformed line is a ``ValueError`` naming it."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict) or row.get("schema") != SCHEMA:
                raise ValueError(f"{path}:{number}: not a {SCHEMA} row")
            rows.append(row)
    return rows


def summary(rows: list[dict]) -> list[dict]:
    """Per call, the median time under each mode and the differences that answer the
    module's questions, in microseconds: ``writeback_us`` (dirty - clean), ``flush_us``
    (clean - warm: what a clean flush still costs, the call's own misses) and
    ``do_bench_vs_dirty_us`` (should be about 0: this loop flushes as do_bench does),
    ``do_bench_vs_ncu_us`` (do_bench less the kernels' flushed ncu durations: the records'
    launch gap, for the calls ncu profiles).
    A call's ``launch_gap_us`` (``empty_x2 - empty``, warm) is reported once, on
    ``empty_x2``; a pointer chase or a matmul chain gets ``per_step_ns`` per mode (its
    time over its steps: one load's or one matmul's latency each, the launch included but
    spread over thousands of steps); a call
    timed also kernel by kernel (``X_split``, ``X_reduce``) gets
    ``between_us`` per mode: the whole call's time less its kernels' alone; a call of the
    CTAs-per-SM sweep gets ``per_iteration`` (``ctas_per_sm.per_iteration``). Calls with an
    error carry it instead."""
    by_call: dict[str, dict] = {}
    steps = {row["call"]: (row.get("detail") or {}).get("steps") for row in rows}
    swept = {row["call"]: row["detail"]["sweep"] for row in rows
             if "sweep" in (row.get("detail") or {})}
    for row in rows:
        entry = by_call.setdefault(row["call"], {"call": row["call"], "median_us": {}})
        if row.get("error"):
            entry["error"] = row["error"]
        elif row.get("mode") in MODES:
            entry["median_us"][row["mode"]] = row["median_s"] * 1e6

    def diff(medians: dict, a: str, b: str) -> float | None:
        return medians[a] - medians[b] if a in medians and b in medians else None

    for entry in by_call.values():
        m = entry["median_us"]
        entry["writeback_us"] = diff(m, "dirty", "clean")
        entry["flush_us"] = diff(m, "clean", "warm")
        entry["do_bench_vs_dirty_us"] = diff(m, "do_bench", "dirty")
        entry["do_bench_vs_ncu_us"] = diff(m, "do_bench", "ncu_flushed")
        if steps.get(entry["call"]):
            entry["per_step_ns"] = {mode: v * 1e3 / steps[entry["call"]]
                                    for mode, v in m.items()}
        if entry["call"] in swept:
            entry["per_iteration"] = ctas_per_sm.per_iteration(m, swept[entry["call"]])
    for name, entry in by_call.items():
        parts = [by_call.get(f"{name}_{part}", {}).get("median_us", {})
                 for part in ("split", "reduce")]
        if all(parts):
            whole = entry["median_us"]
            entry["between_us"] = {mode: whole[mode] - parts[0][mode] - parts[1][mode]
                                   for mode in MODES
                                   if mode in whole and all(mode in p for p in parts)}
    one = by_call.get("empty", {}).get("median_us", {})
    two = by_call.get("empty_x2", {}).get("median_us", {})
    if "warm" in one and "warm" in two:
        by_call["empty_x2"]["launch_gap_us"] = two["warm"] - one["warm"]
    return list(by_call.values())


def _format(entries: list[dict]) -> str:
    def us(v):
        return f"{'-':>11s}" if v is None else f"{v:11.1f}"
    extra = ("wb", "flush", "db-dirty", "db-ncu")
    lines = [f"{'call':28s} " + " ".join(f"{m:>11s}" for m in MODES + extra),
             "(us; wb = dirty - clean, flush = clean - warm, db-X = do_bench - X)"]
    for e in entries:
        if e.get("error"):
            lines.append(f"{e['call']:28s} failed: {e['error']}")
            continue
        m = e["median_us"]
        values = [m.get(mode) for mode in MODES] + [
            e["writeback_us"], e["flush_us"], e["do_bench_vs_dirty_us"], e["do_bench_vs_ncu_us"]]
        lines.append(f"{e['call']:28s} " + " ".join(us(v) for v in values))
        if e.get("between_us"):
            lines.append(f"{'':28s} whole - split - reduce: " + ", ".join(
                f"{mode} {v:.1f}" for mode, v in e["between_us"].items()) + " us")
        if e.get("per_step_ns"):
            what = ("per matmul (a chain's step)" if e["call"].startswith("mma_chain")
                    else "per load (a chase's step)")
            lines.append(f"{'':28s} {what}: " + ", ".join(
                f"{mode} {v:.0f} ns" for mode, v in e["per_step_ns"].items()))
        if e.get("per_iteration"):
            it = e["per_iteration"]
            lines.append(f"{'':28s} a CTA's iteration {it['per_cta_ns']:.0f} ns, the SM's "
                         f"{it['per_sm_ns']:.0f} ns (warm)")
        if "launch_gap_us" in e:
            lines.append(f"{'':28s} launch gap (empty_x2 - empty, warm): "
                         f"{e['launch_gap_us']:.2f} us")
    return "\n".join(lines)


def _compare(args) -> int:
    """``compare``: print ``ctas_per_sm.compare`` of the probe file's swept calls measured
    on a GPU, or without a file the model's predictions of every swept call."""
    from simulator.hardware import load_hardware
    from validation.records import read_records

    records, bad = read_records(args.records)
    if bad:
        print(f"python -m validation.overheads: {len(bad)} malformed record line(s) in "
              f"{args.records} skipped (first: {bad[0]})", file=sys.stderr)
    hw = load_hardware(args.hardware)
    if args.path is None:
        table = ctas_per_sm.compare({}, records, hw)
    else:
        rows = [r for r in load(args.path) if r.get("dry_run") is False]
        details = {r["call"]: r["detail"]["sweep"] for r in rows
                   if "sweep" in (r.get("detail") or {})}
        measured = {e["call"]: e["per_iteration"]["per_cta_ns"] for e in summary(rows)
                    if (e.get("per_iteration") or {}).get("per_cta_ns") is not None}
        table = ctas_per_sm.compare(measured, records, hw,
                                    {n: d for n, d in details.items() if n in measured})
    if args.json:
        print(json.dumps(table, indent=1))
        return 0
    if not table:
        print("no swept calls measured on a GPU in this file")
        return 0

    def ns(v):
        return f"{'-':>10s}" if v is None else f"{v:10.0f}"
    print(f"{'call':44s} {'c':>2s} {'measured':>10s} {'predicted':>10s} {'error':>7s}"
          f"   (ns per CTA iteration, warm; {hw.name})")
    for t in table:
        error = "-" if t["error_pct"] is None else f"{t['error_pct']:+6.1f}%"
        print(f"{t['call']:44s} {t['ctas_per_sm']:2d} {ns(t['measured_per_cta_ns'])} "
              f"{ns(t['predicted_per_cta_ns'])} {error:>7s}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validation.overheads",
                                     description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="time the probe's calls (GPU, or --dry-run on the CPU)")
    r.add_argument("--out", required=True, help="JSON Lines file to append to")
    r.add_argument("--dry-run", action="store_true",
                   help="tiny sizes on the CPU through Triton's interpreter")
    r.add_argument("--only", nargs="*", help="run only these calls")
    n = sub.add_parser("ncu", help="Nsight Compute's durations of a few calls' kernels")
    n.add_argument("--out", required=True, help="JSON Lines file to append to")
    n.add_argument("--budget-s", type=float, default=240.0,
                   help="seconds for both profiles together (default 240)")
    t = sub.add_parser("profile-target", help="what the ncu command profiles (no timing)")
    t.add_argument("--dry-run", action="store_true")
    s = sub.add_parser("summary", help="the table of a probe file")
    s.add_argument("path")
    s.add_argument("--json", action="store_true")
    c = sub.add_parser("compare", help="the CTAs-per-SM sweep measured against the model "
                       "(anywhere; seconds per call)")
    c.add_argument("path", nargs="?",
                   help="probe file (without one: the model's predictions of every call)")
    c.add_argument("--records", required=True,
                   help="records whose kernel_facts give the swept kernels' compile")
    c.add_argument("--hardware", default="h200-sxm", help="preset (default h200-sxm)")
    c.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if getattr(args, "dry_run", False):
        os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        if args.command == "run":
            failed = run(args.out, args.dry_run, args.only)
            return 1 if failed else 0
        if args.command == "ncu":
            return 1 if run_ncu(args.out, budget_s=args.budget_s) else 0
        if args.command == "profile-target":
            profile_target(args.dry_run)
            return 0
        if args.command == "compare":
            return _compare(args)
        entries = summary(load(args.path))
        print(json.dumps(entries, indent=1) if args.json else _format(entries))
        return 0
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        print(f"python -m validation.overheads: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
