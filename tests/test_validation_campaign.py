"""A CPU rehearsal of the whole device run: timing phase, one (fake) ncu process, counters.

The kernels run in the Triton interpreter; ``do_bench`` (CUDA only) is replaced by a
stand-in; ``ncu`` is a SYNTHETIC script on PATH that runs the profiled process as the real
one does and prints made-up counters in ncu's long CSV format for the launches the
process's manifest lists. What is checked is the plumbing: records appended, launches
matched to configs by name and order, counters attached, summary written.
"""

from __future__ import annotations

import json
import math
import sys
import textwrap

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from traces.problem import AttentionProblem  # noqa: E402
from traces.tiling import Tiling  # noqa: E402
from validation import campaign, matrix  # noqa: E402
from validation.plan_file import PLAN_SCHEMA, plan_hash  # noqa: E402
from validation.records import read_records  # noqa: E402
from validation.runner import run_timing, timed_steadily  # noqa: E402

# What every SYNTHETIC ncu of these tests answers before it profiles: its version, the
# metrics it lists and its --help.
NCU_HEAD = textwrap.dedent('''\
    #!{python}
    """SYNTHETIC ncu for tests: its answers are made up."""
    import json, subprocess, sys
    argv = sys.argv[1:]
    if "--version" in argv:
        print("NVIDIA (R) Nsight Compute Command Line Profiler\\nVersion 2099.1.0.0 (synthetic)")
        sys.exit(0)
    if "--query-metrics" in argv:
        for name in ("dram__bytes_read", "dram__bytes_write", "gpu__time_duration",
                     "lts__t_sectors_srcunit_tex_op_read", "lts__t_sector_hit_rate",
                     "lts__t_sectors_srcunit_tex_op_write", "gpc__cycles_elapsed"):
            print(name + "   synthetic description")
        sys.exit(0)
    if "--help" in argv:
        print("  --print-units   base|auto")
        sys.exit(0)
''')
# Runs the target and prints made-up counters as long CSV.
FAKE_NCU = NCU_HEAD + textwrap.dedent('''\
    metrics = argv[argv.index("--metrics") + 1].split(",")
    target = argv[argv.index("-k") + 2:]
    print("==PROF== Connected to process 1 (synthetic)")
    subprocess.run(target, check=False)
    manifest = target[5]
    print('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
          '"Section Name","Metric Name","Metric Unit","Metric Value"')
    launch = 0
    for line in open(manifest):
        entry = json.loads(line)
        if not entry.get("ok", True):
            continue
        for name in entry.get("kernels", []):
            for m in metrics:
                unit = {{"gpu": "nsecond", "gpc": "hz"}}.get(m.split("__")[0]) or (
                    "%" if m.endswith(".pct") else "byte")
                value = "1,000" if unit != "%" else "50"
                print(f'"{{launch}}","1","python","host","{{name}}","1","7",'
                      f'"Command line profiler metrics","{{m}}","{{unit}}","{{value}}"')
            launch += 1
''')


def tiny_plan() -> dict:
    shapes = [
        ("fa2", AttentionProblem(batch=1, heads=2, seq_q=64, head_dim=16, causal=True),
         [Tiling(block_m=16, block_n=16), Tiling(block_m=32, block_n=16)]),
        ("fa2", AttentionProblem(batch=1, heads=2, seq_q=32, head_dim=16, pass_="bwd"),
         [Tiling(block_m=16, block_n=16)]),
        ("decode", AttentionProblem(batch=2, heads=4, kv_heads=2, seq_q=1, seq_kv=64,
                                    head_dim=16), [Tiling(block_m=16, block_n=16, split_kv=2)]),
    ]
    configs, peers = [], []
    for schedule, p, tilings in shapes:
        shape = matrix.config_id(schedule, p, None)
        for t in tilings:
            configs.append({"id": matrix.config_id(schedule, p, t), "schedule": schedule,
                            "problem": p.to_dict(), "tiling": t.to_dict(), "shape": shape,
                            "kernels": matrix.kernel_names(schedule, p, t),
                            "compile_key": matrix.compile_key(schedule, p, t),
                            "rating": 1.0, "est_time_s": 1e-3})
    p0 = shapes[0][1]
    peers.append({"id": matrix.config_id("", p0, None, "sdpa_math"), "implementation":
                  "sdpa_math", "problem": p0.to_dict(),
                  "shape": matrix.config_id("fa2", p0, None), "est_time_s": 1e-3})
    plan = {"schema": PLAN_SCHEMA, "name": "tiny-synthetic", "selected_by": "counts",
            "configs": configs, "peers": peers, "notes": []}
    plan["sha256"] = plan_hash(plan)
    return plan


