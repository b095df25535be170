"""Trace files: Parquet round trip, determinism, exports, and bad files."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from simulator.cli import main
from traces import export
from traces.problem import AttentionProblem
from traces.tiling import Tiling
from traces.trace import Trace, read_parquet, write_parquet

PROBLEM = ["--schedule", "fa2", "--batch", "1", "--heads", "2", "--kv-heads", "1",
           "--seq", "100", "--kv-seq", "150", "--head-dim", "32", "--causal",
           "--block-m", "32", "--block-n", "16"]


def run(capsys, argv):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_parquet_round_trip_and_hash(tmp_path):
    p = AttentionProblem(2, 4, 90, 32, seq_kv=70, kv_heads=2, causal=True, pass_="fwd+bwd")
    trace = Trace.build(p, Tiling(32, 16), "fa2", "test")
    path = tmp_path / "t.parquet"
    write_parquet(trace, path)
    back = read_parquet(path)
    assert back.problem == p and back.tiling == Tiling(32, 16)
    assert [k.name for k in back.kernels] == [k.name for k in trace.kernels]
    for a, b in zip(trace.kernels, back.kernels, strict=True):
        assert np.array_equal(a.records, b.records)
    assert back.content_hash() == trace.content_hash()


def test_trace_file_is_deterministic(tmp_path, capsys):
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    assert run(capsys, ["trace", *PROBLEM, "--out", str(a)])[0] == 0
    assert run(capsys, ["trace", *PROBLEM, "--out", str(b)])[0] == 0
    assert a.read_bytes() == b.read_bytes()


def test_replay_equals_count(tmp_path, capsys):
    """Counts, and residency from the same registers: naive attention's softmax at these
    lengths is in the table of compiles (it takes neither heads nor group), which both
    take, and ``--estimated-resources`` estimates it in both."""
    path = tmp_path / "t.parquet"
    sources = {}
    for schedule in ("fa2", "naive", "fa1"):
        argv = [*PROBLEM[2:], "--schedule", schedule]
        assert run(capsys, ["trace", *argv, "--out", str(path)])[0] == 0
        for flags in ([], ["--estimated-resources"]):
            rc, counted, _ = run(capsys, ["count", *argv, "--json", *flags])
            assert rc == 0
            rc, replayed, _ = run(capsys, ["replay", str(path), "--json", *flags])
            assert rc == 0
            assert json.loads(replayed) == json.loads(counted)
            sources[schedule, bool(flags)] = {k["name"]: k["resources"]
                                              for k in json.loads(replayed)["kernels"]}
    assert sources["naive", False]["naive_softmax"] == "table"
    assert set(sources["naive", True].values()) == {"estimated"}


def test_trace_names_its_hardware_and_chrome_is_the_simulated_run(tmp_path, capsys):
    """``--hardware`` (and ``--set``) as every command takes them: the Parquet metadata names
    the hardware (the access stream is the same on any), and ``--format chrome`` writes the
    timeline ``simulate --timeline`` writes for the same problem and hardware."""
    what_if = ["--hardware", "h200-sxm", "--set", "sm_count=66"]
    path = tmp_path / "t.parquet"
    assert run(capsys, ["trace", *PROBLEM, *what_if, "--out", str(path)])[0] == 0
    back = read_parquet(path)
    assert back.hardware == "h200-sxm+sm_count=66"
    other = tmp_path / "u.parquet"
    assert run(capsys, ["trace", *PROBLEM, "--out", str(other)])[0] == 0
    assert read_parquet(other).hardware == "h100-sxm5"
    assert read_parquet(other).content_hash() == back.content_hash()
    chrome, timeline = tmp_path / "t.json", tmp_path / "timeline.json"
    rc, _, err = run(capsys, ["trace", *PROBLEM, *what_if, "--format", "chrome", "--out",
                              str(chrome)])
    assert rc == 0 and "simulated run on h200-sxm+sm_count=66" in err
    assert run(capsys, ["simulate", *PROBLEM, *what_if, "--timeline", str(timeline)])[0] == 0
    assert json.loads(chrome.read_text()) == json.loads(timeline.read_text())
    # at d = 64 the table of compiles has the kernel: both take it, or both the estimate
    covered = [*PROBLEM, "--head-dim", "64", "--hardware", "h200-sxm"]
    for flags in ([], ["--estimated-resources"]):
        assert run(capsys, ["trace", *covered, *flags, "--format", "chrome", "--out",
                            str(chrome)])[0] == 0
        rc, out, _ = run(capsys, ["simulate", *covered, *flags, "--timeline", str(timeline),
                                  "--json"])
        assert rc == 0
        source = "estimated" if flags else "table"
        assert [k["resources"] for k in json.loads(out)["kernels"]] == [source]
        assert json.loads(chrome.read_text()) == json.loads(timeline.read_text())
    big = ["--block-m", "256", "--block-n", "256", "--stages", "5"]
    rc, _, err = run(capsys, ["trace", *PROBLEM, *big, "--head-dim", "128", "--format",
                              "chrome", "--out", str(tmp_path / "x.json")])
    assert rc == 2 and err.count("\n") == 1 and "does not fit" in err
    assert not (tmp_path / "x.json").exists()


def _records():
    p = AttentionProblem(1, 2, 100, 32, seq_kv=80)
    return Trace.build(p, Tiling(32, 16), "naive")


def test_ramulator_export_covers_every_byte_once_per_access():
    trace = _records()
    buf = io.BytesIO()
    lines = export.write_ramulator2((k.records for k in trace.kernels), buf, 8)
    text = buf.getvalue().decode().splitlines()
    assert len(text) == lines
    assert all(line[:5] in ("LD 0x", "ST 0x") and len(line) == 13 for line in text)
    addresses = np.array([int(line[3:], 16) for line in text])
    assert (addresses % 64 == 0).all()
    # Expected requests: for each access, the 64-byte lines touched by each valid row.
    expected = 0
    for k in trace.kernels:
        acc = k.records[k.records["op"] < 2]
        for r in acc:
            for row in range(int(r["rows"])):
                start = int(r["address"]) + row * int(r["row_stride"])
                end = start + int(r["row_bytes"])
                if r["row_bytes"] == r["row_stride"] and row:
                    continue  # contiguous tiles are one span, counted below
                if r["row_bytes"] == r["row_stride"]:
                    end = start + int(r["rows"]) * int(r["row_bytes"])
                expected += (end - 1) // 64 - start // 64 + 1
    assert lines == expected


def test_dramsim_export_format():
    trace = _records()
    buf = io.BytesIO()
    total = export.count_requests(k.records for k in trace.kernels)
    lines = export.write_dramsim3((k.records for k in trace.kernels), buf, 6, total)
    text = buf.getvalue().decode().splitlines()
    assert lines == total == len(text)
    for line in text[:50] + text[-50:]:
        addr, op, cycle = line.split(" ")
        assert addr.startswith("0x") and op in ("READ", "WRITE")
    assert [int(line.split()[2]) for line in text] == list(range(total))
    ram = io.BytesIO()
    export.write_ramulator2((k.records for k in trace.kernels), ram, 6)
    ops = [line[:2] for line in ram.getvalue().decode().splitlines()]
    assert ops == ["LD" if line.split()[1] == "READ" else "ST" for line in text]


@pytest.mark.parametrize("content", [b"", b"PAR1garbage", b"not parquet at all\n"])
def test_corrupt_trace_is_one_line_exit_2(tmp_path, capsys, content):
    path = tmp_path / "bad.parquet"
    path.write_bytes(content)
    rc, out, err = run(capsys, ["replay", str(path)])
    assert rc == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err


def test_truncated_and_foreign_parquet(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    good = tmp_path / "good.parquet"
    assert run(capsys, ["trace", *PROBLEM, "--out", str(good)])[0] == 0
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    foreign = tmp_path / "foreign.parquet"
    pq.write_table(pa.table({"x": [1, 2, 3]}), foreign)
    for path, needle in ((truncated, "not a readable"), (foreign, "not a tilesim trace"),
                         (tmp_path / "missing.parquet", "not found")):
        rc, _, err = run(capsys, ["replay", str(path)])
        assert rc == 2 and needle in err and err.count("\n") == 1


def test_altered_records_fail_the_hash(tmp_path):
    import pyarrow.parquet as pq

    trace = Trace.build(AttentionProblem(1, 1, 64, 16), Tiling(16, 16), "fa2")
    path = tmp_path / "t.parquet"
    write_parquet(trace, path)
    table = pq.read_table(path)
    column = table.column("bytes").to_numpy().copy()
    column[3] += 1
    altered = table.set_column(table.schema.get_field_index("bytes"), "bytes", [column])
    pq.write_table(altered.replace_schema_metadata(table.schema.metadata), path)
    with pytest.raises(Exception, match="content hash mismatch"):
        read_parquet(path)


def test_unwritable_output_leaves_nothing(tmp_path, capsys):
    rc, _, err = run(capsys, ["trace", *PROBLEM, "--out", str(tmp_path / "no" / "t.parquet")])
    assert rc == 2 and "does not exist" in err and err.count("\n") == 1
    readonly = tmp_path / "ro"
    readonly.mkdir()
    readonly.chmod(0o500)
    try:
        rc, _, err = run(capsys, ["trace", *PROBLEM, "--out", str(readonly / "t.parquet")])
        if rc == 0:  # running as root: permissions do not stop us; nothing to check
            return
        assert rc == 2 and err.count("\n") == 1
        assert list(readonly.iterdir()) == []
    finally:
        readonly.chmod(0o700)
