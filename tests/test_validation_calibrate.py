"""Calibration recovers a known parameter set from SYNTHETIC records, split by shape."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path

import pytest
from synthetic_records import additive_model, record

import simulator.cli as cli
import validation.calibrate as calibrate_mod
import validation.predict as predict_mod
from simulator.hardware import load_hardware
from traces.problem import AttentionProblem, ProblemError
from traces.tiling import Tiling
from validation.calibrate import (
    DIFF_STEP,
    PARAMS,
    Param,
    fit,
    jacobian_steps,
    split_by_shape,
    subsample,
)
from validation.records import group_key, shape_key, write_records

TRUE = {"hbm_efficiency": 0.7, "l2_efficiency": 0.6, "tensor_efficiency": 0.5,
        "kernel_launch_overhead_s": 5e-6}
# Evaluations the fits below may take. The additive stand-in is ill-conditioned (its terms
# are nearly collinear over these shapes) and least squares takes about 1,600 evaluations,
# each cheap; the simulator's bounds separate its parameters (benchmarks/
# calibrate_recovery.py: 93 evaluations of 45 configs).
FULL_FIT = 3000


def true_hardware():
    base = load_hardware("h200-sxm")
    return dataclasses.replace(base, **TRUE)


def synthetic_records() -> list[dict]:
    """Shapes across schedules and sizes, three tilings each, 'measured' by the true model."""
    hw, recs = true_hardware(), []
    shapes = []
    for n in (256, 512, 1024, 2048):
        for d in (64, 128):
            shapes.append(("fa2", AttentionProblem(batch=1, heads=4, seq_q=n, head_dim=d)))
            shapes.append(("naive", AttentionProblem(batch=1, heads=4, seq_q=n, head_dim=d)))
        shapes.append(("decode", AttentionProblem(batch=4, heads=8, kv_heads=2, seq_q=1,
                                                  seq_kv=n * 4, head_dim=64)))
    for schedule, p in shapes:
        if schedule == "decode":
            tilings = [Tiling(block_m=16, block_n=64, split_kv=s) for s in (1, 2, 4)]
        else:
            tilings = [Tiling(block_m=bm, block_n=32) for bm in (32, 64, 128)]
        for t in tilings:
            recs.append(record(schedule, p, t, additive_model(p, t, schedule, hw)["time_s"]))
    return recs


def run_calibrate_cli(tmp_path, monkeypatch, out_name: str,
                      *options: str) -> tuple[int, Path, Path]:
    """``tilesim calibrate`` on the synthetic records with the additive stand-in as the
    model; (exit code, the records file, the --out path)."""
    path = tmp_path / "synthetic.jsonl"
    write_records(path, synthetic_records())
    monkeypatch.setattr(predict_mod, "predict", additive_model)
    monkeypatch.setattr(cli, "COMMANDS", ["validate", "reconcile", "calibrate"])
    out = tmp_path / out_name
    # --jobs 1: the stand-in model is patched into this process
    code = cli.main(["calibrate", str(path), "--hardware", "h200-sxm", "--out", str(out),
                     "--jobs", "1", *options])
    return code, path, out


def test_split_is_by_shape_and_per_group():
    recs = synthetic_records()
    train, held = split_by_shape(recs, 0.25, seed=0)
    assert train and held and not train & held
    assert {shape_key(r) for r in recs} == train | held
    for group in ("fa2 fwd", "naive fwd", "decode fwd"):
        assert any(s.startswith(group) for s in held)
        assert any(s.startswith(group) for s in train)
    assert split_by_shape(recs, 0.25, seed=0) == (train, held)  # deterministic
    assert split_by_shape(recs, 0.25, seed=1) != (train, held)


def test_fit_recovers_known_parameters_and_never_fits_held_out():
    recs = synthetic_records()
    base = load_hardware("h200-sxm")
    _, held = split_by_shape(recs, 0.25, seed=0)
    held_problems = {json.dumps([r["schedule"], r["problem"], r["tiling"]], sort_keys=True)
                     for r in recs if shape_key(r) in held}
    seen_held: list = []

    def spy(problem, tiling, schedule, hw, compiled=None, l2_start="cold"):
        key = json.dumps([schedule, problem.to_dict(), tiling.to_dict()], sort_keys=True)
        if key in held_problems:
            seen_held.append(hw)
        return additive_model(problem, tiling, schedule, hw)

    report = fit(recs, base, spy, holdout_fraction=0.25, seed=0, max_evals=FULL_FIT)
    fitted = {p["field"]: p["fitted"] for p in report["params"]}
    for field, value in TRUE.items():
        assert fitted[field] == pytest.approx(value, rel=1e-3), field
    assert "exp_ops_per_s" not in fitted  # the hardware's rate (validation.calibrate)
    assert report["held_out"]["after"]["mape_pct"] < 0.1
    assert report["held_out"]["before"]["mape_pct"] > 5
    assert report["n_held_out"] > 0 and report["n_train"] > report["n_held_out"]
    # held-out configs were predicted only to report: with the base and the final preset
    assert {id(hw) for hw in seen_held} <= {id(base), id(report["hardware"])}
    assert len(seen_held) == 2 * report["n_held_out"]


def test_fit_needs_times_and_two_shapes():
    recs = synthetic_records()
    base = load_hardware("h200-sxm")
    with pytest.raises(ProblemError, match="simulator"):
        fit(recs, base, lambda *a, **k: {"time_s": None})
    one_shape = [r for r in recs if shape_key(r) == shape_key(recs[0])]
    with pytest.raises(ProblemError, match="two shapes"):
        fit(one_shape, base, additive_model)


def test_cli_writes_a_loadable_preset_with_provenance(tmp_path, monkeypatch, capsys):
    code, path, out = run_calibrate_cli(tmp_path, monkeypatch, "h200-calibrated.toml",
                                        "--max-evals", str(FULL_FIT))
    assert code == 0
    assert "held-out" in capsys.readouterr().out
    hw = load_hardware(out)
    assert hw.name == "h200-calibrated"
    assert hw.hbm_efficiency == pytest.approx(0.7, rel=1e-3)
    text = out.read_text()
    assert "fitted by tilesim calibrate from records:" in text
    assert str(path) in text and "sha256:" in text
    assert "Held-out shapes (never fitted on)" in text and "Held-out time MAPE" in text
    assert text.count("# fitted by tilesim calibrate (base") == len(PARAMS)
    assert hw.display_name == "NVIDIA H200 SXM 141GB (calibrated)"
    # refitted from the fit: one more header of provenance, the label still said once
    again = tmp_path / "again.toml"
    assert cli.main(["calibrate", str(path), "--hardware", str(out), "--out", str(again),
                     "--max-evals", "2", "--jobs", "1"]) == 0
    assert load_hardware(again).display_name == "NVIDIA H200 SXM 141GB (calibrated)"
    assert again.read_text().count("fitted by tilesim calibrate from records:") == 2
    assert cli.main(["calibrate", str(path), "--hardware", "h200-sxm", "--out",
                     str(tmp_path / "x.txt")]) == 2


def test_subsample_is_balanced_and_parallel_fit_agrees():
    recs = synthetic_records()
    few = subsample(recs, 9, seed=0)
    assert len(few) == 9 and subsample(recs, 9, seed=0) == few
    assert {group_key(r) for r in few} == {"fa2 fwd", "naive fwd", "decode fwd"}
    assert subsample(recs, None) is recs
    base = load_hardware("h200-sxm")
    report = fit(recs, base, additive_model, jobs=2, max_train_records=24, max_evals=FULL_FIT)
    assert report["n_train"] == 24
    fitted = {p["field"]: p["fitted"] for p in report["params"]}
    assert fitted["hbm_efficiency"] == pytest.approx(TRUE["hbm_efficiency"], rel=1e-3)
    assert report["held_out"]["after"]["mape_pct"] < 0.1


def test_train_max_seq_fits_short_shapes_and_holds_out_every_length():
    recs = synthetic_records()
    base = load_hardware("h200-sxm")
    _, held = split_by_shape(recs, 0.25, seed=0)
    simulated: list[int] = []

    def spy(problem, tiling, schedule, hw, compiled=None, l2_start="cold"):
        simulated.append(max(problem.seq_q, problem.seq_kv))
        return additive_model(problem, tiling, schedule, hw)

    report = fit(recs, base, spy, train_max_seq=1024, max_evals=FULL_FIT)
    assert report["train_max_seq"] == 1024
    lengths = {shape_key(r): max(r["problem"]["seq_q"], r["problem"]["seq_kv"]) for r in recs}
    assert report["train_shapes"] and all(lengths[s] <= 1024 for s in report["train_shapes"])
    assert report["unused_train_shapes"]
    assert all(lengths[s] > 1024 for s in report["unused_train_shapes"])
    # the split is the unfiltered one: held-out shapes of every length, never fitted on
    assert set(report["held_out_shapes"]) == held
    assert max(lengths[s] for s in held) > 1024
    assert not set(report["train_shapes"]) & held
    unused = set(report["unused_train_shapes"])
    assert report["n_held_out"] == sum(shape_key(r) in held for r in recs)
    assert report["n_train"] == sum(shape_key(r) in set(report["train_shapes"]) for r in recs)
    # long training shapes are never simulated: only held-out records exceed the limit
    long_held = sum(lengths[shape_key(r)] > 1024 for r in recs if shape_key(r) in held)
    assert sum(n > 1024 for n in simulated) == 2 * long_held
    assert not unused & held
    fitted = {p["field"]: p["fitted"] for p in report["params"]}
    assert fitted["hbm_efficiency"] == pytest.approx(TRUE["hbm_efficiency"], rel=1e-3)
    with pytest.raises(ProblemError, match="train-max-seq"):
        fit(recs, base, additive_model, train_max_seq=16)


def test_max_evals_counts_every_simulation_and_keeps_the_best_point():
    """--max-evals caps the simulations of the training records, the finite-difference
    Jacobian's included (least_squares' own count leaves those out: a cap of 200 let the
    fit run about 1,400); a fit stopped by it keeps the best point it evaluated."""
    recs = synthetic_records()
    base = load_hardware("h200-sxm")
    calls = []

    def counting(problem, tiling, schedule, hw, compiled=None, l2_start="cold"):
        calls.append(hw)
        return additive_model(problem, tiling, schedule, hw)

    report = fit(recs, base, counting, max_evals=20)
    n_train, n_held = report["n_train"], report["n_held_out"]
    assert report["evaluations"] == 20 and not report["converged"]
    assert "--max-evals" in report["message"]
    # 20 evaluations of the fit (the first: the base, which "before" reports), held-out
    # before and after; the base's held-out records come before the fit starts
    assert len(calls) == 20 * n_train + 2 * n_held
    fitted = report["hardware"]
    start = n_train + n_held
    fitted_hws = [base] + calls[start:start + 19 * n_train:n_train]
    assert all(hw is base for hw in calls[:start])
    costs = [sum(math.log(additive_model(AttentionProblem.from_dict(r["problem"]),
                                         Tiling.from_dict(r["tiling"]), r["schedule"],
                                         hw)["time_s"] / r["timing"]["median_s"]) ** 2
                 for r in recs if shape_key(r) in set(report["train_shapes"]))
             for hw in fitted_hws]
    assert fitted in fitted_hws and costs[fitted_hws.index(fitted)] == min(costs)
    assert report["train"]["after"]["mape_pct"] < report["train"]["before"]["mape_pct"]


def test_calibrated_preset_says_what_the_fit_left_out(tmp_path, monkeypatch):
    code, _, out = run_calibrate_cli(tmp_path, monkeypatch, "short.toml", "--train-max-seq",
                                     "1024", "--max-train-records", "10")
    assert code == 0
    header = out.read_text().split("\nname =")[0]
    assert "training shapes up to N = 1024" in header
    assert "at most 10 training records" in header and "training shapes left out" in header


def test_a_fit_on_filled_loop_facts_says_so_and_with_which_triton(tmp_path, monkeypatch):
    """``--fill-loop-facts`` fits on the records as ``fill_loop_facts`` returns them (here a
    stand-in that marks them) and the header names the records filled and both Tritons;
    without the option, where the table serves none (as it serves no synthetic record),
    the header says nothing of it."""
    import validation.fill_facts as fill_facts

    fitted_on: list = []

    def marking(records, progress=None, served=None, compile_here=True):
        if not compile_here:
            return list(records), 0
        out = [dict(r, marked=True) for r in records]
        return out, len(out)

    monkeypatch.setattr(fill_facts, "fill_loop_facts", marking)
    monkeypatch.setattr(fill_facts, "compilers",
                        lambda records: {"here": "9.9.9", "device": ["3.6.0"], "same": False})
    real_fit = calibrate_mod.fit

    def recording_fit(records, *args, **kwargs):
        fitted_on.extend(records)
        return real_fit(records, *args, **kwargs)

    monkeypatch.setattr(calibrate_mod, "fit", recording_fit)
    code, path, out = run_calibrate_cli(tmp_path, monkeypatch, "filled.toml", "--max-evals",
                                        "2", "--fill-loop-facts")
    assert code == 0 and fitted_on and all(r.get("marked") for r in fitted_on)
    header = out.read_text().split("\nname =")[0]
    n = len(synthetic_records())
    assert (f"# Loop facts: {n} records took their kernels' main-loop facts from a compile "
            "with Triton 9.9.9 (the device ran 3.6.0)") in header
    code, _, plain = run_calibrate_cli(tmp_path, monkeypatch, "plain.toml", "--max-evals", "2")
    assert code == 0 and "Loop facts" not in plain.read_text()
    fitted_on.clear()
    code, _, recorded = run_calibrate_cli(tmp_path, monkeypatch, "recorded.toml",
                                          "--max-evals", "2", "--as-recorded")
    assert code == 0 and fitted_on and not any(r.get("marked") for r in fitted_on)
    assert ("# Loop facts: as the records carry them (--as-recorded); reconcile with "
            "--as-recorded to predict as the fit did.") in recorded.read_text()


def test_records_the_model_refuses_are_left_out_before_the_fit(tmp_path, monkeypatch,
                                                                capsys):
    """A refused record (here: one held-out, one training) is listed and warned about before
    the first evaluation of the fit, not found after it (the held-out records used to be
    predicted only once the fit, hours with real records, was over)."""
    recs = synthetic_records()
    train_shapes, held_shapes = split_by_shape(recs, 0.25, seed=0)
    bad = {next(r["record_id"] for r in recs if shape_key(r) in held_shapes),
           next(r["record_id"] for r in recs if shape_key(r) in train_shapes)}
    bad_configs = {json.dumps([r["schedule"], r["problem"], r["tiling"]], sort_keys=True)
                   for r in recs if r["record_id"] in bad}
    events = []

    def refusing(problem, tiling, schedule, hw, compiled=None, l2_start="cold"):
        key = json.dumps([schedule, problem.to_dict(), tiling.to_dict()], sort_keys=True)
        if key in bad_configs:
            raise ProblemError("tiling does not fit (planted)")
        events.append("predict")
        return additive_model(problem, tiling, schedule, hw)

    base = load_hardware("h200-sxm")
    report = fit(recs, base, refusing, max_evals=5, warn=events.append)
    assert {r["record_id"] for r in report["refused"]} == bad
    assert all(r["reason"] == "tiling does not fit (planted)" for r in report["refused"])
    # warned before the fit's evaluations: only the base predictions come first
    predicted_at_base = report["n_train"] + report["n_held_out"]
    assert predicted_at_base + 2 == len(recs)
    warned = [i for i, e in enumerate(events) if e.startswith("left out record")]
    assert warned == [predicted_at_base, predicted_at_base + 1]
    assert len(events) > predicted_at_base + 2  # the fit's evaluations followed
    # the CLI warns on stderr and says so in the preset's header
    path = tmp_path / "synthetic.jsonl"
    write_records(path, recs)
    monkeypatch.setattr(predict_mod, "predict", refusing)
    monkeypatch.setattr(cli, "COMMANDS", ["validate", "reconcile", "calibrate"])
    out = tmp_path / "refused.toml"
    assert cli.main(["calibrate", str(path), "--hardware", "h200-sxm", "--out", str(out),
                     "--max-evals", "5", "--jobs", "1"]) == 0
    err = capsys.readouterr().err
    assert err.count("tilesim: warning: left out record") == 2
    assert "2 records the model refuses left out" in out.read_text().split("\nname =")[0]


def test_a_fit_with_every_held_out_record_refused_stops_at_once():
    recs = synthetic_records()
    _, held_shapes = split_by_shape(recs, 0.25, seed=0)
    calls = []

    def refuse_held(problem, tiling, schedule, hw, compiled=None, l2_start="cold"):
        calls.append(1)
        rec_shape = [shape_key(r) for r in recs
                     if r["problem"] == problem.to_dict() and r["schedule"] == schedule][0]
        if rec_shape in held_shapes:
            raise ProblemError("planted")
        return additive_model(problem, tiling, schedule, hw)

    with pytest.raises(ProblemError, match="refuses every held-out record"):
        fit(recs, load_hardware("h200-sxm"), refuse_held, max_evals=FULL_FIT)
    assert len(calls) == len(recs)  # the base predictions only, no evaluation of the fit


def test_jacobian_steps_are_one_percent_of_at_least_one_and_stay_in_bounds():
    params = [Param("a", 0.0, 5.0), Param("b", 0.2, 1.0), Param("c", 0.25, 4.0)]
    assert jacobian_steps([0.0, 0.5, 2.0], params) == pytest.approx([0.01, 0.01, 0.02])
    assert jacobian_steps([5.0, 1.0, 3.99], params) == pytest.approx([-0.05, -0.01, -0.0399])


def test_the_fit_steps_off_a_zero_parameter_by_a_visible_amount():
    """The per-iteration overhead starts at 0 on the presets; least squares' relative
    ``diff_step`` stepped it by about 1e-14 s there, which moves no simulated time."""
    recs = synthetic_records()
    base = load_hardware("h200-sxm")
    assert base.iteration_overhead_s == 0
    seen = []

    def spy(problem, tiling, schedule, hw, compiled=None, l2_start="cold"):
        seen.append(hw.iteration_overhead_s)
        return additive_model(problem, tiling, schedule, hw)

    fit(recs, base, spy, max_evals=len(PARAMS) + 2)  # the start, its Jacobian's points, one
    assert any(v == pytest.approx(DIFF_STEP * 1e-6, rel=1e-9) for v in seen)


def test_the_cli_says_how_the_fit_goes_on_stderr(tmp_path, monkeypatch, capsys):
    """A fit takes about an hour on real records: the CLI says when it starts, each
    evaluation with its training error and the best so far, and when it is done."""
    code, _, _ = run_calibrate_cli(tmp_path, monkeypatch, "progress.toml", "--max-evals",
                                   "12", "--json")
    assert code == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    lines = captured.err.strip().splitlines()
    assert all(line.startswith("tilesim: calibrate: ") for line in lines)
    assert lines[0].startswith(f"tilesim: calibrate: fitting {len(PARAMS)} parameters to "
                               f"{report['n_train']} training records")
    evaluations = [line for line in lines if ": evaluation " in line]
    # the first evaluation is the base's prediction, made before the fit
    assert len(evaluations) == report["evaluations"] - 1 == 11
    assert evaluations[0].startswith("tilesim: calibrate: evaluation 2 of at most 12: ")
    best = [float(line.split("best so far ")[1].rstrip("%)")) for line in evaluations]
    assert best == sorted(best, reverse=True)  # the best so far never gets worse
    assert lines[-1] == ("tilesim: calibrate: fit done (stopped after 12 evaluations "
                         f"(--max-evals)); predicting the {report['n_held_out']} held-out "
                         "records")


def test_a_config_measured_twice_counts_once_with_its_latest_record():
    """A later run of the same plan repeats configs: the fit sees each config once, as
    reconcile does, with the later measurement (here 1.5 times the earlier)."""
    base = load_hardware("h200-sxm")
    earlier = synthetic_records()
    later = copy.deepcopy(earlier)
    for rec in later:
        rec["environment"]["date_utc"] = "2001-01-01T00:00:00Z"
        rec["timing"]["median_s"] *= 1.5
    both = fit(earlier + later, base, additive_model, max_evals=2)
    alone = fit(later, base, additive_model, max_evals=2)
    assert both["n_train"] + both["n_held_out"] == len(later)
    assert (both["n_train"], both["n_held_out"]) == (alone["n_train"], alone["n_held_out"])
    assert both["train"]["before"] == alone["train"]["before"]
    assert both["held_out"]["before"] == alone["held_out"]["before"]
