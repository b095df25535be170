"""``tilesim sweep``: enumeration, legality, parallel runs, ranking, plot, JSON."""

from __future__ import annotations

import argparse
import json

import pytest

from simulator.cli import main
from simulator.cli.sweep_cmd import BLOCKS, STAGES, WARPS, candidate_tilings, legal_tilings
from simulator.explain.model import ties_differ_in_block_n
from simulator.hardware import load_hardware
from traces.problem import AttentionProblem

SMALL = ["--batch", "1", "--heads", "4", "--seq", "1024", "--head-dim", "128"]


def _args(**kw) -> argparse.Namespace:
    base = dict(schedule="fa2", block_m=BLOCKS, block_n=BLOCKS, stages=STAGES, warps=WARPS,
                split_kv=None)
    base.update(kw)
    return argparse.Namespace(**base)


def test_default_enumeration_and_legality():
    problem = AttentionProblem(1, 4, 1024, 128)
    tilings = candidate_tilings(_args(), problem)
    assert len(tilings) == 5 * 5 * 5 * 2
    legal, refused = legal_tilings(problem, "fa2", load_hardware("h100-sxm5"), tilings)
    assert refused == {"do not fit on the GPU": len(tilings) - len(legal)}
    # BM=256, BN=256, 5 stages: 64 KiB of Q + 5 x 128 KiB of K/V cannot fit in 227 KiB.
    assert all(not (t.block_m == 256 and t.block_n == 256 and t.num_stages == 5)
               for t in legal)
    assert len(legal) >= 48


def test_decode_varies_split_kv_not_block_m():
    problem = AttentionProblem(1, 8, 1, 128, seq_kv=4096, kv_heads=2)
    tilings = candidate_tilings(_args(schedule="decode", block_n=(64,), stages=(2,),
                                      warps=(4,)), problem)
    assert {t.split_kv for t in tilings} == {1, 2, 4, 8, 16, 32, 64}
    assert {t.block_m for t in tilings} == {128}


