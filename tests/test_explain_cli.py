"""``tilesim bill | ledger | race`` through ``simulator.cli.main``: JSON, plots, bad input."""

from __future__ import annotations

import json

import pytest

import simulator.cli as cli

OURS = ["bill", "ledger", "race"]
PNG = b"\x89PNG\r\n\x1a\n"


def test_registered():
    assert set(OURS) <= set(cli.COMMANDS)


@pytest.fixture(autouse=True)
def only_explainers(monkeypatch):
    # Other subcommands are built elsewhere; these tests must not depend on them importing.
    monkeypatch.setattr(cli, "COMMANDS", OURS)


def run(argv, capsys):
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_bill_json(capsys):
    code, out, err = run(["bill", "--seq", "512,2048", "--head-dim", "128", "--dtype", "fp16",
                          "--json"], capsys)
    assert code == 0, err
    result = json.loads(out)
    assert [r["s_bytes"] for r in result["rows"]] == [2 * 512**2 * 2, 2 * 2048**2 * 2]
    assert [r["flops"] for r in result["rows"]] == [4 * 512**2 * 128, 4 * 2048**2 * 128]


def test_ledger_json(capsys):
    code, out, err = run(["ledger", "--seq", "64", "--tile", "16", "--seed", "5", "--json"],
                         capsys)
    assert code == 0, err
    result = json.loads(out)
    assert result["agreement"]["ok"] and result["agreement"]["weights_max_abs_diff"] <= 1e-12
    assert result["no_rescale"]["weights_rel_err"] > 0.01
    assert result["tiles"][0]["m_old"] is None  # JSON null, not -Infinity
    assert "Infinity" not in out and "NaN" not in out


def test_race_json(capsys):
    code, out, err = run(["race", "--seq", "128,256", "--head-dim", "32", "--tile", "32",
                          "--repeats", "1", "--json"], capsys)
    assert code == 0, err
    assert err == ""  # the progress spinner stays silent off a terminal
    result = json.loads(out)
    assert [r["seq"] for r in result["rows"]] == [128, 256]
    assert all(r["max_abs_diff"] <= 1e-10 for r in result["rows"])
    assert all(r["naive_bytes"] >= r["seq"] ** 2 * 8 for r in result["rows"])


@pytest.mark.parametrize("argv", [
    ["bill", "--seq", "512,2048"],
    ["ledger", "--seq", "32", "--tile", "8"],
    ["race", "--seq", "128", "--repeats", "1"],
])
def test_plot_writes_png_and_tables_print(argv, tmp_path, capsys):
    path = tmp_path / "out.png"
    code, out, err = run([*argv, "--plot", str(path)], capsys)
    assert code == 0, err
    assert path.stat().st_size > 1000 and path.read_bytes()[:8] == PNG
    assert out.strip()  # the rich table went to stdout
    assert "…" not in out  # piped, the table is not squeezed into 80 columns and cut


def test_text_output_says_what_it_measures(capsys):
    code, out, _ = run(["race", "--seq", "128", "--repeats", "1"], capsys)
    assert code == 0
    flat = " ".join(out.split())
    assert "no HBM/SRAM split" in flat and "compile excluded" in flat


@pytest.mark.parametrize("argv", [
    ["bill", "--seq", "0"],
    ["bill", "--seq", "abc"],
    ["bill", "--seq", "512,,2048"],
    ["bill", "--head-dim", "4"],
    ["ledger", "--seq", "0"],
    ["ledger", "--seq", "100000000", "--tile", "50000000"],
    ["ledger", "--seq", "abc"],
    ["ledger", "--seq", "64", "--tile", "128"],
    ["ledger", "--seed", "-3"],
    ["ledger", "--plot", "ledger.jpg"],
    ["race", "--seq", "0"],
    ["race", "--seq", "abc"],
    ["race", "--seq", "128", "--tile", "256"],
    ["race", "--seq", "128", "--repeats", "0"],
    ["race", "--seq", "65536"],  # refused before any work: the N x N alone would be 32 GiB
    ["bill", "--dtype", "fp64"],  # argparse choices
])
def test_bad_input_exit_2_one_line(argv, capsys):
    code, out, err = run(argv, capsys)
    assert code == 2
    assert out == ""
    assert err.startswith("tilesim: error: ") and err.count("\n") == 1, err


def test_plot_into_missing_directory(tmp_path, capsys):
    code, _, err = run(["bill", "--plot", str(tmp_path / "no" / "bill.png")], capsys)
    assert code == 2 and err.count("\n") == 1
