"""Reading run_stalls.sh folders: ncu's raw page per launch and the unit-overlap bound over
the SM's four pipes (tensor, exp, FMA and the L1 data pipe).

The fixture is built from the format ncu writes with ``--csv --page raw --print-units
base`` (seen on the H200, validation/records/raw/h200-stalls-2026-11-30): its own ``==PROF==``
lines, a header starting with "ID", a units row, one row per launch, thousands separators.
"""

from __future__ import annotations

import csv
import io
import json

import pytest
from synthetic_records import counters, record

from traces.problem import AttentionProblem
from traces.tiling import Tiling
from validation import stalls
from validation.ncu import NcuParseError
from validation.records import KERNEL_COUNTER_KEYS

COLUMNS = ["ID", "Kernel Name", stalls.DURATION, stalls.TENSOR, stalls.EXP, stalls.FMA,
           stalls.ISSUE, stalls.WARPS,
           stalls.STALL_PREFIX + "wait" + stalls.STALL_SUFFIX,
           stalls.STALL_PREFIX + "barrier" + stalls.STALL_SUFFIX, stalls.LSU, stalls.CLOCK]
UNITS = ["", "", "ns", "%", "%", "%", "%", "warp", "inst", "inst", "%", "hz"]
# (kernel, duration ns, tensor, exp, fma, lsu, SM clock Hz): math pipes summing 117, 70 and
# 110 percent; with the L1 data pipe's LSU wavefronts 147, 155 and 130
LAUNCHES = [("fa2_fwd", "642,016", 46.3, 49.2, 21.5, 30.0, 1.77e9),
            ("fa2_bwd_dkdv", "2,758,200", 40.0, 20.0, 10.0, 85.0, 1.8e9),
            ("fa2_bwd_dq", "717,300", 60.0, 40.0, 10.0, 20.0, 1.79e9)]
# The configs' tilings: the forward's 128 x 64 on 8 warps and the backward's dQ (64 rows)
# compile to wgmma on the H200; the backward's dK/dV (32 K/V rows) to mma.sync.
PLAN = {"hardware": "h200-sxm", "configs": [
    {"id": "fa2-fwd-x", "schedule": "fa2",
     "problem": {"batch": 1, "heads": 2, "seq_q": 256, "head_dim": 64},
     "tiling": {"block_m": 128, "block_n": 64, "num_warps": 8}},
    {"id": "fa2-bwd-x", "schedule": "fa2",
     "problem": {"batch": 1, "heads": 2, "seq_q": 256, "head_dim": 64, "pass": "bwd"},
     "tiling": {"block_m": 64, "block_n": 32, "num_warps": 4}}]}


def _write(folder, launches=LAUNCHES, manifest=None):
    out = io.StringIO()
    out.write("==PROF== Connected to process 1020 (/usr/bin/python3.12)\n")
    writer = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerow(UNITS)
    for i, (name, ns, t, x, f, lsu, clock) in enumerate(launches):
        writer.writerow([str(i), name, ns, f"{t:.2f}", f"{x:.2f}", f"{f:.2f}", "49.85",
                         "15.59", "1.45", "1.23", f"{lsu:.2f}", f"{clock:,.2f}"])
    out.write("==PROF== Disconnected from process 1020\n")
    (folder / "stalls.csv").write_text(out.getvalue())
    manifest = manifest or [
        {"config": "fa2-fwd-x", "role": "measure", "kernels": ["fa2_fwd"], "ok": True},
        {"config": "fa2-bwd-x", "role": "measure", "kernels": ["fa2_bwd_dkdv", "fa2_bwd_dq"],
         "ok": True}]
    (folder / "stalls_manifest.jsonl").write_text(
        "".join(json.dumps(m) + "\n" for m in manifest))
    (folder / "plan.json").write_text(json.dumps(PLAN))
    return folder


def test_launches_are_read_in_base_units_and_labelled_by_the_manifest(tmp_path):
    launches = stalls.read_folder(_write(tmp_path))
    assert [(x.config, x.kernel) for x in launches] == [
        ("fa2-fwd-x", "fa2_fwd"), ("fa2-bwd-x", "fa2_bwd_dkdv"), ("fa2-bwd-x", "fa2_bwd_dq")]
    first = launches[0]
    assert first.duration_s == pytest.approx(642.016e-6)
    assert first.pipes_pct == {"tensor": 46.3, "exp": 49.2, "fma": 21.5}
    assert first.pipes_sum_pct == pytest.approx(117.0)
    assert (first.issue_pct, first.warps) == (49.85, 15.59)
    assert first.stalls == {"wait": 1.45, "barrier": 1.23}
    assert first.lsu_pct == 30.0
    assert first.clock_hz == 1.77e9


