"""Trace files whose metadata or columns are wrong: malformed metadata, edited metadata (the
metadata hash, and the checks that catch edits in files written before it), bad columns,
and paths that are not trace files. Each is one error line and exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from simulator.cli import main
from traces.trace import METADATA_KEY, TraceError, metadata_hash, read_parquet

REPO = Path(__file__).resolve().parents[1]
PROBLEM = ["--seq", "128", "--heads", "2", "--head-dim", "32", "--block-m", "32",
           "--block-n", "32"]


def run(capsys, argv):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "good.parquet"
    assert main(["trace", *PROBLEM, "--out", str(path)]) == 0
    return path


def _info(path: Path) -> dict:
    return json.loads(pq.read_schema(path).metadata[METADATA_KEY])


def _rewrite(src: Path, dst: Path, info=None, raw: bytes | None = None, table=None) -> Path:
    """``src``'s records (or ``table``) under new metadata: ``info`` as JSON, or ``raw``."""
    table = pq.read_table(src) if table is None else table
    meta = raw if raw is not None else json.dumps(info).encode()
    pq.write_table(table.replace_schema_metadata({METADATA_KEY: meta}), dst)
    return dst


def _old_format(info: dict) -> dict:
    """The metadata as files written before the metadata hash have it."""
    return {k: v for k, v in info.items() if k != "metadata_hash"}


def _one_error_line(capsys, argv, needle: str) -> str:
    rc, out, err = run(capsys, argv)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("tilesim: error: ")
    assert needle in err and "Traceback" not in err
    return err


def _drop(key):
    def edit(info):
        del info[key]
    return edit


def _set(key, value):
    def edit(info):
        info[key] = value
    return edit


def _set_in(key, index, field, value):
    def edit(info):
        info[key][index][field] = value
    return edit


MALFORMED = {
    "no problem": (_drop("problem"), 'lacks "problem"'),
    "problem is a string": (_set("problem", "x"), '"problem" is a string, expected an object'),
    "kernels null": (_set("kernels", None), '"kernels" is null, expected a list'),
    "tensors null": (_set("tensors", None), '"tensors" is null, expected a list'),
    "tiling null": (_set("tiling", None), '"tiling" is null, expected an object'),
    "schedule a number": (_set("schedule", 2), '"schedule" is a number, expected a string'),
    "unknown schedule": (_set("schedule", "fa9"), "'fa9' is not one of naive, fa1, fa2"),
    "hardware a list": (_set("hardware", []), '"hardware" is a list, expected a string'),
    "bad problem value": (lambda i: i["problem"].update(seq_q=-1),
                          '"problem" is not valid: "seq_q" must be a positive integer'),
    "unknown problem key": (lambda i: i["problem"].update(colour=1),
                            "\"problem\" is not valid: "),
    "causal not a bool": (lambda i: i["problem"].update(causal="no"),
                          '"causal" must be true or false'),
    "bad tiling value": (lambda i: i["tiling"].update(block_m=48),
                         '"tiling" is not valid: "block_m" must be a power of two'),
    "tensor lacks a field": (lambda i: i["tensors"][1].pop("rows"),
                             '"tensors" entry 1 is not an object of name, planes, rows'),
    "tensor rows a float": (_set_in("tensors", 0, "rows", 1.5),
                            '"tensors" entry 0: "rows" must be an integer >= 1, got 1.5'),
    "kernel records negative": (_set_in("kernels", 0, "records", -1),
                                '"kernels" entry 0: "records" must be an integer >= 0'),
    "kernel name a number": (_set_in("kernels", 0, "name", 3),
                             '"kernels" entry 0: "name" is not a string'),
    "tensor named twice": (_set_in("tensors", 1, "name", "q"), "names a tensor twice"),
    "no schema": (_drop("schema"), "unsupported trace schema None"),
}


