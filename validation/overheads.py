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

from validation.overhead_calls import DRY_STEPS, Call, calls
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
        from validation import overheads_summary  # it reads this module's SCHEMA and MODES

        if args.command == "compare":
            return overheads_summary.compare(args)
        entries = overheads_summary.summary(overheads_summary.load(args.path))
        print(json.dumps(entries, indent=1) if args.json
              else overheads_summary.format_table(entries))
        return 0
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        print(f"python -m validation.overheads: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