def test_sweep_ranks_by_time(capsys):
    argv = ["sweep", *SMALL, "--block-m", "64,128", "--block-n", "32,64", "--stages", "1,2",
            "--warps", "4", "--jobs", "2", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schema"] == "tilesim.sweep/1" and out["candidates"] == 8
    times = [r["time_s"] for r in out["results"]]
    assert len(times) == 8 and times == sorted(times)
    assert all(r["legal"] and r["schema"] == "tilesim.prediction/1" for r in out["results"])
    # The same tiling simulated alone gives the same answer as in the parallel sweep.
    best = out["results"][0]["tiling"]
    assert main(["simulate", *SMALL, "--block-m", str(best["block_m"]), "--block-n",
                 str(best["block_n"]), "--stages", str(best["num_stages"]), "--warps", "4",
                 "--mode", out["mode"], "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert alone["time_s"] == out["results"][0]["time_s"]


def test_table_and_heatmap(tmp_path, capsys):
    plot = tmp_path / "sweep.png"
    argv = ["sweep", *SMALL, "--block-m", "64,128", "--block-n", "64,128", "--stages", "2",
            "--warps", "4", "--jobs", "1", "--plot", str(plot)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "best" in out and "legal tilings of 4" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(tmp_path.iterdir()) == [plot]


def test_decode_sweep_runs(capsys):
    argv = ["sweep", "--schedule", "decode", "--batch", "1", "--heads", "8", "--kv-heads", "2",
            "--seq", "1", "--kv-seq", "2048", "--block-n", "64", "--stages", "2", "--warps",
            "4", "--split-kv", "1,4,16", "--jobs", "1", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert sorted(r["tiling"]["split_kv"] for r in out["results"]) == [1, 4, 16]


def test_nothing_legal_exits_2(capsys):
    argv = ["sweep", *SMALL, "--head-dim", "256", "--block-m", "256", "--block-n", "256",
            "--stages", "5", "--jobs", "1"]
    assert main(argv) == 2
    assert "no legal tiling" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["64,x", ""])
def test_bad_list_is_a_usage_error(bad, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["sweep", "--block-m", bad])
    assert exc.value.code == 2


def test_ties_with_the_best_are_counted(capsys):
    """A memory-bound decode: its tilings differ in warps and stages but not in bytes, so
    several tie; the table says how many lie within 1% of the best (JSON gives the times)."""
    argv = ["sweep", "--schedule", "decode", "--batch", "16", "--heads", "32", "--kv-heads",
            "8", "--seq", "1", "--kv-seq", "16384", "--block-n", "32,64", "--stages", "2",
            "--warps", "4,8", "--split-kv", "1", "--jobs", "1"]
    assert main([*argv, "--json"]) == 0
    times = [r["time_s"] for r in json.loads(capsys.readouterr().out)["results"]]
    close = sum(t <= min(times) * 1.01 for t in times)
    assert close > 1
    assert main(argv) == 0
    assert f"{close} tilings within 1% of the best" in capsys.readouterr().out


def test_tensor_bound_ties_across_block_n_are_flagged():
    """Tilings the model ties although their block_n differs, in a tensor-bound kernel: the
    mechanism that would tell them apart (wgmma's operand reads from shared memory) is left
    out, and the table says so; not for memory-bound ties or a single block_n."""
    flag = ties_differ_in_block_n
    assert flag([(16, 1.0, "tensor"), (64, 1.005, "tensor")])
    assert not flag([(16, 1.0, "tensor"), (64, 1.05, "tensor")])  # 5% apart: no tie
    assert not flag([(16, 1.0, "hbm"), (64, 1.0, "hbm")])
    assert not flag([(64, 1.0, "tensor"), (64, 1.0, "tensor")])
    assert not flag([])


def test_what_if_reaches_the_worker_processes(capsys):
    argv = ["sweep", *SMALL, "--hardware", "h200-sxm", "--block-m", "64", "--block-n", "32,64",
            "--stages", "2", "--warps", "4", "--jobs", "2", "--json"]
    assert main(argv) == 0
    base = {json.dumps(r["tiling"]): r["time_s"] for r in json.loads(capsys.readouterr().out)[
        "results"]}
    assert main([*argv, "--set", "tensor_flops_per_s.bf16=247e12"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["hardware"] == "h200-sxm+tensor_flops_per_s.bf16=247e12"
    slow = {json.dumps(r["tiling"]): r["time_s"] for r in doc["results"]}
    assert slow.keys() == base.keys() and len(base) == 2
    assert all(slow[k] > base[k] for k in base)  # a quarter of the tensor rate, every tiling


@pytest.mark.parametrize("overlap, ties", [("0.9", True), (None, False)])
def test_the_table_says_what_the_model_leaves_out_when_block_n_ties(capsys, overlap, ties):
    """A tensor-bound forward at d = 128: where block_n 32 and 64 tie (the model does not
    charge wgmma's operand reads from shared memory), the caption says so. They tie where an
    SM's units overlap nearly fully (``--set unit_overlap=0.9``: 826.4 and 824.8 us); with
    the preset's measured overlap the smaller block's extra work per K/V block (the
    accumulator's rescale, its reductions' shuffles) no longer hides under the tensor
    cores: no tie (1128.2 and 1084.3 us), no caption. Three stages, so that a CTA's loads
    overlap its compute (with two, Triton issues them after the matmuls), and 8 warps (with
    4, block_n 64 waits on its loads). Registers estimated: with the table of compiles'
    (193 a thread at block_n 64) one CTA fits an SM, not two, which sets them apart."""
    argv = ["sweep", "--hardware", "h200-sxm", "--batch", "4", "--heads", "16", "--seq",
            "4096", "--head-dim", "128", "--block-m", "128", "--block-n", "32,64",
            "--stages", "3", "--warps", "8", "--jobs", "1", "--estimated-resources"]
    if overlap is not None:
        argv += ["--set", f"unit_overlap={overlap}"]
    assert main([*argv, "--json"]) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    entries = [(r["tiling"]["block_n"], r["time_s"], r["bound"]) for r in results]
    assert main(argv) == 0
    text = " ".join(capsys.readouterr().out.split())
    # The caption follows the model's own numbers.
    caveat = "does not charge wgmma's operand reads from shared memory" in text
    assert caveat == ties_differ_in_block_n(entries) is ties


def test_tilings_whose_warps_compute_a_tile_twice_are_marked(capsys):
    """The backward with 8 warps on the H200: a 64-row block (dQ's block_m or dK/dV's
    block_n) is laid 8 warps deep, so its scores are computed twice; 128 x 128 is not."""
    argv = ["sweep", "--hardware", "h200-sxm", "--pass", "bwd", "--batch", "1", "--heads",
            "2", "--seq", "1024", "--head-dim", "64", "--block-m", "64,128", "--block-n",
            "64,128", "--stages", "2", "--warps", "8", "--jobs", "1"]
    assert main(argv) == 0
    rows = {tuple(int(cell) for cell in line.split("│")[2:4]): line
            for line in capsys.readouterr().out.splitlines()
            if line.count("│") > 10 and line.split("│")[2].strip().isdigit()}
    assert set(rows) == {(64, 64), (64, 128), (128, 64), (128, 128)}
    for tiles, line in rows.items():
        assert ("tile 2x" in line) == (tiles != (128, 128)), line