@pytest.mark.parametrize("raw, needle", [
    (b"[1, 2]", "trace metadata is a list, not an object"),
    (b"null", "trace metadata is null, not an object"),
    (b'"text"', "trace metadata is a string, not an object"),
    (b"\xff\xfe{", "tilesim metadata is corrupt"),
    (b"[" * 100_000, "tilesim metadata is corrupt"),
], ids=["list", "null", "string", "not-utf8", "deep-nesting"])
def test_metadata_that_is_not_an_object(good, tmp_path, capsys, raw, needle):
    bad = _rewrite(good, tmp_path / "bad.parquet", raw=raw)
    err = _one_error_line(capsys, ["replay", str(bad)], needle)
    assert str(bad) in err
    with pytest.raises(TraceError, match="metadata"):
        read_parquet(bad, verify=False)


@pytest.mark.parametrize("case", list(MALFORMED))
@pytest.mark.parametrize("hashed", [True, False], ids=["with-hash", "old-format"])
def test_malformed_metadata_names_the_field(good, tmp_path, capsys, case, hashed):
    """The shape is checked before the hash, so the message says what is wrong, in files
    with the metadata hash and in files written before it."""
    edit, needle = MALFORMED[case]
    info = _info(good) if hashed else _old_format(_info(good))
    edit(info)
    bad = _rewrite(good, tmp_path / "bad.parquet", info)
    err = _one_error_line(capsys, ["replay", str(bad)], needle)
    assert str(bad) in err
    with pytest.raises(TraceError, match="trace"):
        read_parquet(bad, verify=False)


def test_writer_records_the_metadata_hash(good):
    info = _info(good)
    assert len(info["metadata_hash"]) == 64
    assert info["metadata_hash"] == metadata_hash(info)
    assert metadata_hash(info) == metadata_hash(_old_format(info))
    assert metadata_hash(info) != metadata_hash(dict(info, hardware="other"))


@pytest.mark.parametrize("edit", [
    lambda i: i["problem"].update(seq_q=256),
    lambda i: i["problem"].update(causal=True),
    lambda i: i["tiling"].update(block_n=16),
    lambda i: i.update(schedule="fa1"),
    lambda i: i["tensors"][0].update(base=256),
    lambda i: i["kernels"][0].update(grid=99),
    lambda i: i["kernels"][0].update(name="renamed"),
    lambda i: i.update(content_hash="0" * 64),
    lambda i: i.update(hardware="h200-sxm"),
    lambda i: i.update(tool_version="9.9"),
], ids=["seq_q", "causal", "block_n", "schedule", "tensor-base", "grid", "kernel-name",
        "content-hash", "hardware", "tool-version"])
def test_edited_metadata_fails_the_metadata_hash(good, tmp_path, capsys, edit):
    info = _info(good)
    edit(info)
    bad = _rewrite(good, tmp_path / "bad.parquet", info)
    _one_error_line(capsys, ["replay", str(bad)], "metadata hash mismatch")
    with pytest.raises(TraceError, match="metadata hash mismatch"):
        read_parquet(bad)


def test_verify_false_skips_the_metadata_hash(good, tmp_path):
    info = _info(good)
    info["hardware"] = "relabelled"
    back = read_parquet(_rewrite(good, tmp_path / "t.parquet", info), verify=False)
    assert back.hardware == "relabelled"


def test_old_format_file_loads_and_replays_as_before(good, tmp_path, capsys):
    old = _rewrite(good, tmp_path / "old.parquet", _old_format(_info(good)))
    assert "metadata_hash" not in _info(old)
    assert read_parquet(old).content_hash() == read_parquet(good).content_hash()
    rc, replayed_old, err = run(capsys, ["replay", str(old), "--json"])
    assert rc == 0 and err == ""
    rc, replayed, _ = run(capsys, ["replay", str(good), "--json"])
    assert rc == 0 and json.loads(replayed_old) == json.loads(replayed)


def test_edited_problem_in_an_old_format_file(good, tmp_path, capsys):
    """The reviewer's case: seq_q edited, no metadata hash to catch it. Replay rebuilds the
    schedule from the problem, so its tensors no longer match the file's."""
    info = _old_format(_info(good))
    info["problem"]["seq_q"] = 256
    bad = _rewrite(good, tmp_path / "bad.parquet", info)
    read_parquet(bad)  # the reader alone cannot tell: no hash, and the shapes are valid
    err = _one_error_line(capsys, ["replay", str(bad)], "tensor 0 is q [2, 128, 32]")
    assert str(bad) in err and "q [2, 256, 32]" in err


