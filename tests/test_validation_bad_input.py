"""Bad records and bad arguments of reconcile, calibrate and validate: SYNTHETIC records.

A record whose fields have the wrong type or range (a counter list that is a string, a
negative byte count, a NaN time) is one malformed line — ``path:line: what is wrong`` —
and the other lines still load, for every reader (reconcile, calibrate, the report). A
numeric argument out of its range is one error line and exit code 2.
"""

from __future__ import annotations

import json
import math

import pytest
from synthetic_records import additive_model, counters, record

import simulator.cli as cli
import validation.predict as predict_mod
from traces.problem import AttentionProblem
from traces.tiling import Tiling
from validation import stats
from validation.records import RecordError, append_record, parse_lines, validate_record

SHAPES = [AttentionProblem(batch=1, heads=2, seq_q=n, head_dim=64) for n in (256, 512)]
BLOCKS = (32, 64, 128)


def _measured_s(problem: AttentionProblem, tiling: Tiling) -> float:
    return 1e-3 * tiling.block_m / 32 * problem.seq_q / 256


def good_records() -> list[dict]:
    return [record("fa2", p, Tiling(block_m=bm, block_n=32),
                   _measured_s(p, Tiling(block_m=bm, block_n=32)), counters(1e6, 2e6))
            for p in SHAPES for bm in BLOCKS]


def plus_ten_percent(problem, tiling, schedule, hw, compiled=None, l2_start="cold"):
    """SYNTHETIC model: every time and DRAM byte count 10% above the measurement."""
    return {"time_s": 1.1 * _measured_s(problem, tiling), "bound": "hbm", "legal": True,
            "bytes": {"global_read": 2.2e6, "global_write": 0, "dram_read": 1.1e6,
                      "dram_write": 0}}


def _with(rec: dict, path: str, value) -> dict:
    """A deep copy of ``rec`` with the field at dotted ``path`` set to ``value``."""
    rec = json.loads(json.dumps(rec))
    *parents, last = path.split(".")
    target = rec
    for key in parents:
        target = target[key]
    target[last] = value
    return rec


BAD_FIELDS = [
    ("counters.kernels", "abc", r'"counters\.kernels" must be a list of objects'),
    ("counters.kernels", ["fa2_fwd"], r'"counters\.kernels\[0\]" must be an object'),
    ("counters.kernels", [{"duration_s": 1e-4}], r'"counters\.kernels\[0\]\.name"'),
    ("counters.kernels", [{"name": "fa2_fwd", "duration_s": "x"}],
     r'"counters\.kernels\[0\]\.duration_s" must be a finite number >= 0'),
    ("counters.kernels", [{"name": "fa2_fwd", "dram_read_bytes": -1.0}],
     r'"counters\.kernels\[0\]\.dram_read_bytes"'),
    ("counters.dram_read_bytes", -5, r'"counters\.dram_read_bytes" .* got -5$'),
    ("counters.dram_read_bytes", "x", r'"counters\.dram_read_bytes" .* got \'x\''),
    ("counters.l2_write_bytes", math.inf, r'"counters\.l2_write_bytes" .* got inf'),
    ("counters.duration_s", True, r'"counters\.duration_s"'),
    ("timing.median_s", math.nan, r'"timing\.median_s" must be a finite number > 0, got nan'),
    ("timing.p20_s", -math.inf, r'"timing\.p20_s"'),
    ("timing.p80_s", math.inf, r'"timing\.p80_s"'),
    ("timing.median_s", 0, r'"timing\.median_s" must be a finite number > 0'),
    ("timing.median_s", "1e-3", r'"timing\.median_s"'),
    ("timing.tflops", math.nan, r'"timing\.tflops"'),
    ("kernel_facts", "abc", r'"kernel_facts" must be a list of objects'),
    ("kernel_facts", [{"name": "fa2_fwd", "wgmma_smem_bytes_per_flop_max": math.nan}],
     r'"kernel_facts\[0\]\.wgmma_smem_bytes_per_flop_max"'),
    ("kernel_facts", [{"name": "fa2_fwd", "mma_layouts": 64}],
     r'"kernel_facts\[0\]\.mma_layouts" must be a string or null, got'),
    ("kernel_facts", [{"name": "fa2_fwd", "loads_issued_after_compute": 1}],
     r'"kernel_facts\[0\]\.loads_issued_after_compute" must be true, false or null, got'),
    ("kernel_facts", [{"name": "fa2_fwd", "loads_in_flight": 1.5}],
     r'"kernel_facts\[0\]\.loads_in_flight" must be an integer or null, got 1\.5'),
    ("kernel_facts", [{"name": "fa2_fwd", "registers": 227.9}],
     r'"kernel_facts\[0\]\.registers" must be an integer or null, got 227\.9'),
    ("kernel_facts", [{"name": "fa2_fwd", "shared_bytes": 1.5}],
     r'"kernel_facts\[0\]\.shared_bytes" must be an integer'),
    ("kernel_facts", [{"name": "fa2_fwd", "registers": 128}, {"name": "fa2_fwd"}],
     r'"kernel_facts" lists fa2_fwd more than once'),
    ("environment.gpu_name", 5, r'"environment\.gpu_name" must be a string or null'),
    ("environment.date_utc", 5, r'"environment\.date_utc" must be a string or null'),
    ("problem", "abc", r'"problem" must be an object, got a string'),
    ("problem.causal", "no", r'"problem\.causal" must be true or false'),
    ("problem.seq_q", 256.0, r'"seq_q" must be a positive integer'),
    ("tiling", ["x"], r'"tiling" must be an object, got a list'),
    ("correctness.max_abs_error", -1.0, r'"correctness\.max_abs_error"'),
    # Fields no reader looks at may not hold NaN either: the writer could not have made it.
    ("correctness.outputs", {"o": {"max_abs_error": math.nan}},
     r'"correctness\.outputs\.o\.max_abs_error" must be a finite number, got nan'),
]


