"""Speed of the Triton kernels on a GPU, beside PyTorch SDPA (MATH and FLASH backends).

Run from the repository root on a GPU machine:  python benchmarks/kernels_gpu.py
For each bf16 problem (d in 64, 128; N in 1k..16k; causal or not; forward or
forward+backward) it autotunes fa2 over a tiling list, times every implementation with
``triton.testing.do_bench`` (median of repeats, L2 flushed before each), checks correctness
first (FlashAttention's rule on one head against float64; a failing result is reported,
not timed), and prints TFLOP/s and the issue's targets (issue 4). ``--json FILE`` writes
one JSON object per measurement.

FLOPs follow the FlashAttention convention: forward 4·B·H·N²·d, causal halves it, and
forward+backward is 3.5x forward (the backward counts 2.5x).

``--dry-run`` exercises the whole script on the CPU through Triton's interpreter at tiny
sizes (timed with perf_counter), so that it is testable anywhere. Without a GPU and without
``--dry-run`` it says so and exits 0.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TOKENS = 16384  # batch * seq_len, as FlashAttention's benchmarks keep it
HIDDEN = 2048  # heads * head_dim
FWD_TILINGS = [(128, 64, 3, 8), (128, 128, 3, 8), (64, 64, 3, 4), (128, 32, 3, 4)]
BWD_TILINGS = [(64, 64, 2, 4), (64, 128, 2, 8), (128, 64, 2, 8), (32, 64, 3, 4)]


@dataclass(frozen=True)
class Shape:
    batch: int
    heads: int
    seq: int
    head_dim: int
    causal: bool
    pass_: str  # "fwd" or "fwd+bwd"
    seq_q: int = 0  # query length when it differs from seq (decoding), else 0

    @property
    def nq(self) -> int:
        return self.seq_q or self.seq

    @property
    def flops(self) -> float:
        fwd = 4 * self.batch * self.heads * self.nq * self.seq * self.head_dim
        fwd /= 2 if self.causal else 1
        return fwd * (3.5 if self.pass_ == "fwd+bwd" else 1.0)

    def describe(self) -> str:
        n = f"{self.nq}x{self.seq}" if self.seq_q else f"{self.seq}"
        return (f"d={self.head_dim} N={n} B={self.batch} H={self.heads} "
                f"{'causal' if self.causal else 'full'} {self.pass_}")


@dataclass
class Result:
    shape: Shape
    impl: str  # fa2, naive, fa1, sdpa_math, sdpa_flash
    tiling: str
    median_ms: float
    p20_ms: float
    p80_ms: float
    tflops: float
    ok: bool
    note: str = ""


def shapes(dry_run: bool) -> list[Shape]:
    if dry_run:
        return [Shape(1, 2, 40, 16, False, "fwd"), Shape(1, 2, 40, 32, True, "fwd+bwd"),
                Shape(1, 2, 40, 16, False, "fwd", seq_q=2)]
    return [Shape(TOKENS // n, HIDDEN // d, n, d, c, p) for d in (64, 128)
            for n in (1024, 2048, 4096, 8192, 16384) for c in (False, True)
            for p in ("fwd", "fwd+bwd")] + [
        Shape(16, 16, n, 128, False, "fwd", seq_q=1) for n in (4096, 16384)]


def tilings(pass_: str, dry_run: bool, full: bool, impl: str = "fa2"):
    from traces.tiling import Tiling

    if impl == "decode":
        if dry_run:
            return [Tiling(block_m=16, block_n=16, split_kv=2)]
        return [Tiling(block_m=16, block_n=64, num_stages=3, num_warps=4, split_kv=s)
                for s in (4, 8, 16)]
    if dry_run:
        return [Tiling(block_m=16, block_n=16), Tiling(block_m=32, block_n=16)]
    if full:
        from kernels.resources import sweep_tilings

        return sweep_tilings()
    table = FWD_TILINGS if pass_ == "fwd" else BWD_TILINGS
    return [Tiling(block_m=m, block_n=n, num_stages=s, num_warps=w) for m, n, s, w in table]


def implementations(shape: Shape, args) -> list[str]:
    if shape.seq_q:
        return ["decode", "fa2", "sdpa_flash", "sdpa_math"]
    impls = ["fa2", "sdpa_flash"]
    if shape.seq <= args.naive_max_seq:
        impls += ["naive", "sdpa_math"]
    if shape.pass_ == "fwd" and shape.seq <= args.fa1_max_seq:
        impls.append("fa1")
    return impls


def make_call(impl: str, shape: Shape, q, k, v, do, tiling):
    """A no-argument callable running one forward (or forward+backward) of ``impl``."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernels.attention import attention

    if impl.startswith("sdpa"):
        backend = SDPBackend.MATH if impl == "sdpa_math" else SDPBackend.FLASH_ATTENTION

        def forward(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=shape.causal)
    else:
        def forward(q, k, v):
            return attention(q, k, v, causal=shape.causal, tiling=tiling, algorithm=impl)

    if shape.pass_ == "fwd":
        def call():
            with torch.no_grad():
                return (forward(q, k, v),)
        return call
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]

    def call():
        out = forward(*leaves)
        return (out, *torch.autograd.grad(out, leaves, do))
    return call


