"""Files given to the commands: what an output path may be (a link, a FIFO, a name too
long, a folder), and records that cannot be used. One line on stderr, exit code 2, and no
file lost or replaced by a failed run."""

from __future__ import annotations

import json
import os
import threading

import pytest
from synthetic_records import record

from simulator.cli import main
from simulator.cli.common import write_atomically
from traces.problem import AttentionProblem
from traces.tiling import Tiling
from validation.records import write_records

TRACE = ["trace", "--heads", "1", "--seq", "128"]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("tilesim: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


def test_a_link_is_followed_not_replaced(tmp_path, capsys):
    target = tmp_path / "target.parquet"
    target.write_text("old")
    link = tmp_path / "link.parquet"
    link.symlink_to(target.name)
    assert main([*TRACE, "--out", str(link)]) == 0
    assert link.is_symlink() and os.readlink(link) == target.name
    assert target.read_bytes()[:4] == b"PAR1"  # the target holds the new trace


def test_a_fifo_is_written_into_not_replaced(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    write_atomically(fifo, lambda tmp: tmp.write_text("through the pipe"))
    reader.join(timeout=30)
    assert received == [b"through the pipe"]
    assert fifo.is_fifo()  # still a FIFO, not a regular file


def test_a_stream_path_is_appended_to(tmp_path, monkeypatch):
    """A path among the process's streams (``/dev/stdout`` redirected to a file) is written
    into at its end: renaming a file over it would lose what is printed after."""
    import simulator.cli.common as common

    out = tmp_path / "stdout.txt"
    out.write_text("printed before\n")
    monkeypatch.setattr(common, "STREAM_PATHS", (str(tmp_path),))
    write_atomically(out, lambda tmp: tmp.write_text("the output\n"))
    assert out.read_text() == "printed before\nthe output\n"


def test_a_name_too_long_is_one_line(tmp_path, capsys):
    long = tmp_path / ("y" * 300)
    assert main([*TRACE, "--out", f"{long}.parquet"]) == 2
    assert "too long" in one_error_line(capsys)
    assert main(["simulate", "--heads", "1", "--seq", "128", "--hardware",
                 f"{long}.toml"]) == 2
    one_error_line(capsys)
    assert main(["replay", f"{long}.parquet"]) == 2
    one_error_line(capsys)


def test_a_trailing_slash_names_a_folder(tmp_path, capsys):
    assert main([*TRACE, "--out", f"{tmp_path}/new/"]) == 2
    assert "names a directory" in one_error_line(capsys)
    assert not (tmp_path / "new").exists()


def test_a_folder_is_not_called_missing(tmp_path, capsys):
    assert main(["reconcile", str(tmp_path)]) == 2
    assert "is a directory" in one_error_line(capsys)
    assert main(["count", "--hardware", str(tmp_path)]) == 2
    assert "is a directory" in one_error_line(capsys)


def _records(tmp_path, tiling: Tiling | None = None):
    """One synthetic fa2 record (of ``tiling``, if given) in a file."""
    problem = AttentionProblem(batch=1, heads=2, seq_q=256, head_dim=64)
    rec = record("fa2", problem, Tiling(64, 64), 1e-5)
    if tiling is not None:
        rec["tiling"] = tiling.to_dict()
    path = tmp_path / "records.jsonl"
    write_records(path, [rec])
    return path


def test_reconcile_of_nothing_it_can_compare_fails_and_keeps_the_saved_report(tmp_path,
                                                                             capsys):
    """A record whose tiling does not fit: nothing to compare, so exit 2 before --save."""
    path = _records(tmp_path, tiling=Tiling(256, 256, num_stages=4))
    saved = tmp_path / "reconcile.json"
    saved.write_text("earlier report")
    assert main(["reconcile", str(path), "--save", str(saved)]) == 2
    err = one_error_line(capsys)
    assert "none of the 1 records could be compared" in err and "does not fit" in err
    assert saved.read_text() == "earlier report"


def test_reconcile_says_synthetic_from_the_records_read(tmp_path, capsys):
    path = _records(tmp_path)
    saved = tmp_path / "reconcile.json"
    assert main(["reconcile", str(path), "--save", str(saved), "--summary-only"]) == 0
    assert json.loads(saved.read_text())["synthetic"] is True


def test_many_malformed_lines_are_a_few_warnings(tmp_path, capsys):
    good = _records(tmp_path).read_text()
    path = tmp_path / "mixed.jsonl"
    path.write_text(good + "{not json\n" * 50)
    assert main(["reconcile", str(path), "--summary-only"]) == 0
    err = capsys.readouterr().err
    assert err.count("tilesim: warning: skipped") == 4  # three lines, then how many more
    assert "47 more malformed lines" in err
    path.write_text("{not json\n" * 50)
    assert main(["reconcile", str(path)]) == 2
    assert "50 malformed lines" in one_error_line(capsys)


def test_validate_refuses_an_unknown_preset_with_a_frozen_plan(capsys):
    assert main(["validate", "--matrix", "quick", "--dry-run", "--hardware", "nope"]) == 2
    assert "unknown hardware" in one_error_line(capsys)


def test_kernels_resources_checks_its_arguments_before_compiling(tmp_path, capsys,
                                                                 monkeypatch):
    pytest.importorskip("triton")
    from kernels import resources

    def no_compiling(*_args, **_kwargs):
        raise AssertionError("compiled before its arguments were checked")

    monkeypatch.setattr(resources, "measure", no_compiling)
    args = ["kernels", "resources", "--kernel", "fa2_fwd", "--block-m", "64", "--block-n",
            "64", "--stages", "2", "--warps", "4"]
    assert main([*args, "--workers", "0"]) == 2
    assert '"--workers" must be >= 1' in one_error_line(capsys)
    assert main([*args, "--out", str(tmp_path / "missing" / "x.json")]) == 2
    assert "does not exist" in one_error_line(capsys)


def test_progress_lines_say_each_tenth_of_the_way_after_a_quiet_start(capsys):
    from simulator.cli.common import progress_lines

    now = [0.0]
    progress = progress_lines("reconcile", "records predicted", clock=lambda: now[0])
    for done in range(1, 306):
        now[0] = done * 0.1  # a record every 0.1 s: the first 10 s say nothing
        progress(done, 305)
    lines = capsys.readouterr().err.splitlines()
    counts = [int(line.split(": ")[2].split(" of ")[0]) for line in lines]
    assert counts == [100, 122, 153, 183, 214, 244, 275, 305]
    assert lines[0] == "tilesim: reconcile: 100 of 305 records predicted (10 s)"
    assert all(line.startswith("tilesim: reconcile: ") for line in lines)
