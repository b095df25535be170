"""Records made before the device run read the main loop's SASS take their kernels' loop
facts from tilesim's table of compiles (``tilesim reconcile`` by default) or a compile here
(``--fill-loop-facts``), only where the compile gives a kernel the device's registers
(``validation.fill_facts``)."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest

import simulator.cli as cli
from simulator.hardware import load_hardware
from traces.problem import ProblemError
from validation.fill_facts import FRAME_FACTS, LOOP_FACTS, fill_loop_facts
from validation.predict import predict, predict_record
from validation.records import read_records, write_records

RECORDS = Path(__file__).parent.parent / "validation/records/h200-default-2026-11-30.jsonl"
# FA2's forward at d = 128, 128 x 64, 4 warps: 255 registers on the H200, and its L2
# traffic shows spills (tests/test_kernels_aot.py).
SPILLING = "fa2-fwd-b4-h16-q4096-k4096-d128-bf16-m128-n64-s2-w4"


def _record(record_id: str) -> dict:
    return {r["record_id"]: r for r in read_records(RECORDS)[0]}[record_id]


def test_a_record_without_loop_facts_takes_those_of_a_compile_here():
    """The spilling forward gains its compile's spills and waits and is predicted slower;
    a record whose registers the compile here does not give, one that has its own loop
    facts and one from a GPU the kernels do not compile for are left as they are, and the
    record read is not changed. (Its device's Triton made another table of compiles than
    tilesim's: compiled here.)"""
    pytest.importorskip("triton")
    rec = _record(SPILLING)
    rec["environment"]["triton"] = "3.0.0"
    assert all(rec["kernel_facts"][0].get(key) is None for key in LOOP_FACTS)
    before = copy.deepcopy(rec)
    other_registers = copy.deepcopy(rec)
    other_registers["kernel_facts"][0]["registers"] = 200
    own = copy.deepcopy(rec)
    own["kernel_facts"][0].update(loop_instructions=600, spill_load_bytes_per_iteration=0,
                                  spill_store_bytes_per_iteration=0, spill_reload_waits=0)
    other_gpu = copy.deepcopy(rec)
    other_gpu["environment"]["gpu_capability"] = "12.0"
    out, filled = fill_loop_facts([rec, other_registers, own, other_gpu])
    assert filled == 1 and rec == before
    assert out[1] is other_registers and out[2] is own and out[3] is other_gpu
    fact = out[0]["kernel_facts"][0]
    assert fact["loop_instructions"] > 0 and fact["spill_reload_waits"] > 0
    assert fact["spill_load_bytes_per_iteration"] > 0 < fact["spill_store_bytes_per_iteration"]
    assert fact["prologue_instructions"] > 0 < fact["epilogue_instructions"]
    # the stack frame too: the record read it from LOCAL alone, 0 for a kernel that spills
    assert before["kernel_facts"][0]["spill_bytes"] == 0 < fact["spill_bytes"]
    kept = LOOP_FACTS + FRAME_FACTS
    assert ({k: v for k, v in fact.items() if k not in kept}
            == {k: v for k, v in before["kernel_facts"][0].items() if k not in kept})
    hw = load_hardware("h200-sxm")
    filled_pred, plain_pred = (predict_record(predict, r, hw) for r in (out[0], rec))
    assert filled_pred["time_s"] > plain_pred["time_s"]
    assert filled_pred["kernels"][0]["spill_reload_waits"] == fact["spill_reload_waits"]
    assert filled_pred["kernels"][0]["epilogue_instructions"] == fact["epilogue_instructions"]


def _without_triton(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "triton" else real(name, *args))


def test_records_tilesims_table_has_take_its_facts_without_a_compile(monkeypatch):
    """The H200 records' kernels are in tilesim's table of compiles, made with the Triton
    their device ran: they take its rows' facts, no Triton needed; a decode record of four
    queries a head (not in the table) and a record of another Triton need a compile."""
    from kernels import resources, table
    from traces.problem import AttentionProblem
    from traces.tiling import Tiling
    from validation.fill_facts import fill_saying_how

    _without_triton(monkeypatch)
    rec = _record(SPILLING)
    naive = _record("naive-fwd-b1-h16-q16384-k16384-d64-bf16-causal-m64-n64-s2-w4")
    decode = next(r for r in read_records(RECORDS)[0] if r.get("schedule") == "decode")
    out, filled = fill_loop_facts([rec, naive, decode])
    assert filled == 3
    problem = AttentionProblem.from_dict(rec["problem"])
    row = table.problem_rows(problem, Tiling.from_dict(rec["tiling"]), ["fa2_fwd"])["fa2_fwd"]
    fact = out[0]["kernel_facts"][0]
    assert {key: fact[key] for key in LOOP_FACTS} == {key: row[key] for key in LOOP_FACTS}
    assert fact["spill_store_bytes_per_iteration"] > 0
    assert rec["kernel_facts"][0]["spill_bytes"] == 0 < fact["spill_bytes"] == row["spill_bytes"]
    softmax = out[1]["kernel_facts"][1]
    assert softmax["name"] == "naive_softmax" and softmax["straight_instructions"] > 0
    key = resources.job_key("naive_softmax", 90, "bf16", 64, Tiling(64, 64, 2, 4),
                            **table.variant_shape({"causal": True, "seq": 16384}))
    assert softmax["straight_instructions"] == table.lookup(key)["straight_instructions"]
    split = out[2]["kernel_facts"][0]
    assert split["name"] == "decode_split" and split["loop_instructions"] > 0
    rows = table.problem_rows(AttentionProblem.from_dict(decode["problem"]),
                              Tiling.from_dict(decode["tiling"]), ["decode_split"])
    assert split["loop_instructions"] == rows["decode_split"]["loop_instructions"]
    _, said = fill_saying_how([rec, naive, decode])
    assert said["records"] == said["table"] == 3
    assert said["table_triton"] == table.header()["triton"]
    from validation import report as rp

    report = {"model": "simulator", "summary": {"targets": {}}, "unpredicted": [],
              "duplicates_dropped": 0, "loop_facts_filled": 3, "loop_facts_compilers": said}
    line = next(x for x in rp.target_lines(report) if x.startswith("loop facts: 3 records"))
    assert f"table of compiles (Triton {said['table_triton']}, the version the device" in line
    assert "compile here" not in line
    decode = dict(decode, problem=dict(decode["problem"], seq_q=4))  # speculative decoding
    other = copy.deepcopy(rec)
    other["environment"]["triton"] = "3.0.0"
    for needs_compile in (decode, other):
        with pytest.raises(ProblemError, match="--fill-loop-facts"):
            fill_loop_facts([rec, needs_compile])


def test_an_a100_record_takes_the_sm80_tables_facts_without_a_compile(monkeypatch):
    """A SYNTHETIC A100 record (the spilling H200 record, its GPU an A100 and its
    registers those of the A100 compile, as its device would have recorded them) takes
    the loop facts of tilesim's sm_80 table, not sm_90's, with no Triton here."""
    from kernels import table
    from traces.problem import AttentionProblem
    from traces.tiling import Tiling
    from validation.fill_facts import fill_saying_how

    _without_triton(monkeypatch)
    rec = _record(SPILLING)
    problem = AttentionProblem.from_dict(rec["problem"])
    tiling = Tiling.from_dict(rec["tiling"])
    (sm80,) = table.problem_rows(problem, tiling, ["fa2_fwd"], arch=80).values()
    (sm90,) = table.problem_rows(problem, tiling, ["fa2_fwd"]).values()
    assert sm80["loop_instructions"] != sm90["loop_instructions"]
    rec["environment"].update(gpu_name="NVIDIA A100-SXM4-80GB", gpu_sm_count=108,
                             gpu_capability="8.0")
    rec["kernel_facts"][0]["registers"] = sm80["registers"]
    out, said = fill_saying_how([rec])
    assert said["records"] == said["table"] == 1
    assert said["table_triton"] == table.header(80)["triton"]
    fact = out[0]["kernel_facts"][0]
    assert {key: fact[key] for key in LOOP_FACTS} == {key: sm80[key] for key in LOOP_FACTS}


def test_the_reconcile_report_says_how_many_records_were_filled(tmp_path, monkeypatch, capsys):
    pytest.importorskip("triton")
    path = tmp_path / "one.jsonl"
    write_records(path, [_record(SPILLING)])
    monkeypatch.setattr(cli, "COMMANDS", ["reconcile"])
    assert cli.main(["reconcile", str(path), "--json", "--fill-loop-facts"]) == 0
    assert json.loads(capsys.readouterr().out)["loop_facts_filled"] == 1
    assert cli.main(["reconcile", str(path), "--summary-only", "--as-recorded"]) == 0
    assert "loop facts:" not in capsys.readouterr().out  # not asked: not said


def test_reconcile_takes_the_tables_facts_by_default(tmp_path, monkeypatch, capsys):
    """With no flag, an H200 record without loop facts takes them from tilesim's table of
    compiles, with no Triton here, and is predicted as with ``--fill-loop-facts`` (the
    table serves it either way) and as ``predict_record`` predicts it filled; with
    ``--as-recorded`` it keeps its own facts alone and is predicted otherwise (its spills
    unseen); the two flags together are a usage error."""
    _without_triton(monkeypatch)
    rec = _record(SPILLING)
    path = tmp_path / "one.jsonl"
    write_records(path, [rec])
    monkeypatch.setattr(cli, "COMMANDS", ["reconcile"])
    times = {}
    for flags in ((), ("--fill-loop-facts",), ("--as-recorded",)):
        assert cli.main(["reconcile", str(path), "--json", *flags]) == 0
        report = json.loads(capsys.readouterr().out)
        times[flags] = report["rows"][0]["predicted"]["time"]
        assert report["loop_facts_filled"] == (None if flags == ("--as-recorded",) else 1)
    filled, _ = fill_loop_facts([rec], compile_here=False)
    hw = load_hardware("h200-sxm")
    assert times[()] == times[("--fill-loop-facts",)] == pytest.approx(
        predict_record(predict, filled[0], hw)["time_s"], rel=1e-12)
    assert times[("--as-recorded",)] == pytest.approx(
        predict_record(predict, rec, hw)["time_s"], rel=1e-12)
    assert times[("--as-recorded",)] < 0.97 * times[()]  # the spills cost it time
    assert cli.main(["reconcile", str(path), "--summary-only"]) == 0
    said = " ".join(capsys.readouterr().out.split())  # rich wraps the line
    assert "loop facts: 1 records took" in said and "from tilesim's table of compiles" in said
    with pytest.raises(SystemExit) as info:
        cli.main(["reconcile", str(path), "--fill-loop-facts", "--as-recorded"])
    assert info.value.code == 2


def test_without_compile_here_a_record_the_table_lacks_stays_as_it_is(monkeypatch):
    """The default fill compiles nothing: a record the table does not serve (speculative
    decoding, several queries a head) is left as it was, with no Triton here and no
    error."""
    _without_triton(monkeypatch)
    decode = next(r for r in read_records(RECORDS)[0] if r.get("schedule") == "decode")
    decode = dict(decode, problem=dict(decode["problem"], seq_q=4))
    out, filled = fill_loop_facts([decode, _record(SPILLING)], compile_here=False)
    assert filled == 1 and out[0] is decode and out[1]["kernel_facts"][0]["loop_instructions"]


def test_without_triton_it_says_so_in_one_line(monkeypatch):
    """Both options that compile here (``kernels.resources.require_compiler``) name
    themselves and the missing package in one line."""
    from simulator.cli.resources_args import compile_resources
    from traces.problem import AttentionProblem
    from traces.tiling import Tiling

    _without_triton(monkeypatch)
    decode = next(r for r in read_records(RECORDS)[0] if r.get("schedule") == "decode")
    decode = dict(decode, problem=dict(decode["problem"], seq_q=4))  # speculative decoding
    with pytest.raises(ProblemError) as info:
        fill_loop_facts([decode])  # not in tilesim's table of compiles
    assert "--fill-loop-facts" in str(info.value) and "triton is missing" in str(info.value)
    assert "\n" not in str(info.value)
    problem = AttentionProblem(batch=1, heads=2, seq_q=256, head_dim=64)
    with pytest.raises(ProblemError) as info:
        compile_resources(problem, [Tiling(64, 64, 2, 4)], "fa2", load_hardware("h200-sxm"))
    assert "--compiled-resources" in str(info.value) and "triton is missing" in str(info.value)
    assert "\n" not in str(info.value)


def test_the_report_says_whether_the_triton_here_is_the_devices(monkeypatch):
    """The filled facts are the device's own when Triton here is the version the records
    ran (it bundles its ptxas); otherwise the report says they are the compiler's in kind.
    Records that carry their own loop facts do not count."""
    import importlib.metadata

    from validation import report as rp
    from validation.fill_facts import compilers

    rec = _record(SPILLING)
    device = rec["environment"]["triton"]
    own = copy.deepcopy(rec)
    own["environment"]["triton"] = "0.0.1"
    own["kernel_facts"][0].update(loop_instructions=600, spill_load_bytes_per_iteration=0,
                                  spill_store_bytes_per_iteration=0, spill_reload_waits=0)
    for here, same in ((device, True), ("99.0.0", False)):
        monkeypatch.setattr(importlib.metadata, "version", lambda name, v=here: v)
        found = compilers([rec, own])
        assert found == {"here": here, "device": [device], "same": same}
        report = {"model": "simulator", "summary": {"targets": {}}, "unpredicted": [],
                  "duplicates_dropped": 0, "loop_facts_filled": 1,
                  "loop_facts_compilers": found}
        line = next(x for x in rp.target_lines(report) if x.startswith("loop facts:"))
        assert f"Triton {here} here" in line
        assert ("the version the device ran" in line) is same
        assert (f"the device ran {device}" in line) is not same
    monkeypatch.setattr(importlib.metadata, "version", lambda name: device)
    unsaid = copy.deepcopy(rec)  # a record that does not say is not the version here
    del unsaid["environment"]["triton"]
    assert compilers([rec, unsaid])["device"] == sorted([device, "unknown"])
    assert not compilers([rec, unsaid])["same"]


def test_the_report_and_the_fitted_preset_say_which_records_came_from_where():
    """Facts from the table for some records and from a compile here for the others: both
    sources are named, with their counts."""
    from validation import report as rp
    from validation.calibrated_preset import loop_facts_line

    filled = {"here": "3.9.0", "device": ["3.6.0"], "same": False, "records": 3, "table": 2,
              "table_triton": "3.6.0"}
    report = {"model": "simulator", "summary": {"targets": {}}, "unpredicted": [],
              "duplicates_dropped": 0, "loop_facts_filled": 3, "loop_facts_compilers": filled}
    line = next(x for x in rp.target_lines(report) if x.startswith("loop facts: 3 records"))
    assert "table of compiles (Triton 3.6.0, the version the device ran: its facts) for 2" in line
    assert "a compile here (--fill-loop-facts: Triton 3.9.0 here, the device ran 3.6.0" in line
    assert line.endswith("for 1")
    (header,) = loop_facts_line(filled)
    assert ("from tilesim's table of compiles (Triton 3.6.0, the device's) for 2, a compile "
            "with Triton 3.9.0 (the device ran 3.6.0) for 1;") in header
    assert header.endswith("reconcile with --fill-loop-facts to predict as the fit did.")
    (header,) = loop_facts_line(dict(filled, table=3))  # all from the table: the default
    assert "from tilesim's table of compiles (Triton 3.6.0, the device's);" in header
    assert header.endswith("tilesim reconcile takes the same by default.")


def test_the_html_reports_records_take_the_tables_facts_as_reconcile_does(tmp_path,
                                                                          monkeypatch):
    """``tilesim report --records`` predicts a record as ``tilesim reconcile`` does by
    default: from the table's loop facts, and its page says so."""
    from simulator.cli.report_cmd import load_records

    _without_triton(monkeypatch)
    path = tmp_path / "one.jsonl"
    write_records(path, [_record(SPILLING)])
    section = load_records([str(path)], "h200-sxm")
    assert "1 records took their kernels' loop facts from tilesim's table" in section["source"]
    filled, _ = fill_loop_facts([_record(SPILLING)], compile_here=False)
    (row,) = section["rows"]
    assert row["predicted_time_s"] == pytest.approx(
        predict_record(predict, filled[0], load_hardware("h200-sxm"))["time_s"], rel=1e-12)