def fake_bench(fn, warmup_ms, rep_ms):
    return {"median_s": 1e-3, "p20_s": 0.995e-3, "p80_s": 1.005e-3, "method": "synthetic",
            "l2_flushed": False, "warmup_ms": warmup_ms, "rep_ms": rep_ms}


def test_rehearsal_with_fake_ncu(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    ncu = bindir / "ncu"
    ncu.write_text(FAKE_NCU.format(python=sys.executable))
    ncu.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{__import__('os').environ['PATH']}")
    plan = tiny_plan()
    out = tmp_path / "records.jsonl"
    opts = campaign.RunOptions(budget_s=300, device="cpu", workers=1)
    logs: list[str] = []
    summary = campaign.run(plan, out, tmp_path, opts, log=logs.append, bench_fn=fake_bench)
    records, errors = read_records(out)
    assert errors == []
    assert {r["record_id"] for r in records} == {c["id"] for c in plan["configs"]} | {
        p["id"] for p in plan["peers"]}
    triton = [r for r in records if r["implementation"] == "triton"]
    assert all(r["correctness"]["ok"] for r in triton), [r["correctness"] for r in triton]
    for rec in triton:
        c = rec["counters"]
        assert c is not None, rec["counters_reason"]
        n = len(rec["kernels"])
        assert c["dram_read_bytes"] == 1000 * n
        assert c["l2_read_bytes"] == 32 * 1000 * n
        assert c["duration_s"] == pytest.approx(1e-6 * n)
        assert c["sm_clock_hz"] == pytest.approx(1000)  # a rate: the kernels' mean, not their sum
        assert c["smem_bytes"] is None  # the fake listing lacks it: left out, not guessed
        assert [k["name"] for k in c["kernels"]] == rec["kernels"]
    peer = next(r for r in records if r["implementation"] == "sdpa_math")
    assert peer["counters"] is None and "peer" in peer["counters_reason"]
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["ncu"]["configs_with_counters"] == len(triton)
    assert saved["ncu"]["dropped_metrics"] == ["sm__sass_data_bytes_mem_shared.sum"]
    assert summary["records_written"] == len(records)
    assert any("left out" in line for line in logs)


# Cannot read the counters, as on a runtime that hides them.
BROKEN_NCU = NCU_HEAD + textwrap.dedent('''\
    print("==PROF== Connected to process 1 (synthetic)")
    print("==ERROR== Failed to initialize the profiler: LibraryNotLoaded")
    sys.exit(1)
''')


def test_an_ncu_that_cannot_profile_says_why_in_every_record(tmp_path, monkeypatch):
    """ncu is there but fails (as it did on one runtime of the device machines): the
    records keep their timings and say, with ncu's own error line, why no counters."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "ncu").write_text(BROKEN_NCU.format(python=sys.executable))
    (bindir / "ncu").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{__import__('os').environ['PATH']}")
    plan = tiny_plan()
    plan["configs"], plan["peers"] = plan["configs"][-1:], []  # decode only: fast
    out = tmp_path / "records.jsonl"
    logs: list[str] = []
    campaign.run(plan, out, tmp_path, campaign.RunOptions(budget_s=300, device="cpu"),
                 log=logs.append, bench_fn=fake_bench)
    (rec,) = read_records(out)[0]
    assert rec["timing"] is not None and rec["counters"] is None
    assert rec["counters_reason"].startswith("not profiled: no ncu result table")
    assert "ncu said: Failed to initialize the profiler: LibraryNotLoaded" in rec[
        "counters_reason"]
    assert any("LibraryNotLoaded" in line for line in logs)


def test_no_ncu_and_deadline(tmp_path, monkeypatch):
    plan = tiny_plan()
    plan["configs"], plan["peers"] = plan["configs"][-1:], []  # decode only: fast
    out = tmp_path / "records.jsonl"
    opts = campaign.RunOptions(budget_s=300, device="cpu", use_ncu=False)
    campaign.run(plan, out, tmp_path, opts, log=lambda m: None, bench_fn=fake_bench)
    records, _ = read_records(out)
    assert all(r["counters"] is None for r in records)
    assert {r["counters_reason"] for r in records if r["implementation"] == "triton"} == {
        "no counters: the run was asked not to use ncu"}
    late = run_timing(plan, {}, "late", tmp_path / "late.jsonl", deadline=0.0, warmup_ms=1,
                      rep_ms=1, log=lambda m: None, device="cpu", bench_fn=fake_bench)
    assert late["measured"] == [] and late["stop_reason"] == "time budget reached"
    assert len(late["skipped"]) == len(plan["configs"]) + len(plan["peers"])


def test_timing_failures_are_recorded_and_a_lost_context_stops_the_run(tmp_path):
    plan = tiny_plan()
    decode = next(c for c in plan["configs"] if c["schedule"] == "decode")
    plan["peers"] = []
    plan["configs"] = [decode, dict(decode, id=decode["id"] + "-again")]

    def flaky(fn, warmup_ms, rep_ms):
        raise RuntimeError("out of budget for a synthetic reason")

    res = run_timing(plan, {}, "r1", tmp_path / "a.jsonl", deadline=float("inf"),
                     warmup_ms=1, rep_ms=1, log=lambda m: None, device="cpu", bench_fn=flaky)
    assert res["stop_reason"] is None and len(res["failed"]) == 2
    assert all(v.startswith("timing failed: RuntimeError") for v in res["failed"].values())

    def fatal(fn, warmup_ms, rep_ms):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    res = run_timing(plan, {}, "r2", tmp_path / "b.jsonl", deadline=float("inf"),
                     warmup_ms=1, rep_ms=1, log=lambda m: None, device="cpu", bench_fn=fatal)
    assert res["stop_reason"].startswith("CUDA context lost")
    assert res["skipped"] == [decode["id"] + "-again"]
    records, errors = read_records(tmp_path / "b.jsonl")
    assert errors == [] and len(records) == 1 and records[0]["timing"] is None


def test_a_record_the_checks_refuse_is_kept_in_the_log(tmp_path):
    """A measurement the record checks refuse (here a NaN time) is not lost and does not
    stop the run: it goes, as measured, into the log."""
    plan = tiny_plan()
    decode = next(c for c in plan["configs"] if c["schedule"] == "decode")
    plan["peers"] = []
    plan["configs"] = [decode, dict(decode, id=decode["id"] + "-again")]
    calls = []

    def zero_first(fn, warmup_ms, rep_ms):
        calls.append(1)
        t = float("nan") if len(calls) == 1 else 1e-4
        return {"median_s": t, "p20_s": t, "p80_s": t}

    lines = []
    out = tmp_path / "records.jsonl"
    res = run_timing(plan, {}, "r1", out, deadline=float("inf"), warmup_ms=1, rep_ms=1,
                     log=lines.append, device="cpu", bench_fn=zero_first)
    assert res["stop_reason"] is None
    records, errors = read_records(out)
    assert errors == [] and [r["record_id"].endswith("-again") for r in records] == [True]
    logged = [line for line in lines if line.startswith("invalid record (")]
    assert len(logged) == 1 and "timing.median_s" in logged[0]
    kept = json.loads(logged[0].split(", as measured: ", 1)[1])
    assert math.isnan(kept["timing"]["median_s"]) and kept["record_id"] == decode["id"]


def _timings(*spreads_pct):
    """A bench function whose n-th call returns a timing of median 1 ms spread
    ``spreads_pct[n]`` percent around it; ``calls`` counts them."""
    calls = []

    def bench(fn, warmup_ms, rep_ms):
        half = spreads_pct[len(calls)] / 200 * 1e-3
        calls.append(1)
        return {"median_s": 1e-3 + len(calls) * 1e-6, "p20_s": 1e-3 - half,
                "p80_s": 1e-3 + half, "method": "synthetic"}

    return bench, calls


def test_a_timing_that_spreads_wide_is_taken_again():
    """Middle runs spread over 10% of the median: timed again, at most three times in all,
    and the steadiest attempt kept, every attempt listed."""
    bench, calls = _timings(4.0)
    timing = timed_steadily(None, bench, 1, 1)
    assert len(calls) == 1 and "attempts" not in timing
    bench, calls = _timings(50.0, 20.0, 5.0, 1.0)
    timing = timed_steadily(None, bench, 1, 1)
    assert len(calls) == 3 and timing["median_s"] == pytest.approx(1.003e-3)
    assert [a["p80_s"] - a["p20_s"] for a in timing["attempts"]] == pytest.approx(
        [0.5e-3, 0.2e-3, 0.05e-3])
    assert set(timing["attempts"][0]) == {"median_s", "p20_s", "p80_s"}
    bench, calls = _timings(50.0, 30.0, 40.0)
    timing = timed_steadily(None, bench, 1, 1)
    assert len(calls) == 3 and timing["median_s"] == pytest.approx(1.002e-3)
    bench, calls = _timings(50.0, 8.0, 1.0)  # steady on the second try: no third
    timing = timed_steadily(None, bench, 1, 1)
    assert len(calls) == 2 and timing["median_s"] == pytest.approx(1.002e-3)
