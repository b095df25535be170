"""Reading run_stalls.sh folders: ncu's raw page per launch, and the unit-overlap bound.

The fixture is built from the format ncu writes with ``--csv --page raw --print-units
base`` (seen on the H200, validation/records/raw/h200-stalls-2026-11-30): its own ``==PROF==``
lines, a header starting with "ID", a units row, one row per launch, thousands separators.
"""

from __future__ import annotations

import csv
import io
import json

import pytest

from validation import stalls
from validation.ncu import NcuParseError

COLUMNS = ["ID", "Kernel Name", stalls.DURATION, stalls.TENSOR, stalls.EXP, stalls.FMA,
           stalls.ISSUE, stalls.WARPS,
           stalls.STALL_PREFIX + "wait" + stalls.STALL_SUFFIX,
           stalls.STALL_PREFIX + "barrier" + stalls.STALL_SUFFIX]
UNITS = ["", "", "ns", "%", "%", "%", "%", "warp", "inst", "inst"]
# (kernel, duration ns, tensor, exp, fma): sums 117, 70 and 110 percent
LAUNCHES = [("fa2_fwd", "642,016", 46.3, 49.2, 21.5),
            ("fa2_bwd_dkdv", "2,758,200", 40.0, 20.0, 10.0),
            ("fa2_bwd_dq", "717,300", 60.0, 40.0, 10.0)]


def _write(folder, launches=LAUNCHES, manifest=None):
    out = io.StringIO()
    out.write("==PROF== Connected to process 1020 (/usr/bin/python3.12)\n")
    writer = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerow(UNITS)
    for i, (name, ns, t, x, f) in enumerate(launches):
        writer.writerow([str(i), name, ns, f"{t:.2f}", f"{x:.2f}", f"{f:.2f}", "49.85",
                         "15.59", "1.45", "1.23"])
    out.write("==PROF== Disconnected from process 1020\n")
    (folder / "stalls.csv").write_text(out.getvalue())
    manifest = manifest or [
        {"config": "fa2-fwd-x", "role": "measure", "kernels": ["fa2_fwd"], "ok": True},
        {"config": "fa2-bwd-x", "role": "measure", "kernels": ["fa2_bwd_dkdv", "fa2_bwd_dq"],
         "ok": True}]
    (folder / "stalls_manifest.jsonl").write_text(
        "".join(json.dumps(m) + "\n" for m in manifest))
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


def test_overlap_bound_is_the_share_beyond_100_percent_of_the_non_busiest_pipes(tmp_path):
    first, second, third = stalls.read_folder(_write(tmp_path))
    assert first.overlap_bound() == pytest.approx((117.0 - 100.0) / (117.0 - 49.2))
    assert second.overlap_bound() is None  # 70%: the pipes may have taken turns
    assert third.overlap_bound() == pytest.approx(10.0 / 50.0)
    summary = stalls.overlap_summary([first, second, third])
    assert summary["launches"] == 3 and summary["n"] == 2
    assert summary["median"] == pytest.approx((17.0 / 67.8 + 0.2) / 2)
    assert (summary["min"], summary["max"]) == (pytest.approx(0.2), pytest.approx(17.0 / 67.8))


def test_a_launch_the_manifest_does_not_expect_is_an_error(tmp_path):
    swapped = [LAUNCHES[1], LAUNCHES[0], LAUNCHES[2]]
    with pytest.raises(NcuParseError, match="manifest expects fa2_fwd"):
        stalls.read_folder(_write(tmp_path, launches=swapped))
    with pytest.raises(NcuParseError, match="3 profiled launches but the manifest names 1"):
        stalls.read_folder(_write(tmp_path, manifest=[
            {"config": "fa2-fwd-x", "role": "measure", "kernels": ["fa2_fwd"], "ok": True}]))


def test_cli_prints_each_launch_and_the_median_bound(tmp_path, capsys):
    assert stalls.main([str(_write(tmp_path))]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 4 and "bound 0.25" in out[0] and "bound" not in out[1]
    assert out[-1] == ("unit overlap: 2 of 3 launches have pipes summing past 100%; their "
                       "overlap bounds: median 0.225 (0.200-0.251)")


def test_cli_bad_folder_is_one_error_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "stalls.csv").write_text("not a table\n")
    assert stalls.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tilesim: stalls: ") and "no ncu raw table" in err[0]