def test_overlap_bound_is_the_share_beyond_100_percent_of_the_non_busiest_pipes(tmp_path):
    first, second, third = launches = stalls.read_folder(_write(tmp_path))
    # four pipes: the L1 data pipe's LSU wavefronts beside the math pipes
    assert first.all_pipes_pct == {"tensor": 46.3, "exp": 49.2, "fma": 21.5, "data": 30.0}
    assert first.overlap_bound() == pytest.approx((147.0 - 100.0) / (147.0 - 49.2))
    assert second.overlap_bound() == pytest.approx(55.0 / 70.0)  # the data pipe busiest
    assert third.overlap_bound() == pytest.approx(30.0 / 70.0)
    summary = stalls.overlap_summary(launches)
    assert summary["launches"] == 3 and summary["n"] == 3
    assert summary["median"] == pytest.approx(47.0 / 97.8)
    assert (summary["min"], summary["max"]) == (pytest.approx(30.0 / 70.0),
                                                pytest.approx(55.0 / 70.0))
    # where the data pipe's share is not known: the math pipes alone
    for launch in launches:
        launch.lsu_pct = None
    assert first.all_pipes_pct == first.pipes_pct
    assert first.overlap_bound() == pytest.approx((117.0 - 100.0) / (117.0 - 49.2))
    assert second.overlap_bound() is None  # 70%: the pipes may have taken turns
    assert third.overlap_bound() == pytest.approx(10.0 / 50.0)
    summary = stalls.overlap_summary(launches)
    assert summary["n"] == 2
    assert summary["median"] == pytest.approx((17.0 / 67.8 + 0.2) / 2)


def test_the_presets_unit_overlap_is_the_median_bound_of_the_h200_profiles():
    """The H200 preset's ``unit_overlap`` (0.53) is the median four-pipe bound of the stall
    profiles it cites: 72 of their 143 launches bound it, 0.047-0.816."""
    from pathlib import Path

    from simulator.hardware import load_hardware

    root = Path(__file__).parent.parent / "validation/records/raw/h200-stalls-2026-11-30"
    launches = [x for folder in sorted(root.iterdir()) for x in stalls.read_folder(folder)]
    summary = stalls.overlap_summary(launches)
    assert (summary["launches"], summary["n"]) == (143, 72)
    assert (summary["min"], summary["max"]) == (pytest.approx(0.047, abs=5e-4),
                                                pytest.approx(0.816, abs=5e-4))
    assert load_hardware("h200-sxm").unit_overlap == round(summary["median"], 2)


# Shared-memory bytes the matrix run counted for the backward's kernels: dK/dV's is 85% of
# the H200's 128 B/clk x 132 SMs at the 1.8 GHz it ran over its 2,758.2 us; dQ's 20% at
# 1.79 GHz over 717.3 us.
H200_SMEM_PER_CLOCK = 128 * 132
SMEM_BYTES = {"fa2_bwd_dkdv": 0.85 * H200_SMEM_PER_CLOCK * 1.8e9 * 2758.2e-6,
              "fa2_bwd_dq": 0.20 * H200_SMEM_PER_CLOCK * 1.79e9 * 717.3e-6}


def _records() -> list[dict]:
    """A SYNTHETIC record of the backward config with those shared-memory bytes."""
    problem = AttentionProblem.from_dict(PLAN["configs"][1]["problem"])
    rec = record("fa2", problem, Tiling.from_dict(PLAN["configs"][1]["tiling"]), 1e-3,
                 counters(1e6, 2e6))
    rec["record_id"] = "fa2-bwd-x"
    rec["counters"]["kernels"] = [dict({k: None for k in KERNEL_COUNTER_KEYS}, name=name,
                                       smem_bytes=nbytes)
                                  for name, nbytes in SMEM_BYTES.items()]
    return [rec]


