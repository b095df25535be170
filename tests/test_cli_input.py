"""Bad input: one clear line on stderr, exit code 2, no traceback, for each case."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from simulator.cli import main

REPO = Path(__file__).resolve().parents[1]

BAD = {
    "unknown hardware": (["count", "--hardware", "tpu-v9"], "unknown hardware"),
    "block not a power of two": (["count", "--block-m", "48"], "power of two"),
    "block below 16": (["count", "--block-n", "8"], "power of two >= 16"),
    "head dim too large": (["count", "--head-dim", "512"], "head_dim"),
    "head dim too small": (["count", "--head-dim", "8"], "head_dim"),
    "kv heads not dividing": (["count", "--heads", "6", "--kv-heads", "4"], "must divide"),
    "seq zero": (["count", "--seq", "0"], "positive integer"),
    "seq negative": (["count", "--seq", "-5"], "positive integer"),
    "kv seq zero": (["count", "--kv-seq", "0"], "positive integer"),
    "batch zero": (["count", "--batch", "0"], "positive integer"),
    "fa1 backward": (["count", "--schedule", "fa1", "--pass", "bwd"], "forward pass only"),
    "decode long query": (["count", "--schedule", "decode", "--seq", "64"], "short queries"),
    "split on fa2": (["count", "--split-kv", "4"], "decode schedule only"),
    "split too large": (["count", "--schedule", "decode", "--seq", "1", "--kv-seq", "128",
                         "--block-n", "64", "--split-kv", "3"], "exceeds"),
    "seq not a number": (["count", "--seq", "abc"], "invalid int"),
    "unknown dtype": (["count", "--dtype", "fp64"], "invalid choice"),
    "sweep top negative": (["sweep", "--top", "-3"], '"--top" must be >= 1'),
    "sweep no workers": (["sweep", "--jobs", "0"], '"--jobs" must be >= 1'),
    "sweep fa1 backward": (["sweep", "--schedule", "fa1", "--pass", "bwd"],
                           'error: schedule "fa1" has a forward pass only'),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_exit_2_one_line(case, capsys):
    argv, needle = BAD[case]
    with pytest.raises(SystemExit) if "invalid" in needle else _nothing() as exc:
        rc = main(argv)
    if exc is not None and hasattr(exc, "value"):
        rc = exc.value.code
    out, err = capsys.readouterr()
    assert rc == 2
    assert out == ""
    assert err.startswith("tilesim: error: ") and err.count("\n") == 1
    assert needle in err


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def test_illegal_tiling_still_counts(capsys):
    rc = main(["count", "--block-m", "256", "--block-n", "256", "--stages", "4", "--json"])
    out, _ = capsys.readouterr()
    assert rc == 0 and '"legal": false' in out


def test_console_script_entry_point_bad_input():
    proc = subprocess.run([sys.executable, "-m", "simulator", "count", "--seq", "0"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_a_problem_too_large_for_memory_is_one_line(capsys, monkeypatch):
    """A grid whose work arrays do not fit (say B=1000, N=10^8: 25 G CTAs) fails to allocate;
    the allocation failure is simulated here so that no machine is asked for 186 GiB."""
    import simulator.prediction

    def too_large(*_args, **_kwargs):
        raise MemoryError("Unable to allocate 186. GiB for an array")

    monkeypatch.setattr(simulator.prediction, "count_prediction", too_large)
    assert main(["count", "--seq", "100000000", "--batch", "1000"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("tilesim: error: out of memory") and "too large" in err


OUTPUT_PATHS = {
    "sweep --plot": ["sweep", "--seq", "256", "--heads", "1", "--plot", "/nonexistent/s.png"],
    "simulate --timeline": ["simulate", "--seq", "256", "--heads", "1", "--timeline",
                            "/nonexistent/t.json"],
    "trace --out": ["trace", "--seq", "256", "--heads", "1", "--out", "/nonexistent/t.parquet"],
    "reconcile --save": ["reconcile", "RECORDS", "--save", "/nonexistent/r.json"],
    "reconcile --plot": ["reconcile", "RECORDS", "--plot", "/nonexistent/r.png"],
    "roofline --plot": ["roofline", "--seq", "256", "--heads", "1", "--plot",
                        "/nonexistent/r.png"],
    "calibrate --out": ["calibrate", "RECORDS", "--hardware", "h200-sxm", "--out",
                        "/nonexistent/c.toml"],
}


@pytest.mark.parametrize("case", sorted(OUTPUT_PATHS))
def test_an_unwritable_output_fails_before_the_work(case, tmp_path, capsys, monkeypatch):
    """A mistyped output directory is reported at once, not after minutes of simulation."""
    from synthetic_records import counters, record

    import simulator.sim
    import validation.reconcile
    from traces.problem import AttentionProblem
    from traces.tiling import Tiling
    from validation.records import write_records

    def no_work(*_args, **_kwargs):
        raise AssertionError("the work ran before the output path was checked")

    monkeypatch.setattr(simulator.sim, "predict", no_work)
    monkeypatch.setattr(simulator.sim, "run", no_work)
    monkeypatch.setattr(validation.reconcile, "reconcile", no_work)
    records = tmp_path / "records.jsonl"
    write_records(records, [record("fa2", AttentionProblem(1, 2, 256, 64), Tiling(64, 32),
                                   1e-4, counters(1e6, 2e6))])
    argv = [str(records) if a == "RECORDS" else a for a in OUTPUT_PATHS[case]]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1
    assert err.startswith("tilesim: error: cannot write /nonexistent/")
    assert "does not exist" in err
    # A plot path whose suffix names no image format is refused as early.
    if "--plot" in argv:
        argv[argv.index("--plot") + 1] = str(tmp_path / "plot.txt")
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "must end in .png or .svg" in err
        assert not (tmp_path / "plot.txt").exists()


def test_written_files_follow_the_umask(tmp_path, capsys):
    """Atomic writes go through a private temporary file; the file they leave has the
    permissions a plain ``open()`` would give it (0o644 under umask 022), not 0o600."""
    import os

    old = os.umask(0o022)
    try:
        assert main(["trace", "--seq", "256", "--heads", "1", "--head-dim", "64",
                     "--out", str(tmp_path / "t.parquet")]) == 0
    finally:
        os.umask(old)
    assert (tmp_path / "t.parquet").stat().st_mode & 0o777 == 0o644
