"""The overheads probe's CTAs-per-SM sweep (validation/ctas_per_sm.py): that each call is
one wave of exactly c CTAs on every SM, of a kernel and tiling the records measured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.hardware import load_hardware
from simulator.sim.program import kernel_program
from traces.problem import AttentionProblem
from traces.schedules import build_schedule
from traces.tiling import Tiling
from validation import ctas_per_sm, overheads, overheads_summary
from validation.predict import compiled_resources, predict
from validation.records import read_records

REPO = Path(__file__).resolve().parents[1]
RECORDS = REPO / "validation/records/h200-default-2026-11-30.jsonl"


def _records() -> list[dict]:
    return read_records(RECORDS)[0]


def _launch(detail: dict):
    """The simulator's twin of the swept kernel: its grid and loop counts."""
    p = AttentionProblem(**detail["problem"])
    schedule = build_schedule(p, Tiling(**detail["tiling"]), detail["schedule"])
    (kernel,) = [k for k in schedule.kernels if k.name == detail["kernel"]]
    return schedule, kernel


@pytest.mark.parametrize("name,detail", ctas_per_sm.specs(), ids=lambda x: str(x)[:40])
def test_each_call_is_c_ctas_on_every_sm(name, detail):
    """The schedule of the same problem launches ``c x 132`` CTAs, each with the loop
    iterations the call's ``iterations`` says (naive_softmax: none, one row per CTA)."""
    _, kernel = _launch(detail)
    assert kernel.grid == detail["ctas_per_sm"] * ctas_per_sm.SMS, name
    expected = 0 if detail["kernel"] == "naive_softmax" else detail["iterations"]
    assert set(kernel.loop_count.tolist()) == {expected}, name


def test_the_swept_ctas_fit_on_an_sm_as_the_records_compiled_them():
    """With the registers and shared memory the device's compile gave the same kernel
    and tiling (a record's kernel_facts), an H200 SM holds at least the largest ``c`` swept,
    so the grid is one wave; and every config is a tiling some record measured."""
    hw = load_hardware("h200-sxm")
    records = _records()
    for cfg in ctas_per_sm.SWEEP:
        detail = ctas_per_sm.sweep_detail(cfg, max(cfg.ctas_per_sm))
        same = ctas_per_sm.matching_record(detail, records)
        assert same is not None, cfg
        schedule, kernel = _launch(detail)
        program = kernel_program(kernel, schedule, hw, compiled=compiled_resources(same, hw))
        assert program.residency.ctas_per_sm >= max(cfg.ctas_per_sm), cfg


def test_summary_gives_a_ctas_iteration_by_hand():
    """SYNTHETIC: 132 us warm over 264 iterations at 2 CTAs per SM is 500 ns a CTA's
    iteration, 250 the SM's."""
    detail = ctas_per_sm.sweep_detail(ctas_per_sm.SWEEP[0], 2)
    assert detail["iterations"] == 264
    rows = [{"schema": overheads.SCHEMA, "call": "sms_x", "detail": {"sweep": detail},
             "dry_run": False, "mode": "warm", "median_s": 132e-6, "p20_s": 132e-6,
             "p80_s": 132e-6, "n": 10}]
    (entry,) = overheads_summary.summary(rows)
    assert entry["per_iteration"] == pytest.approx({"per_cta_ns": 500.0, "per_sm_ns": 250.0})
    table = overheads_summary.format_table([entry])
    assert "a CTA's iteration 500 ns, the SM's 250 ns (warm)" in table


def test_dry_run_launches_each_kernel_alone_warm_only(tmp_path):
    """The CPU rehearsal builds the sweep's calls (the forward and preprocess they read run
    first, once) and times them warm only, through Triton's interpreter at tiny sizes."""
    pytest.importorskip("torch")
    out = tmp_path / "o.jsonl"
    names = ["sms_dkdv_d64_m16_n64_s2_w4_c1", "sms_dq_d64_m32_n32_s2_w4_c1",
             "sms_fwd_d64_m128_n64_s3_w8_c1", "sms_softmax_d64_m64_n64_s2_w4_causal_c1"]
    done = subprocess.run([sys.executable, "-m", "validation.overheads", "run", "--out",
                           str(out), "--dry-run", "--only", *names], cwd=REPO,
                          env=dict(os.environ, TRITON_INTERPRET="1"), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = overheads_summary.load(str(out))
    assert [(r["call"], r["mode"]) for r in rows] == [(n, "warm") for n in names]
    assert all("error" not in r and r["median_s"] > 0 for r in rows)
    for entry in overheads_summary.summary(rows):
        assert entry["per_iteration"]["per_cta_ns"] > 0


def test_compare_sets_the_models_launch_beside_the_measured_one(tmp_path, capsys):
    """SYNTHETIC timing (400 us) of the mma.sync dK/dV control at one CTA per SM: compare
    predicts the same launch with the compile of a record of that tiling and divides the
    kernel's time (the launch in it) by the CTAs' 66 iterations; dry-run rows are left out."""
    cfg = next(c for c in ctas_per_sm.SWEEP if c.kernel == "fa2_bwd_dkdv" and c.block_m == 32)
    detail = ctas_per_sm.sweep_detail(cfg, 1)
    name = ctas_per_sm.call_name(cfg, 1)
    row = {"schema": overheads.SCHEMA, "call": name, "detail": {"sweep": detail},
           "dry_run": False, "mode": "warm", "median_s": 400e-6, "p20_s": 400e-6,
           "p80_s": 400e-6, "n": 10}
    rehearsal = dict(row, call=name + "_dry", dry_run=True)
    path = tmp_path / "o.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (row, rehearsal)))
    assert overheads.main(["compare", str(path), "--records", str(RECORDS), "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)
    hw = load_hardware("h200-sxm")
    record = ctas_per_sm.matching_record(detail, _records())
    assert record["tiling"] == detail["tiling"] and entry["compiled_from"] == record["record_id"]
    pred = predict(AttentionProblem(**detail["problem"]), Tiling(**detail["tiling"]), "fa2",
                   hw, compiled=compiled_resources(record, hw))
    (kernel,) = [k for k in pred["kernels"] if k["name"] == "fa2_bwd_dkdv"]
    assert detail["iterations"] == 66
    assert entry["measured_per_cta_ns"] == pytest.approx(400e3 / 66)
    assert entry["predicted_per_cta_ns"] == pytest.approx(kernel["time_s"] * 1e9 / 66)
    assert entry["error_pct"] == pytest.approx(
        100 * (entry["predicted_per_cta_ns"] / entry["measured_per_cta_ns"] - 1))
    assert overheads.main(["compare", str(path), "--records", str(RECORDS)]) == 0
    assert name in capsys.readouterr().out
    # Without a probe file: the model's predictions of every call, none measured.
    assert overheads.main(["compare", "--records", str(RECORDS), "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert [t["call"] for t in table] == [n for n, _ in ctas_per_sm.specs()]
    assert all(t["measured_per_cta_ns"] is None and t["error_pct"] is None
               and t["predicted_per_cta_ns"] > 0 and t["compiled_from"] for t in table)
    (same,) = [t for t in table if t["call"] == name]
    assert same["predicted_per_cta_ns"] == pytest.approx(entry["predicted_per_cta_ns"])
    assert overheads.main(["compare", str(path), "--records", str(RECORDS),
                           "--hardware", "no-such-gpu"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
