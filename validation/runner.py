"""The timed phase: per config, correctness first, then ``do_bench``; then the peers.

Shapes are run in the plan's order; per shape the inputs and the float64 references are
made once and shared by its tilings and peers. For each call:

1. correctness — run once with NaN-poisoned outputs and apply FlashAttention's rule
   (``validation.correctness``). A failure is recorded with its reason and not timed.
2. timing — ``triton.testing.do_bench(fn, quantiles=[0.5, 0.2, 0.8])``: median, p20, p80
   over repeats, a 256 MiB buffer zeroed before each (L2 flushed); achieved TFLOP/s by
   the FlashAttention FLOP convention. A timing whose p20 and p80 lie more than 10% of
   the median apart is taken again, up to three times, and the steadiest kept
   (``timed_steadily``).

Every record is appended (one write, fsynced) as soon as it is measured, so a run that is
stopped keeps what it measured. The run stops adding calls at its deadline and lists what
it skipped; an error that loses the CUDA context stops it too.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable

from traces.problem import AttentionProblem
from traces.tiling import Tiling
from validation.records import (
    DO_BENCH,
    SCHEMA,
    TIMING_KEYS,
    UNSTABLE_SPREAD_PCT,
    RecordError,
    append_record,
    spread_pct,
)

FATAL_CUDA = ("illegal memory access", "unspecified launch failure", "device-side assert",
              "misaligned address", "CUDA error: an illegal instruction")


def base_record(plan: dict, env: dict, run_id: str, item: dict) -> dict:
    """The record of a plan config or peer before anything is measured."""
    triton_cfg = "schedule" in item
    return {"schema": SCHEMA, "record_id": item["id"], "run_id": run_id,
            "matrix": plan["name"], "plan_sha256": plan["sha256"], "synthetic": False,
            "environment": env,
            "implementation": "triton" if triton_cfg else item["implementation"],
            "schedule": item.get("schedule"), "problem": item["problem"],
            "tiling": item.get("tiling"),
            "kernel": "+".join(item["kernels"]) if triton_cfg else item["implementation"],
            "kernels": item.get("kernels", []),
            "correctness": {"ok": False, "reason": "not run"},
            "timing": None, "timing_reason": "not run",
            "counters": None, "counters_reason": "ncu pass pending"}


def bench(fn: Callable, warmup_ms: float, rep_ms: float) -> dict:
    from triton.testing import do_bench

    median, p20, p80 = do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=[0.5, 0.2, 0.8])
    return {"median_s": median / 1e3, "p20_s": p20 / 1e3, "p80_s": p80 / 1e3,
            "method": DO_BENCH, "l2_flushed": True,
            "warmup_ms": warmup_ms, "rep_ms": rep_ms}


# Times ``timed_steadily`` tries a config whose runs spread wide before it keeps the
# steadiest attempt.
TIMING_ATTEMPTS = 3


def timed_steadily(fn: Callable, bench_fn: Callable, warmup_ms: float, rep_ms: float) -> dict:
    """``bench_fn``'s timing of ``fn``; where its middle runs spread more than
    ``UNSTABLE_SPREAD_PCT`` of their median (the GPU timed the call inconsistently: on the
    H200 of 2026-11-30, six short decode calls, up to 67%), timed again, up to
    ``TIMING_ATTEMPTS`` times in all, and the attempt with the smallest spread kept. A
    timing taken more than once lists every attempt's ``median_s``, ``p20_s`` and ``p80_s``
    under ``attempts``, in the order taken."""
    def spread(timing: dict) -> float:  # no spread to tell (a median of 0, say): steady
        value = spread_pct({"timing": timing})
        return math.inf if value is not None and math.isnan(value) else value or 0.0

    attempts = [bench_fn(fn, warmup_ms, rep_ms)]
    while len(attempts) < TIMING_ATTEMPTS and UNSTABLE_SPREAD_PCT < spread(attempts[-1]) < math.inf:
        attempts.append(bench_fn(fn, warmup_ms, rep_ms))
    if len(attempts) == 1:
        return attempts[0]
    kept = min(attempts, key=spread)
    return dict(kept, attempts=[{k: t[k] for k in TIMING_KEYS} for t in attempts])


def _poisoned():
    try:
        from kernels.common import poisoned_outputs
    except ImportError:
        return contextlib.nullcontext()
    return poisoned_outputs()


def _error_text(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}"[:300]


def measure(rec: dict, problem: AttentionProblem, make_call: Callable[[], Callable],
            refs, bench_fn: Callable, warmup_ms: float, rep_ms: float,
            device: str = "cuda") -> None:
    """Check, then time, one call; fills ``rec`` in place. Re-raises context-losing errors."""
    import torch

    from validation.correctness import check

    try:
        fn = make_call()
        with _poisoned():
            outputs = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        rec["correctness"] = check(problem, outputs, refs)
        del outputs
    except Exception as exc:
        text = _error_text(exc)
        rec["correctness"] = {"ok": False, "reason": f"the call failed: {text}"}
        rec["timing_reason"] = f"not timed: the call failed ({text})"
        if isinstance(exc, torch.cuda.OutOfMemoryError) and device == "cuda":
            torch.cuda.empty_cache()
        if any(s in str(exc) for s in FATAL_CUDA):
            raise
        return
    if not rec["correctness"]["ok"]:
        rec["timing_reason"] = f"not timed: incorrect ({rec['correctness']['reason']})"
        return
    try:
        timing = timed_steadily(fn, bench_fn, warmup_ms, rep_ms)
    except Exception as exc:
        rec["timing_reason"] = f"timing failed: {_error_text(exc)}"
        if device == "cuda":
            torch.cuda.empty_cache()
        if any(s in str(exc) for s in FATAL_CUDA):
            raise
        return
    timing["convention_flops"] = problem.convention_flops()
    timing["tflops"] = problem.convention_flops() / timing["median_s"] / 1e12
    rec["timing"], rec["timing_reason"] = timing, None


def _append(out_path, rec: dict, log: Callable[[str], None]) -> None:
    """Append ``rec``; one that is not a valid record (a value the checks on read would
    refuse) is written, as measured, into the log instead (which a device call returns;
    a further file might not come back, the tool returns eight): a measurement on the GPU
    is too dear to lose to a check, and the run goes on."""
    import json

    try:
        append_record(out_path, rec)
    except RecordError as exc:
        log(f"invalid record ({exc}), as measured: {json.dumps(rec, default=str)}")


def shapes_in_order(plan: dict) -> list[tuple[str, list[dict], list[dict]]]:
    """(shape id, its configs, its peers), in plan order."""
    order: dict[str, tuple[list, list]] = {}
    for cfg in plan["configs"]:
        order.setdefault(cfg["shape"], ([], []))[0].append(cfg)
    for peer in plan["peers"]:
        order.setdefault(peer["shape"], ([], []))[1].append(peer)
    return [(shape, cfgs, peers) for shape, (cfgs, peers) in order.items()]


def _run_shape(plan, env, run_id, out_path, cfgs, peers, deadline, device, bench_fn,
               warmup_ms, rep_ms, result, log) -> str | None:
    """Measure one shape's configs and peers; returns why the run must stop, if it must."""
    import torch

    from validation import workloads
    from validation.correctness import ReferenceCache

    items = cfgs + peers
    problem = AttentionProblem.from_dict(items[0]["problem"])
    try:
        inputs = workloads.make_inputs(problem, device)
        if problem.pass_ != "fwd" and cfgs:
            workloads.setup_backward(cfgs[0]["schedule"], problem, inputs)
    except Exception as exc:  # e.g. out of memory: the whole shape is lost
        for i in items:
            result["failed"][i["id"]] = f"inputs or backward setup failed: {_error_text(exc)}"
        return None
    refs = ReferenceCache(problem, inputs)
    for n, item in enumerate(items):
        if time.monotonic() > deadline:
            result["skipped"] += [i["id"] for i in items[n:]]
            return "time budget reached"
        rec = base_record(plan, env, run_id, item)
        if "schedule" in item:
            tiling = Tiling.from_dict(item["tiling"])

            def make(s=item["schedule"], t=tiling):
                return workloads.kernel_call(s, problem, t, inputs)
        else:
            why = workloads.peer_supported(item["implementation"], problem)
            if why:
                rec["correctness"] = {"ok": False, "reason": f"not run: {why}"}
                rec["timing_reason"] = f"not run: {why}"
                rec["counters_reason"] = "peer: only the Triton kernels are profiled"
                _append(out_path, rec, log)
                result["failed"][item["id"]] = rec["timing_reason"]
                continue

            def make(impl=item["implementation"]):
                return workloads.peer_call(impl, problem, inputs)
        stop = None
        try:
            measure(rec, problem, make, refs, bench_fn, warmup_ms, rep_ms, device)
        except Exception as exc:
            stop = f"CUDA context lost at {item['id']}: {_error_text(exc)}"
        _append(out_path, rec, log)
        if rec["timing"] is not None:
            result["measured"].append(item["id"])
            log(f"timing: {item['id']}: {rec['timing']['median_s'] * 1e3:.3f} ms, "
                f"{rec['timing']['tflops']:.1f} TFLOP/s")
        else:
            result["failed"][item["id"]] = rec["timing_reason"]
            log(f"timing: {item['id']}: {rec['timing_reason']}")
        if stop:
            result["skipped"] += [i["id"] for i in items[n + 1:]]
            return stop
    if device == "cuda":
        del inputs, refs
        torch.cuda.empty_cache()
    return None


def run_timing(plan: dict, env: dict, run_id: str, out_path, deadline: float,
               warmup_ms: float, rep_ms: float, log=print, device: str = "cuda",
               bench_fn: Callable | None = None) -> dict:
    """Measure the plan's configs and peers until ``deadline`` (time.monotonic()).

    ``device`` and ``bench_fn`` exist for rehearsals on a CPU (the Triton interpreter and
    a stand-in for ``do_bench``, which needs CUDA).
    """
    result = {"measured": [], "failed": {}, "skipped": [], "stop_reason": None}
    start = time.monotonic()
    for _, cfgs, peers in shapes_in_order(plan):
        if result["stop_reason"] or time.monotonic() > deadline:
            result["stop_reason"] = result["stop_reason"] or "time budget reached"
            result["skipped"] += [i["id"] for i in cfgs + peers]
            continue
        result["stop_reason"] = _run_shape(plan, env, run_id, out_path, cfgs, peers, deadline,
                                           device, bench_fn or bench, warmup_ms, rep_ms,
                                           result, log)
        if result["stop_reason"]:
            log(f"timing: stopped: {result['stop_reason']}")
    result["seconds"] = time.monotonic() - start
    return result