def references(shape: Shape, q, k, v, do) -> tuple[list, list]:
    """Head (0, 0)'s outputs (and gradients) in float64 and in PyTorch at bf16."""
    import torch

    from kernels.reference import pytorch_attention

    head = [t[:1, :1] for t in (q, k, v)]
    refs, pts = [], []
    for dtype in (torch.float64, None):
        leaves = [(t.to(dtype) if dtype else t).detach().requires_grad_() for t in head]
        out = pytorch_attention(*leaves, causal=shape.causal)
        grads = (torch.autograd.grad(out, leaves, do[:1, :1].to(out.dtype))
                 if shape.pass_ == "fwd+bwd" else ())
        (refs if dtype else pts).extend([out.detach(), *grads])
    return refs, pts


def check(outputs, refs, pts) -> tuple[bool, str]:
    """FlashAttention's rule on head (0, 0) for every output; returns (ok, note)."""
    worst = 0.0
    for name, got, ref, pt in zip(("out", "dq", "dk", "dv"), outputs, refs, pts, strict=False):
        err = (got[:1, :1].double() - ref).abs().max().item()
        err_pt = (pt.double() - ref).abs().max().item()
        if not err <= (2 * err_pt if err_pt > 0 else 1e-5):
            return False, f"{name} error {err:.2e} > 2x PyTorch's {err_pt:.2e}"
        worst = max(worst, err / max(err_pt, 1e-12))
    return True, f"err {worst:.2f}x PyTorch"


def timer(dry_run: bool):
    """(median, p20, p80) in ms of a callable: do_bench on a GPU, perf_counter on the CPU."""
    if not dry_run:
        import triton

        return lambda fn: tuple(triton.testing.do_bench(fn, warmup=10, rep=40,
                                                        quantiles=[0.5, 0.2, 0.8]))

    def cpu(fn):
        start = time.perf_counter()
        fn()
        elapsed = (time.perf_counter() - start) * 1e3
        return elapsed, elapsed, elapsed
    return cpu


def inputs(shape: Shape, device: str):
    import torch

    gen = torch.Generator(device=device).manual_seed(shape.seq * 1000 + shape.head_dim)
    sizes = [(shape.batch, shape.heads, n, shape.head_dim)
             for n in (shape.nq, shape.seq, shape.seq, shape.nq)]  # q, k, v, do
    return [torch.randn(size, device=device, dtype=torch.bfloat16, generator=gen)
            for size in sizes]


def bench_shape(shape: Shape, args, device: str, time_fn) -> list[Result]:
    import torch

    q, k, v, do = inputs(shape, device)
    refs, pts = references(shape, q, k, v, do)
    results = []
    for impl in implementations(shape, args):
        peer = impl.startswith("sdpa")
        candidates = [None] if peer else tilings(shape.pass_, args.dry_run, args.full, impl)
        if impl in ("naive", "fa1"):  # slow by design: one tiling is enough to show it
            candidates = candidates[:1]
        best = None
        for tiling in candidates:
            label = tiling.describe() if tiling else "-"
            try:
                call = make_call(impl, shape, q, k, v, do, tiling)
                ok, note = check(call(), refs, pts)
                # A wrong kernel's speed means nothing; a peer is timed and its error noted.
                median, p20, p80 = time_fn(call) if ok or peer else (float("nan"),) * 3
            except Exception as exc:  # a backend that cannot run this shape: record, go on
                ok, note, median, p20, p80 = False, f"{type(exc).__name__}: {exc}"[:160], *[
                    float("nan")] * 3
            finally:
                if device == "cuda":
                    torch.cuda.empty_cache()
            result = Result(shape, impl, label, median, p20, p80,
                            shape.flops / (median * 1e-3) / 1e12, ok, note)
            if best is None or (ok and not (best.ok and best.median_ms <= median)):
                best = result
        results.append(best)
    return results


def warm_compile_cache(args) -> None:
    """Compile every (kernel, tiling) the run will launch, in parallel worker processes.

    Triton compiles on first launch (seconds per kernel); workers launch each config once on
    a small problem with the same specialisation, which fills Triton's on-disk cache.
    """
    jobs = [(d, c, p, 0, impl, t.to_dict()) for d in (64, 128) for c in (False, True)
            for p in ("fwd", "fwd+bwd") for impl in ("fa2", "naive", "fa1")
            for t in (tilings(p, False, args.full)[:1 if impl != "fa2" else None])
            if not (impl == "fa1" and p != "fwd")]
    jobs += [(128, False, "fwd", 1, impl, t.to_dict()) for impl in ("decode", "fa2")
             for t in tilings("fwd", False, args.full, impl)]
    n = max(1, min(args.jobs, len(jobs)))
    procs = [subprocess.Popen([sys.executable, __file__, "--warm-worker", json.dumps(jobs[i::n])],
                              stdout=subprocess.DEVNULL) for i in range(n)]
    for proc in procs:
        proc.wait()


