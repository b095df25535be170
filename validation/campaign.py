"""One validation run on the GPU machine: compile, time, profile, attach counters, summarise.

Phases, each under its share of one time budget (the device call must end in time):

1. compile — the plan's unique kernels in parallel workers (``validation.compile``).
2. timing — correctness and ``do_bench`` per config and peer (``validation.runner``); it
   gets its estimated share of the budget and skips what does not fit.
3. counters — one ``ncu`` process over every config that was timed
   (``validation.profile_target``), stopped by its own deadline; its CSV is parsed and the
   counters are written into the run's records (``validation.ncu``). Without ncu the
   records say so.

Everything the run leaves is in ``log_dir``: ``summary.json`` (phases with estimated and
actual seconds, what failed, what was skipped and why, ncu's measured cost per launch),
``ncu.csv`` and ``ncu.log``; the records are in ``out_path``.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from validation import environment, ncu
from validation.choose import NEAR_TIE
from validation.estimate import FINISH_S, estimate

REPO = Path(__file__).resolve().parents[1]
NCU_TAIL_S = 20.0  # ncu prints its results after the profiled process exits


@dataclass
class RunOptions:
    budget_s: float = 450.0
    warmup_ms: float = 10.0
    rep_ms: float = 40.0
    workers: int = 15
    use_ncu: bool = True
    device: str = "cuda"  # "cpu": a rehearsal with the Triton interpreter (tests)


def _profile(plan: dict, ids: list[str], exe: str, log_dir: Path, until: float,
             device: str, log) -> dict:
    """Run the ncu phase until ``until`` (monotonic); returns what ``ncu.attach`` needs."""
    start = time.monotonic()
    query = ncu.query_metrics(exe)
    metrics, dropped = ncu.usable_metrics(query)
    if dropped:
        log(f"ncu: metrics not listed by --query-metrics, left out: {', '.join(dropped)}")
    helptext = ncu.run_tool([exe, "--help"]) or ""
    # The target's plan, ids and manifest live in a folder removed when ncu is done.
    with tempfile.TemporaryDirectory(prefix="tilesim-ncu-", ignore_cleanup_errors=True) as folder:
        work = Path(folder)
        (work / "plan.json").write_text(json.dumps(plan))
        (work / "ids.txt").write_text("\n".join(ids) + "\n")
        manifest = work / "manifest.jsonl"
        remaining = until - time.monotonic()
        target = [sys.executable, "-m", "validation.profile_target", str(work / "plan.json"),
                  str(work / "ids.txt"), str(manifest),
                  "--deadline-unix", str(time.time() + remaining - NCU_TAIL_S),
                  "--device", device]
        argv = ncu.command(exe, metrics, target, base_units="--print-units" in helptext)
        log("ncu: " + " ".join(argv))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
        info = {"metrics": metrics, "dropped_metrics": dropped, "command": argv,
                "timed_out": False}
        with open(log_dir / "ncu.csv", "w") as out, open(log_dir / "ncu.log", "w") as err:
            try:
                subprocess.run(argv, stdout=out, stderr=err, cwd=REPO, env=env,
                               timeout=max(remaining, 30.0))
            except subprocess.TimeoutExpired:
                info["timed_out"] = True
                log("ncu: killed at the end of its time budget")
        entries = []
        if manifest.exists():
            entries = [json.loads(line) for line in manifest.read_text().splitlines()
                       if line.strip()]
    info["seconds"] = time.monotonic() - start
    output = (log_dir / "ncu.csv").read_text(errors="replace")
    try:
        launches = ncu.parse_csv(output)
    except ncu.NcuParseError as exc:
        said = ncu.first_error(output + "\n" + (log_dir / "ncu.log").read_text(errors="replace"))
        info.update(launches=0, matched={}, missing={},
                    error=str(exc) + (f"; ncu said: {said}" if said else ""))
        log(f"ncu: {info['error']}")
        return info
    matched, missing = ncu.match(launches, entries)
    info.update(launches=len(launches), matched=matched, missing=missing,
                seconds_per_launch=info["seconds"] / max(1, len(launches)))
    return info


def profiling_order(configs: list[dict]) -> list[str]:
    """Ids of ``configs`` in the order ncu profiles them: the plan's order, the near ties
    last (their time is what they are measured for; if ncu runs out of budget, they are
    the ones left without counters)."""
    return [c["id"] for c in sorted(configs, key=lambda c: c.get("role") == NEAR_TIE)]


def run(plan: dict, out_path: Path, log_dir: Path, opts: RunOptions, log=print,
        bench_fn=None) -> dict:
    """Run the whole plan; returns the summary (also written to ``log_dir/summary.json``).

    ``bench_fn`` replaces ``do_bench`` in CPU rehearsals (tests).
    """
    from validation.compile import launch_key, precompile
    from validation.records import update_run
    from validation.runner import run_timing

    t0 = time.monotonic()
    usable_until = t0 + opts.budget_s - FINISH_S
    exe = ncu.find_ncu() if opts.use_ncu else None
    env = environment.collect(ncu.version(exe) if exe else None)
    run_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)
    est = estimate(plan, opts.warmup_ms, opts.rep_ms, opts.workers, ncu=exe is not None)
    e = est["phases"]
    summary = {"run_id": run_id, "plan": plan["name"], "plan_sha256": plan["sha256"],
               "selected_by": plan["selected_by"], "options": asdict(opts),
               "estimate": est, "environment": env, "phases_s": {}, "records": str(out_path)}
    log(f"run {run_id}: {len(plan['configs'])} configs, {len(plan['peers'])} peers, "
        f"estimated {est['total_s']:.0f} s, budget {opts.budget_s:.0f} s, "
        f"ncu {'at ' + exe if exe else 'not found'}")

    if opts.device == "cuda":
        compile_budget = min(1.5 * e["compile"], 0.3 * opts.budget_s)
        summary["precompile"] = precompile(plan["configs"], opts.workers, compile_budget, log)
        log(f"precompile: {summary['precompile']['done']}/{summary['precompile']['tasks']} "
            f"tasks in {summary['precompile']['seconds']:.0f} s, "
            f"{len(summary['precompile']['failed'])} failed")
    summary["phases_s"]["compile"] = time.monotonic() - t0

    now = time.monotonic()
    a, b = e["timing"] + e["peers"], e["ncu"]
    timing_until = now + (usable_until - now) * (a / (a + b) if b else 1.0)
    timing = run_timing(plan, env, run_id, out_path, timing_until, opts.warmup_ms,
                        opts.rep_ms, log, device=opts.device, bench_fn=bench_fn)
    summary["timing"] = timing
    summary["phases_s"]["timing"] = timing["seconds"]
    clocks_after = environment.clocks()

    timed = set(timing["measured"])
    measured = profiling_order([c for c in plan["configs"] if c["id"] in timed])
    if exe is None:
        prof, default_reason = {"matched": {}, "missing": {}}, (
            "no counters: ncu was not found on this machine" if opts.use_ncu
            else "no counters: the run was asked not to use ncu")
    elif not measured:
        prof, default_reason = {"matched": {}, "missing": {}}, "not profiled: nothing timed"
    else:
        prof = _profile(plan, measured, exe, log_dir, usable_until, opts.device, log)
        default_reason = ("not profiled: " + prof["error"] if prof.get("error")
                          else "not profiled: the config was not timed")
        summary["phases_s"]["ncu"] = prof["seconds"]

    facts = summary.get("precompile", {}).get("kernel_facts", {})
    launch_key_of = {c["id"]: launch_key(c) for c in plan["configs"]}

    def finish(rec: dict) -> dict:
        ncu.attach([rec], prof["matched"], prof["missing"], default_reason)
        if rec["record_id"] in launch_key_of:  # what the GPU's own compiler made of it
            rec["kernel_facts"] = facts.get(launch_key_of[rec["record_id"]])
        rec["environment"] = dict(rec["environment"],
                                  sm_clock_mhz_after_timing=clocks_after["sm_clock_mhz"])
        return rec

    def invalid(rec: dict, exc: Exception) -> None:
        summary.setdefault("records_not_updated", {})[rec["record_id"]] = str(exc)
        log(f"counters: {rec['record_id']} kept without them, the update is not valid: {exc}")

    updated = update_run(out_path, run_id, finish, invalid) if out_path.exists() else 0
    summary["ncu"] = {k: v for k, v in prof.items() if k != "matched"}
    summary["ncu"]["configs_with_counters"] = len(prof["matched"])
    summary["records_written"] = updated
    summary["clocks_after_timing"] = clocks_after
    summary["phases_s"]["total"] = time.monotonic() - t0
    (log_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    log(f"run {run_id}: {updated} records, {len(timing['measured'])} timed, "
        f"{len(timing['failed'])} failed, {len(timing['skipped'])} skipped, "
        f"{len(prof['matched'])} with counters, {summary['phases_s']['total']:.0f} s")
    return summary