def test_without_lsu_wavefronts_the_data_pipe_share_is_the_records_shared_bytes(tmp_path):
    first, second, third = launches = stalls.read_folder(_write(tmp_path))
    for launch in launches:  # profiles without the LSU wavefronts: the records' bytes
        launch.lsu_pct = None
    hw, _ = stalls.mma_sync_kernels(tmp_path / "plan.json")
    assert stalls.attach_smem(launches, _records(), hw) == 2  # the forward has no record
    assert first.smem_pct is None and first.data_pipe_pct is None
    assert second.smem_pct == pytest.approx(85.0) and third.smem_pct == pytest.approx(20.0)
    assert second.overlap_bound() == pytest.approx(55.0 / 70.0)
    assert third.overlap_bound() == pytest.approx(30.0 / 70.0)
    assert first.overlap_bound() == pytest.approx(17.0 / 67.8)  # the math pipes alone
    # a profile without the clock: shared memory at the preset's sm_clock_hz (1.98 GHz)
    second.smem_pct, second.clock_hz = None, None
    assert stalls.attach_smem([second], _records(), hw) == 1
    assert second.smem_pct == pytest.approx(85.0 * 1.8 / 1.98)


def test_the_data_pipe_share_is_its_lsu_wavefronts_where_profiled(tmp_path):
    """The L1 data pipe's LSU wavefronts count all it carries (shared memory's bytes,
    shuffles, wgmma's operand reads): where the profile has them they bound the overlap, not
    the shared bytes."""
    _, second, _ = launches = stalls.read_folder(_write(tmp_path))
    hw, _ = stalls.mma_sync_kernels(tmp_path / "plan.json")
    stalls.attach_smem(launches, _records(), hw)
    second.lsu_pct = 94.0  # dK/dV: shared bytes 85%, wavefronts 94% (its shuffles, say)
    assert second.data_pipe_pct == 94.0
    assert second.overlap_bound() == pytest.approx((164.0 - 100.0) / (164.0 - 94.0))
    second.lsu_pct = None
    assert second.data_pipe_pct == pytest.approx(85.0)


def test_issue_latency_is_the_median_cycles_per_instruction_of_free_wgmma_launches(tmp_path):
    """A warp's cycles per issued instruction are its stall reasons summed (1.45 + 1.23
    here); the summary takes the wgmma FA launches whose math pipes are below 100% together:
    of the fixture's, only dQ (110%: throughput-bound) and dK/dV (mma.sync) are left out, and
    the forward (117%) too, so none counts; at 70% the dQ would."""
    launches = stalls.read_folder(_write(tmp_path))
    assert launches[0].cycles_per_instruction == pytest.approx(1.45 + 1.23)
    _, sync = stalls.mma_sync_kernels(tmp_path / "plan.json")
    assert sync == {"fa2-fwd-x": set(), "fa2-bwd-x": {"fa2_bwd_dkdv"}}
    assert stalls.issue_latency_summary(launches, sync) == {"n": 0, "median": None}
    launches[2].pipes_pct = {"tensor": 40.0, "exp": 20.0, "fma": 10.0}
    assert stalls.issue_latency_summary(launches, sync) == {
        "n": 1, "median": pytest.approx(2.68), "min": pytest.approx(2.68),
        "max": pytest.approx(2.68)}


def test_issue_latency_on_the_h200_profiles():
    """On the H200 stall profiles: 27 wgmma FA launches not throughput-bound, their warps
    at 8.14 cycles per issued instruction (median; 4.96-10.43), the figure BENCHMARKS.md
    quotes; and for one of them, dK/dV at 64 x 64 (d = 64), the stall reasons sum to the
    warps per scheduler over the issue rate, as they should (7.9 / 4 / 0.292 = 6.8)."""
    from pathlib import Path

    root = Path(__file__).parent.parent / "validation/records/raw/h200-stalls-2026-11-30"
    launches = [x for folder in sorted(root.iterdir()) for x in stalls.read_folder(folder)]
    _, sync = stalls.mma_sync_kernels()
    summary = stalls.issue_latency_summary(launches, sync)
    assert summary["n"] == 27
    assert summary["median"] == pytest.approx(8.14, abs=0.005)
    (dkdv,) = [x for x in launches if x.kernel == "fa2_bwd_dkdv"
               and x.config == "fa2-bwd-b4-h16-q4096-k4096-d64-bf16-m64-n64-s2-w4"]
    assert dkdv.cycles_per_instruction == pytest.approx(
        dkdv.warps / 4 / (dkdv.issue_pct / 100), rel=0.05)


