"""The overheads probe (validation/overheads.py): its arithmetic, its file, its CPU rehearsal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from validation import overheads

REPO = Path(__file__).resolve().parents[1]


def _rows(call, medians_s, error=None):
    base = {"schema": overheads.SCHEMA, "call": call, "detail": {}, "dry_run": False}
    if error:
        return [dict(base, mode=None, error=error)]
    return [dict(base, mode=m, median_s=t, p20_s=t, p80_s=t, n=10)
            for m, t in medians_s.items()]


def test_summary_differences_by_hand():
    rows = (_rows("empty", {"dirty": 6e-6, "clean": 5.5e-6, "warm": 5e-6, "do_bench": 6.5e-6})
            + _rows("empty_x2", {"dirty": 9e-6, "clean": 8.5e-6, "warm": 8.25e-6})
            + _rows("read_64mb", {"dirty": 30e-6, "clean": 21e-6, "warm": 4e-6})
            + _rows("dec", {"dirty": 40e-6, "warm": 30e-6})
            + _rows("dec_split", {"dirty": 30e-6, "warm": 22e-6})
            + _rows("dec_reduce", {"dirty": 4e-6, "warm": 3e-6})
            + _rows("decode", {}, error="RuntimeError: out of memory"))
    by = {e["call"]: e for e in overheads.summary(rows)}
    assert by["empty"]["writeback_us"] == pytest.approx(0.5)
    assert by["empty"]["flush_us"] == pytest.approx(0.5)
    assert by["empty"]["do_bench_vs_dirty_us"] == pytest.approx(0.5)
    assert by["empty_x2"]["launch_gap_us"] == pytest.approx(3.25)  # 8.25 - 5.0
    assert by["empty_x2"]["do_bench_vs_dirty_us"] is None  # no do_bench row
    assert by["read_64mb"]["writeback_us"] == pytest.approx(9.0)
    assert by["read_64mb"]["flush_us"] == pytest.approx(17.0)
    assert by["decode"]["error"].startswith("RuntimeError")
    assert by["decode"]["writeback_us"] is None
    assert "launch_gap_us" not in by["empty"]
    assert by["dec"]["between_us"] == pytest.approx({"dirty": 6.0, "warm": 5.0})
    assert "between_us" not in by["dec_split"] and "between_us" not in by["empty"]
    table = overheads._format(list(by.values()))
    assert "launch gap (empty_x2 - empty, warm): 3.25 us" in table
    assert "decode" in table and "failed: RuntimeError" in table
    assert "whole - split - reduce: dirty 6.0, warm 5.0 us" in table


def test_load_names_the_bad_line(tmp_path):
    path = tmp_path / "o.jsonl"
    good = json.dumps(_rows("empty", {"warm": 5e-6})[0])
    path.write_text(good + "\n{not json\n")
    with pytest.raises(ValueError, match=r"o.jsonl:2: not JSON"):
        overheads.load(str(path))
    path.write_text(good + "\n" + json.dumps({"schema": "tilesim.record/1"}) + "\n")
    with pytest.raises(ValueError, match=r"o.jsonl:2: not a tilesim.overheads/1 row"):
        overheads.load(str(path))
    path.write_text(good + "\n\n")
    assert len(overheads.load(str(path))) == 1


def _module(args, **env):
    full = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-m", "validation.overheads", *args], cwd=REPO,
                          env=full, capture_output=True, text=True, timeout=300)


def test_summary_of_a_corrupt_file_is_one_line_and_exit_2(tmp_path):
    path = tmp_path / "o.jsonl"
    path.write_text("{oops\n")
    done = _module(["summary", str(path)])
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert "o.jsonl:1: not JSON" in done.stderr
    done = _module(["summary", str(tmp_path / "missing.jsonl")])
    assert done.returncode == 2 and "Traceback" not in done.stderr


def test_run_without_a_gpu_is_one_line_and_exit_2(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the probe would run")
    done = _module(["run", "--out", str(tmp_path / "o.jsonl")])
    assert done.returncode == 2
    assert "no CUDA GPU here" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "o.jsonl").exists()


def test_dry_run_times_every_mode_but_do_bench(tmp_path):
    """The CPU rehearsal builds and times the real calls (an empty Triton kernel, a read,
    decode's two kernels through the interpreter) at tiny sizes, one line per call and mode."""
    pytest.importorskip("torch")
    out = tmp_path / "o.jsonl"
    names = ["empty", "empty_x2", "read_16mb", "decode_k1024_n128_sp2",
             "decode_k1024_n128_sp2_split", "decode_k1024_n128_sp2_reduce"]
    done = _module(["run", "--out", str(out), "--dry-run", "--only", *names],
                   TRITON_INTERPRET="1")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = overheads.load(str(out))
    assert [(r["call"], r["mode"]) for r in rows] == [
        (n, m) for n in names for m in ("dirty", "clean", "warm")]
    for r in rows:
        assert r["dry_run"] is True and r["n"] == 3 and "error" not in r
        assert 0 < r["p20_s"] <= r["median_s"] <= r["p80_s"]
        assert r["detail"]["note"].startswith("dry run")
    summary = {e["call"]: e for e in overheads.summary(rows)}
    assert summary["empty_x2"]["launch_gap_us"] is not None
    assert isinstance(summary["decode_k1024_n128_sp2"]["writeback_us"], float)
    assert set(summary["decode_k1024_n128_sp2"]["between_us"]) == {"dirty", "clean", "warm"}


def test_probe_calls_match_the_records_they_explain():
    """The decode and FA2 calls are configs of the default matrix's records, so that their
    times can be set beside the records' (problem and tiling as the records write them)."""
    records = [json.loads(line) for line in
               (REPO / "validation/records/h200-default-2026-11-30.jsonl").open()]
    measured = {(json.dumps(r["problem"], sort_keys=True), json.dumps(r["tiling"], sort_keys=True))
                for r in records if r["implementation"] == "triton"}
    kernel_calls = [c for c in overheads.calls() if "schedule" in c.detail]
    assert len([c for c in kernel_calls if "kernel" not in c.detail]) == 4
    assert len(kernel_calls) == 8  # and two decode configs' kernels one by one
    for c in kernel_calls:
        problem = {("pass" if k == "pass_" else k): v for k, v in c.detail["problem"].items()}
        key = (json.dumps(problem, sort_keys=True), json.dumps(c.detail["tiling"],
                                                               sort_keys=True))
        assert key in measured, c.name