def warm_worker(jobs_json: str) -> None:
    from traces.tiling import Tiling

    for d, causal, pass_, seq_q, impl, tiling in json.loads(jobs_json):
        shape = Shape(2, HIDDEN // d, 256, d, causal, pass_, seq_q)
        q, k, v, do = inputs(shape, "cuda")
        try:
            make_call(impl, shape, q, k, v, do, Tiling.from_dict(tiling))()
        except Exception as exc:  # reported again, with context, by the timed run
            sys.stderr.write(f"warm-up {impl} {tiling}: {exc}\n")


def print_results(results: list[Result]) -> None:
    by_shape: dict = {}
    for r in results:
        by_shape.setdefault(r.shape, {})[r.impl] = r
    header = f"{'problem':<44} {'impl':<10} {'ms':>9} {'TFLOP/s':>8}  tiling / note"
    print(header)
    print("-" * len(header))
    for shape, impls in by_shape.items():
        for impl, r in impls.items():
            speed = f"{r.tflops:8.1f}" if r.ok else f"{'-':>8}"
            print(f"{shape.describe():<44} {impl:<10} {r.median_ms:9.3f} {speed}  "
                  f"{r.tiling} {'' if r.ok else '[FAILED] '}{r.note}")
        fa2, flash, naive = impls.get("fa2"), impls.get("sdpa_flash"), impls.get("naive")
        for ours in ("fa2", "decode"):
            mine = impls.get(ours)
            if mine and flash and mine.ok and flash.ok:
                print(f"{'':<44} {ours}/FLASH speed {flash.median_ms / mine.median_ms:.2f}x")
        if fa2 and naive and fa2.ok and naive.ok:
            print(f"{'':<44} naive/fa2 time {naive.median_ms / fa2.median_ms:.1f}x")


def targets(results: list[Result]) -> list[str]:
    """The issue's targets (H200), each PASS or FAIL with the numbers behind it."""
    table = {(r.shape, r.impl): r for r in results}
    lines = []
    for shape in dict.fromkeys(r.shape for r in results):
        fa2, flash = table.get((shape, "fa2")), table.get((shape, "sdpa_flash"))
        naive = table.get((shape, "naive"))
        if not (fa2 and fa2.ok):
            continue
        if shape.head_dim == 128 and shape.seq >= 4096 and flash and flash.ok:
            speed = flash.median_ms / fa2.median_ms
            if shape.pass_ == "fwd":
                ok = speed >= 1.0 and fa2.tflops >= 450
                lines.append(f"{'PASS' if ok else 'FAIL'} fa2 fwd >= 1.0x FLASH and >= 450 "
                             f"TFLOP/s: {speed:.2f}x, {fa2.tflops:.0f} TFLOP/s, "
                             f"{shape.describe()}")
            else:
                lines.append(f"{'PASS' if speed >= 0.9 else 'FAIL'} fa2 fwd+bwd >= 0.9x FLASH:"
                             f" {speed:.2f}x, {shape.describe()}")
        if shape.seq == 8192 and naive and naive.ok:
            ratio = naive.median_ms / fa2.median_ms
            lines.append(f"{'PASS' if ratio >= 5 else 'FAIL'} naive/fa2 time >= 5x: "
                         f"{ratio:.1f}x, {shape.describe()}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="run on the CPU in Triton's interpreter at tiny sizes")
    parser.add_argument("--full", action="store_true",
                        help="autotune fa2 over every tiling the sweep enumerates (slow)")
    parser.add_argument("--head-dim", type=int, nargs="+", default=None)
    parser.add_argument("--seq", type=int, nargs="+", default=None)
    parser.add_argument("--naive-max-seq", type=int, default=8192)
    parser.add_argument("--fa1-max-seq", type=int, default=2048)
    parser.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1),
                        help="processes that compile kernels ahead of the timed run")
    parser.add_argument("--json", default=None, metavar="FILE", help="write results here")
    parser.add_argument("--warm-worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel is defined
    if args.warm_worker:
        warm_worker(args.warm_worker)
        return 0
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("kernels_gpu: no CUDA GPU here, nothing to time (--dry-run runs on the CPU)")
        return 0
    device = "cpu" if args.dry_run else "cuda"
    todo = [s for s in shapes(args.dry_run)
            if (args.head_dim is None or s.head_dim in args.head_dim)
            and (args.seq is None or s.seq in args.seq)]
    start = time.perf_counter()
    if not args.dry_run:
        warm_compile_cache(args)
        print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, compile "
              f"{time.perf_counter() - start:.0f} s")
    time_fn = timer(args.dry_run)
    results = []
    for shape in todo:
        results += bench_shape(shape, args, device, time_fn)
    print_results(results)
    for line in targets(results):
        print(line)
    print(f"# {len(results)} results in {time.perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            for r in results:
                f.write(json.dumps(asdict(r) | {"shape": asdict(r.shape)}) + "\n")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