@pytest.mark.parametrize(("path", "value", "message"), BAD_FIELDS,
                         ids=[f"{p}={v!r}"[:60] for p, v, _ in BAD_FIELDS])
def test_validate_record_rejects_wrongly_typed_and_non_finite_fields(path, value, message):
    rec = good_records()[0]
    validate_record(rec)
    with pytest.raises(RecordError, match=message):
        validate_record(_with(rec, path, value))


def test_validate_record_accepts_what_ncu_and_the_compiler_write():
    rec = good_records()[0]
    per_kernel = {"name": "fa2_fwd", "dram_read_bytes": 1e6, "dram_write_bytes": 0.0,
                  "l2_read_sectors": None, "l2_write_sectors": 3, "l2_hit_rate_pct": 50.0,
                  "smem_bytes": None, "duration_s": 1e-4}
    validate_record(_with(rec, "counters.kernels", [per_kernel]))
    validate_record(_with(rec, "counters.kernels", None))
    validate_record(_with(rec, "counters.dram_read_bytes", None))  # ncu gave none
    validate_record(_with(rec, "kernel_facts", [{"name": "fa2_fwd", "shared_bytes": 49152,
                                                 "wgmma_smem_bytes_per_flop": None,
                                                 "wgmma_smem_bytes_per_flop_max": 0.25}]))
    validate_record(_with(rec, "timing.tflops", None))
    validate_record(_with(rec, "environment.gpu_name", None))


def test_json_nan_literals_are_malformed_lines_and_the_rest_loads():
    good = good_records()[:2]
    nan_line = json.dumps(_with(good[0], "timing.median_s", math.nan))
    assert "NaN" in nan_line  # what Python's json writes and reads by default
    lines = [json.dumps(good[0]), nan_line,
             json.dumps(good[1]).replace('"dram_read_bytes": 1000000.0',
                                         '"dram_read_bytes": -Infinity'),
             json.dumps(good[1])]
    assert "-Infinity" in lines[2]
    records, errors = parse_lines(lines, "f.jsonl")
    assert records == [good[0], good[1]]
    assert [str(e) for e in errors] == [
        'f.jsonl:2: "timing.median_s" must be a finite number > 0, got nan',
        'f.jsonl:3: "counters.dram_read_bytes" must be a finite number >= 0 or null, got -inf']


def test_writing_a_non_finite_record_is_a_record_error(tmp_path):
    path = tmp_path / "r.jsonl"
    with pytest.raises(RecordError, match="timing.p80_s"):
        append_record(path, _with(good_records()[0], "timing.p80_s", math.inf))
    assert not path.exists() or path.read_text() == ""


def test_stats_refuse_non_finite_measurements():
    for bad in (math.nan, math.inf, -5.0, 0.0):
        with pytest.raises(ValueError, match="finite and > 0"):
            stats.pct_errors([1.0], [bad])


def _file_with_bad_lines(tmp_path) -> tuple[str, list[int]]:
    """The good records with three malformed ones between them; the bad lines' numbers."""
    good = good_records()
    bad = [_with(good[0], "counters.kernels", "abc"),
           _with(good[1], "counters.dram_read_bytes", -5),
           _with(good[2], "timing.median_s", math.nan)]
    lines = [json.dumps(r) for r in good[:2]] + [json.dumps(r) for r in bad] + [
        json.dumps(r) for r in good[2:]]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path), [3, 4, 5]