def test_edited_kernel_grid_in_an_old_format_file(good, tmp_path, capsys):
    info = _old_format(_info(good))
    info["kernels"][0]["grid"] = 9
    bad = _rewrite(good, tmp_path / "bad.parquet", info)
    _one_error_line(capsys, ["replay", str(bad)],
                    "kernels are fa2_fwd x9 in the file but fa2_fwd x8")


def test_decode_schedule_not_valid_for_the_problem(good, tmp_path, capsys):
    info = _old_format(_info(good))
    info["schedule"] = "decode"
    bad = _rewrite(good, tmp_path / "bad.parquet", info)
    _one_error_line(capsys, ["replay", str(bad)], "are not valid together")


def test_records_must_fit_the_metadata_lists(good, tmp_path, capsys):
    """Without the metadata hash, the records' kernel and tensor ids are still checked
    against the metadata's lists: a dropped tensor or a miscounted kernel is an error."""
    info = _old_format(_info(good))
    n_tensors = len(info["tensors"])
    info["tensors"].pop()
    bad = _rewrite(good, tmp_path / "bad.parquet", info)
    _one_error_line(capsys, ["replay", str(bad)],
                    f"records refer to tensor {n_tensors - 1}, its metadata lists "
                    f"{n_tensors - 1} tensors")
    info = _old_format(_info(good))
    n = info["kernels"][0]["records"]
    info["kernels"][0]["records"] = n + 1
    bad = _rewrite(good, tmp_path / "bad.parquet", info)
    _one_error_line(capsys, ["replay", str(bad)],
                    f"the file has {n} records, its metadata lists {n + 1}")


def _with_column(table: pa.Table, name: str, column: pa.Array) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, column)


def test_null_values_are_one_line_without_warnings(good, tmp_path, capsys):
    table = pq.read_table(good)
    values = table.column("bytes").to_pylist()
    values[3] = None
    nulls = _with_column(table, "bytes", pa.array(values, pa.uint64()))
    bad = _rewrite(good, tmp_path / "bad.parquet", _info(good), table=nulls)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's cast warning would fail the test
        _one_error_line(capsys, ["replay", str(bad)], "column bytes has missing values (1 of")
    proc = subprocess.run([sys.executable, "-m", "simulator", "replay", str(bad)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "missing values" in proc.stderr


def test_column_of_the_wrong_type(good, tmp_path, capsys):
    table = pq.read_table(good)
    floats = _with_column(table, "bytes", pa.array(table.column("bytes").to_numpy() * 1.0))
    bad = _rewrite(good, tmp_path / "bad.parquet", _info(good), table=floats)
    _one_error_line(capsys, ["replay", str(bad)], "column bytes holds double, expected uint64")


def test_paths_that_are_not_trace_files(tmp_path, capsys):
    _one_error_line(capsys, ["replay", str(tmp_path)], f"{tmp_path} is a directory")
    _one_error_line(capsys, ["replay", "/dev/null"], "/dev/null is not a regular file")
    _one_error_line(capsys, ["replay", str(tmp_path / "none.parquet")], "not found")
    with pytest.raises(TraceError, match="is a directory"):
        read_parquet(tmp_path)


def test_trace_out_must_name_a_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _one_error_line(capsys, ["trace", *PROBLEM, "--out", ""], "an output path is empty")
    _one_error_line(capsys, ["trace", *PROBLEM, "--out", str(tmp_path)],
                    f"cannot write {tmp_path}: it is a directory")
    _one_error_line(capsys, ["trace", *PROBLEM, "--format", "ramulator2", "--out", ""],
                    "an output path is empty")
    # Every command's output path is checked alike.
    _one_error_line(capsys, ["simulate", *PROBLEM, "--timeline", str(tmp_path)],
                    "it is a directory")
    _one_error_line(capsys, ["sweep", *PROBLEM, "--plot", ""], "must end in .png or .svg")
    assert list(tmp_path.iterdir()) == []