def test_clock_summary_splits_kernels_with_matmuls_from_the_others(tmp_path):
    launches = stalls.read_folder(_write(tmp_path))
    _, matmuls = stalls.matmul_kernels(tmp_path / "plan.json")
    assert matmuls == {"fa2-fwd-x": {"fa2_fwd": True},
                       "fa2-bwd-x": {"fa2_bwd_dkdv": False, "fa2_bwd_dq": True}}
    preprocess = stalls.Launch("fa2-bwd-x", "fa2_bwd_preprocess", 2e-5,
                               {"tensor": 0.0, "exp": 0.0, "fma": 10.0}, 20.0, 40.0,
                               clock_hz=1.96e9)
    setup = stalls.Launch("setup", "fa2_fwd", 6e-4, {"tensor": 40.0, "exp": 40.0, "fma": 20.0},
                          40.0, 8.0, clock_hz=1.5e9)
    unprofiled = stalls.Launch("fa2-fwd-x", "fa2_fwd", 6e-4, {"tensor": 40.0, "exp": 40.0,
                                                             "fma": 20.0}, 40.0, 8.0)
    summary = stalls.clock_summary([*launches, preprocess, setup, unprofiled], matmuls)
    assert summary["matmul"] == {"launches": 3, "n": 3, "median": 1.79e9, "min": 1.77e9,
                                 "max": 1.8e9}
    assert summary["other"] == {"launches": 1, "n": 1, "median": 1.96e9, "min": 1.96e9,
                                "max": 1.96e9}


def test_a_launch_the_manifest_does_not_expect_is_an_error(tmp_path):
    swapped = [LAUNCHES[1], LAUNCHES[0], LAUNCHES[2]]
    with pytest.raises(NcuParseError, match="manifest expects fa2_fwd"):
        stalls.read_folder(_write(tmp_path, launches=swapped))
    with pytest.raises(NcuParseError, match="3 profiled launches but the manifest names 1"):
        stalls.read_folder(_write(tmp_path, manifest=[
            {"config": "fa2-fwd-x", "role": "measure", "kernels": ["fa2_fwd"], "ok": True}]))


def test_cli_prints_each_launch_and_the_median_bound(tmp_path, capsys):
    folder = _write(tmp_path)
    assert stalls.main([str(folder), "--plan", str(folder / "plan.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 5 and "bound 0.48" in out[0] and "bound 0.79" in out[1]
    assert "lsu  85.0" in out[1] and "all 155.0" in out[1] and "smem" not in out[1]
    overlap = ("unit overlap: 3 of 3 launches have their pipes (the L1 data pipe's where "
               "known) summing past 100%; their overlap bounds: median 0.481 (0.429-0.786)")
    assert out[-2] == overlap
    assert out[-1] == "SM clock: kernels with matmuls 1.790 GHz (median of 3; 1.770-1.800)"
    records = tmp_path / "records.jsonl"
    records.write_text("".join(json.dumps(r) + "\n" for r in _records()))
    assert stalls.main([str(folder), "--plan", str(folder / "plan.json"),
                        "--records", str(records)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "smem  85.0" in out[1]  # the records' bytes, listed; the wavefronts bound it
    assert out[-2] == overlap


def test_cli_bad_folder_is_one_error_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "stalls.csv").write_text("not a table\n")
    assert stalls.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tilesim: stalls: ") and "no ncu raw table" in err[0]


def test_cli_bad_plan_is_one_error_line_and_exit_2(tmp_path, capsys):
    folder = _write(tmp_path)
    (folder / "plan.json").write_text(json.dumps({"configs": []}))
    (folder / "records.jsonl").write_text("")
    assert stalls.main([str(folder), "--plan", str(folder / "plan.json"),
                        "--records", str(folder / "records.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"tilesim: stalls: plan {folder / 'plan.json'}: no 'hardware' (not a "
                   "tilesim plan?)"]


def test_every_stall_id_list_names_configs_of_the_default_plan():
    """``run_stalls.sh`` profiles the configs a list names, looked up in the frozen default
    plan: a name that is not there would be profiled as nothing, on the GPU's time."""
    from pathlib import Path

    plans = Path(__file__).parent.parent / "validation/plans"
    ids = {c["id"] for c in json.loads((plans / "default.json").read_text())["configs"]}
    lists = sorted(plans.glob("stall_ids*.txt"))
    assert len(lists) >= 3
    for path in lists:
        named = path.read_text().split()
        assert named and set(named) <= ids, path.name