def run_cli(argv, monkeypatch, commands=("validate", "reconcile", "calibrate")):
    # Only the commands under test: the others are built by other modules in parallel.
    monkeypatch.setattr(cli, "COMMANDS", list(commands))
    return cli.main(argv)


def test_reconcile_skips_malformed_lines_and_reports_the_rest(tmp_path, monkeypatch, capsys):
    path, bad_lines = _file_with_bad_lines(tmp_path)
    monkeypatch.setattr(predict_mod, "predict", plus_ten_percent)
    assert run_cli(["reconcile", path, "--json"], monkeypatch) == 0
    captured = capsys.readouterr()
    warnings = captured.err.strip().splitlines()
    assert [w.split(": ")[2].split(":")[1] for w in warnings] == [str(n) for n in bad_lines]
    assert all(w.startswith(f"tilesim: warning: skipped {path}:") for w in warnings)
    assert "counters.kernels" in warnings[0] and "dram_read_bytes" in warnings[1]
    assert "median_s" in warnings[2]
    report = json.loads(captured.out)
    assert report["n_records"] == 6
    overall = report["summary"]["overall"]
    assert overall["time"] == {"n": 6, "mape_pct": pytest.approx(10.0),
                               "max_pct": pytest.approx(10.0)}
    assert overall["dram"]["mape_pct"] == pytest.approx(10.0)
    assert len(report["skipped_lines"]) == 3


def test_reconcile_with_only_malformed_lines_is_one_error(tmp_path, monkeypatch, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(_with(good_records()[0], "counters.kernels", "abc")) + "\n")
    assert run_cli(["reconcile", str(path)], monkeypatch) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1  # the malformed line is named in the error, not warned about first
    assert err[0].startswith(f"tilesim: error: no valid records in {path} (1 malformed line, "
                             f"the first: {path}:1: ")


def test_calibrate_skips_malformed_lines(tmp_path, monkeypatch, capsys):
    path, bad_lines = _file_with_bad_lines(tmp_path)
    monkeypatch.setattr(predict_mod, "predict", additive_model)
    out = tmp_path / "cal.toml"
    assert run_cli(["calibrate", path, "--hardware", "h200-sxm", "--out", str(out),
                    "--max-evals", "3", "--json"], monkeypatch) == 0
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    # the malformed lines' warnings; everything else on stderr is the fit's progress
    assert sum(not line.startswith("tilesim: calibrate: ") for line in err) == len(bad_lines)
    report = json.loads(captured.out)
    assert report["n_train"] + report["n_held_out"] == 6
    assert out.is_file()


def test_report_records_skips_malformed_lines(tmp_path, monkeypatch, capsys):
    path, bad_lines = _file_with_bad_lines(tmp_path)
    out = tmp_path / "r.html"
    assert run_cli(["report", "--out", str(out), "--records", path, "--heads", "2", "--seq",
                    "256", "--json"], monkeypatch, commands=("report",)) == 0
    section = json.loads(capsys.readouterr().out)["records"]
    assert [int(e.split(":")[1]) for e in section["line_errors"]] == bad_lines
    assert len(section["rows"]) == 6
    assert all(math.isfinite(r["time_err"]) for r in section["rows"])
    assert out.is_file()


BAD_ARGUMENTS = [
    (["calibrate", "{records}", "--hardware", "h200-sxm", "--out", "{out}", "--max-evals",
      "0"], '"--max-evals" must be >= 1, got 0.'),
    (["calibrate", "{records}", "--hardware", "h200-sxm", "--out", "{out}", "--jobs", "0"],
     '"--jobs" must be >= 1, got 0.'),
    (["calibrate", "{records}", "--hardware", "h200-sxm", "--out", "{out}",
      "--max-train-records", "0"], '"--max-train-records" must be >= 1, got 0.'),
    (["calibrate", "{records}", "--hardware", "h200-sxm", "--out", "{out}",
      "--train-max-seq", "-1"], '"--train-max-seq" must be >= 1, got -1.'),
    (["calibrate", "{records}", "--hardware", "h200-sxm", "--out", "{out}", "--holdout",
      "nan"], '"--holdout" must be in (0, 1), got nan'),
    (["reconcile", "{records}", "--jobs", "0"], '"--jobs" must be >= 1, got 0.'),
    (["reconcile", "{missing}", "--jobs", "-2"], '"--jobs" must be >= 1, got -2.'),
    (["validate", "--dry-run", "--budget-s", "-5"],
     '"--budget-s" must be a finite number > 0, got -5.0.'),
    (["validate", "--dry-run", "--budget-s", "0"],
     '"--budget-s" must be a finite number > 0, got 0.0.'),
    (["validate", "--dry-run", "--budget-s", "inf"],
     '"--budget-s" must be a finite number > 0, got inf.'),
    (["validate", "--dry-run", "--warmup-ms", "-1"],
     '"--warmup-ms" must be a finite number >= 0, got -1.0.'),
    (["validate", "--dry-run", "--rep-ms", "nan"],
     '"--rep-ms" must be a finite number > 0, got nan.'),
    (["validate", "--dry-run", "--workers", "0"], '"--workers" must be >= 1, got 0.'),
    (["validate", "--out", "{out}", "--budget-s", "-1"],
     '"--budget-s" must be a finite number > 0, got -1.0.'),
]


