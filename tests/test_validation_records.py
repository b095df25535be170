"""Records: round trip, atomic writes, validation with line numbers for malformed lines."""

from __future__ import annotations

import json

import pytest
from synthetic_records import counters, record

from traces.problem import AttentionProblem
from traces.tiling import Tiling
from validation.records import (
    RecordError,
    append_record,
    read_records,
    update_run,
    validate_record,
    write_records,
)

P = AttentionProblem(batch=1, heads=2, seq_q=256, head_dim=64)


def _recs(n=3):
    return [record("fa2", P, Tiling(block_m=bm, block_n=32), 1e-3 * (i + 1),
                   counters(1e6, 2e6) if i % 2 else None)
            for i, bm in enumerate((32, 64, 128)[:n])]


def test_round_trip_append_and_write(tmp_path):
    recs = _recs()
    path = tmp_path / "r.jsonl"
    for rec in recs:
        append_record(path, rec)
    loaded, errors = read_records(path)
    assert errors == [] and loaded == recs
    other = tmp_path / "w.jsonl"
    write_records(other, recs)
    assert read_records(other)[0] == recs
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left


def test_malformed_lines_are_reported_with_line_numbers_and_the_rest_loads(tmp_path):
    good = _recs(2)
    bad_schema = dict(good[0], schema="tilesim.record/0")
    bad_problem = dict(good[0], problem=dict(good[0]["problem"], seq_q=0))
    no_reason = dict(good[0], timing=None, timing_reason=None)
    lines = [json.dumps(good[0]), "{not json", "", json.dumps(bad_schema),
             json.dumps(bad_problem), json.dumps(no_reason), json.dumps(good[1]), "[1, 2]"]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    loaded, errors = read_records(path)
    assert loaded == good
    assert [e.line for e in errors] == [2, 4, 5, 6, 8]
    text = [str(e) for e in errors]
    assert text[0].startswith(f"{path}:2: not valid JSON")
    assert "schema" in text[1] and "seq_q" in text[2] and "timing_reason" in text[3]
    assert "JSON object" in text[4]


def test_validate_rejects_bad_tiling_and_timing():
    rec = _recs(1)[0]
    with pytest.raises(RecordError, match="tiling"):
        validate_record(dict(rec, tiling=dict(rec["tiling"], block_m=48)))
    with pytest.raises(RecordError, match="median_s"):
        validate_record(dict(rec, timing=dict(rec["timing"], median_s=-1)))
    with pytest.raises(RecordError, match="implementation"):
        validate_record(dict(rec, implementation="cuda"))
    with pytest.raises(RecordError, match="not found"):
        read_records("/nonexistent/records.jsonl")


def test_update_run_touches_only_its_run_and_keeps_other_lines(tmp_path):
    recs = _recs()
    recs[1]["run_id"] = "other"
    path = tmp_path / "r.jsonl"
    write_records(path, recs)
    with open(path, "a") as f:
        f.write("{broken line\n")

    def add_counters(rec):
        rec["counters"], rec["counters_reason"] = counters(5.0, 6.0), None
        return rec

    assert update_run(path, "synthetic", add_counters) == 2
    lines = path.read_text().splitlines()
    assert lines[-1] == "{broken line"
    loaded, errors = read_records(path)
    assert len(errors) == 1
    assert [r["counters"] is not None for r in loaded] == [True, recs[1]["counters"] is not None,
                                                         True]


def test_update_run_keeps_a_record_whose_update_is_not_valid(tmp_path):
    """A device run attaches counters to every record at the end: one bad value must cost
    that record its update, not the run all its counters."""
    recs = _recs()
    path = tmp_path / "r.jsonl"
    write_records(path, recs)
    before = path.read_text().splitlines()
    rejected = []

    def add_counters(rec):
        rec["counters"], rec["counters_reason"] = counters(5.0, 6.0), None
        if rec["record_id"] == recs[0]["record_id"]:
            rec["counters"]["dram_read_bytes"] = -1.0
        return rec

    with pytest.raises(RecordError, match="dram_read_bytes"):
        update_run(path, "synthetic", add_counters)
    assert path.read_text().splitlines() == before  # all or nothing without on_invalid
    n = update_run(path, "synthetic", add_counters,
                   lambda rec, exc: rejected.append((rec["record_id"], str(exc))))
    assert n == len(recs) - 1
    assert [r for r, _ in rejected] == [recs[0]["record_id"]]
    lines = path.read_text().splitlines()
    assert lines[0] == before[0]
    loaded, errors = read_records(path)
    assert not errors and loaded[1]["counters"]["dram_read_bytes"] == 5.0