@pytest.mark.parametrize(("argv", "message"), BAD_ARGUMENTS,
                         ids=[" ".join(a[:1] + a[-2:]) for a, _ in BAD_ARGUMENTS])
def test_out_of_range_arguments_are_one_line_exit_2(argv, message, tmp_path, monkeypatch,
                                                    capsys):
    from validation.records import write_records

    records = tmp_path / "r.jsonl"
    write_records(records, good_records())
    monkeypatch.setattr(predict_mod, "predict", plus_ten_percent)
    names = {"records": str(records), "out": str(tmp_path / "cal.toml"),
             "missing": str(tmp_path / "missing.jsonl")}
    argv = [a.format(**names) for a in argv]
    assert run_cli(argv, monkeypatch) == 2
    captured = capsys.readouterr()
    assert captured.err == f"tilesim: error: {message}\n"
    assert captured.out == ""
    assert not (tmp_path / "cal.toml").exists()


def test_validate_dry_run_accepts_a_zero_warmup(monkeypatch, capsys):
    assert run_cli(["validate", "--matrix", "quick", "--dry-run", "--json", "--warmup-ms", "0",
                    "--budget-s", "1e9"], monkeypatch) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["estimate"]["assumptions"]["warmup_ms"] == 0.0 and out["budget_s"] == 1e9


def _edit(plan: dict, what: str) -> object:
    """One change to a frozen plan, as a hand edit or a corrupt file would make it."""
    import copy

    plan = copy.deepcopy(plan)
    cfg = plan["configs"][0]
    if what == "a list":
        return [1, 2]
    if what == "no configs":
        del plan["configs"]
    elif what == "null config":
        plan["configs"][0] = None
    elif what == "problem a list":
        cfg["problem"] = []
    elif what == "no tiling":
        del cfg["tiling"]
    elif what == "no notes":
        del plan["notes"]
    elif what == "seq_kv a string":
        cfg["problem"]["seq_kv"] = "4096"
    elif what == "head_dim 1000":
        cfg["problem"]["head_dim"] = 1000
    elif what == "unknown schedule":
        cfg["schedule"] = "bogus"
    elif what == "NaN estimate":
        cfg["est_time_s"] = float("nan")
    elif what == "negative estimate":
        cfg["est_time_s"] = -1
    elif what == "edited, hash kept":
        cfg["tiling"]["num_stages"] = 3
    return plan


PLAN_EDITS = {
    "a list": "is not a plan", "no configs": '"configs" is missing',
    "null config": "configs[0] is not an object", "problem a list": "configs[0]",
    "no tiling": "configs[0]", "no notes": '"notes" is missing',
    "seq_kv a string": "seq_kv", "head_dim 1000": "head_dim",
    "unknown schedule": "schedule 'bogus'", "NaN estimate": '"est_time_s" must be',
    "negative estimate": '"est_time_s" must be', "edited, hash kept": "was edited",
}


@pytest.mark.parametrize("what", sorted(PLAN_EDITS))
def test_a_malformed_or_edited_plan_is_one_line_before_any_work(what, tmp_path, monkeypatch,
                                                                  capsys):
    """A plan is checked when it is loaded: a dry run on a plan the real run would fail
    on (on the GPU, where time is dearest) or run differently from its name is refused."""
    from validation.plan_file import load_plan

    path = tmp_path / "plan.json"
    path.write_text(json.dumps(_edit(load_plan("quick"), what)))
    assert run_cli(["validate", "--matrix", str(path), "--dry-run"], monkeypatch) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("tilesim: error: ") and err.count("\n") == 1
    assert PLAN_EDITS[what] in err


def test_extreme_errors_render_in_a_few_characters():
    """A record with an absurd but finite time (1e-300 s) gives an error of ~1e298 %: the
    tables print it in scientific notation, not as a 300-digit number."""
    from validation.report import _abs_pct, _pct

    assert _pct(12.34) == "+12.3%" and _abs_pct(12.34) == "12.3%"
    assert _pct(-3e298) == "-3.00e+298%" and _abs_pct(3e298) == "3.00e+298%"
    assert _pct(None) == _abs_pct(None) == "-"
