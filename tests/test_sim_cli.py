"""``tilesim simulate``: the summary, the JSON contract, the timeline file, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.sim import timeline

REPO = Path(__file__).resolve().parents[1]
SMALL = ["--batch", "1", "--heads", "4", "--seq", "512", "--head-dim", "64"]


def _json(capsys, argv) -> dict:
    assert main(["simulate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_fills_every_timed_field(capsys):
    pred = _json(capsys, SMALL + ["--causal"])
    assert pred["schema"] == "tilesim.prediction/1"
    assert pred["time_s"] > 0 and pred["bound"] in (
        "hbm", "l2", "tensor", "exp", "fp32", "latency", "occupancy")
    b = pred["bytes"]
    assert 0 < b["dram_read"] <= b["global_read"] and 0 < b["dram_write"] <= b["global_write"]
    assert sum(t["dram_read"] for t in pred["per_tensor"].values()) == b["dram_read"]
    for k in pred["kernels"]:
        assert k["time_s"] > 0 and k["bound"] and k["occupancy"]["ctas_per_sm"] > 0
        assert set(k["achieved"]) == {"hbm_bytes_per_s", "l2_bytes_per_s", "tflops"}
    assert pred["achieved"]["convention_tflops"] == pytest.approx(
        pred["flops"]["convention"] / pred["time_s"] / 1e12)
    assert pred["simulation"]["mode"] in ("full", "aggregated")
    assert pred["simulation"]["events"] > 0


def test_modes_agree_on_counts(capsys):
    full = _json(capsys, SMALL + ["--mode", "full"])
    fast = _json(capsys, SMALL + ["--mode", "aggregated"])
    assert full["bytes"]["global_read"] == fast["bytes"]["global_read"]
    assert fast["time_s"] == pytest.approx(full["time_s"], rel=0.1)


def test_summary_tables(capsys):
    assert main(["simulate", *SMALL, "--schedule", "naive"]) == 0
    out = capsys.readouterr().out
    for needle in ("naive_qk", "naive_softmax", "DRAM read", "simulated timing", "TFLOP/s",
                   "bound"):
        assert needle in out


def test_padding_is_reported_where_tiles_are_padded(capsys):
    """Decode with G * Nq = 4 query rows per K/V head issues 16-row matmuls: 75% padding.
    FA2 at a multiple of its tiles issues exactly what it counts: no such row."""
    decode = ["--schedule", "decode", "--batch", "2", "--heads", "8", "--kv-heads", "2",
              "--seq", "1", "--kv-seq", "2048", "--head-dim", "64", "--split-kv", "4"]
    pred = _json(capsys, decode)
    assert pred["flops"]["issued"]["tensor"] == 4 * pred["flops"]["tensor"]
    assert main(["simulate", *decode]) == 0
    out = capsys.readouterr().out
    assert "tensor FLOPs issued (incl. padding)" in out and "(75% padding)" in out
    fa2 = _json(capsys, SMALL)
    assert fa2["flops"]["issued"]["tensor"] == fa2["flops"]["tensor"]
    assert main(["simulate", *SMALL]) == 0
    assert "incl. padding" not in capsys.readouterr().out


def test_a_head_dim_without_a_triton_twin_says_so(capsys):
    assert main(["count", *SMALL, "--head-dim", "80"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "head_dim 80 is modelled as is" in out and "padded to 128" in out
    assert main(["count", *SMALL, "--head-dim", "64"]) == 0
    assert "modelled as is" not in capsys.readouterr().out


def test_refused_tiling_exits_2_while_count_answers(capsys):
    argv = SMALL + ["--head-dim", "256", "--block-m", "256", "--block-n", "256",
                    "--stages", "4"]
    assert main(["simulate", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not fit" in err and "shared memory" in err
    assert main(["count", *argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["legal"] is False


def test_default_tiling_that_cannot_fit_falls_back_to_smaller_blocks(capsys):
    """FA2's forward at d = 256 in fp16 on the A100 (163 KiB a CTA), by the tiles'
    estimate: the default 128 x 64 at two stages holds Q (128 x 256 x 2 B = 64 KiB) and two
    stages of K and V (4 x 64 x 256 x 2 B = 128 KiB), 192 KiB; 64 x 64 holds 32 + 128 = 160
    KiB and fits. With no tile flag the commands run that, and say why; with one, the
    default is refused as before."""
    a100 = ["--hardware", "a100-sxm4-80gb", "--batch", "1", "--heads", "2", "--seq", "256",
            "--head-dim", "256", "--dtype", "fp16", "--estimated-resources"]
    pred = _json(capsys, a100)
    assert (pred["tiling"]["block_m"], pred["tiling"]["block_n"]) == (64, 64)
    assert pred["tiling"]["num_stages"] == 2 and pred["tiling"]["num_warps"] == 4
    assert pred["legal"] and pred["sram_peak_bytes_per_cta"] == (32 + 128) * 1024
    assert main(["simulate", *a100]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("does not fit on a100-sxm4-80gb: fa2_fwd needs 192.0 KiB of shared memory per "
            "CTA, the GPU allows 163.0 KiB; using BM=64 BN=64 stages=2 warps=4") in out
    assert main(["count", *a100, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tiling"]["block_m"] == 64
    # a tile flag set: the user's tiling, refused (count marks it not legal)
    assert main(["simulate", *a100, "--stages", "2"]) == 2
    assert "fa2_fwd needs 192.0 KiB" in capsys.readouterr().err
    assert main(["count", *a100, "--stages", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["legal"] is False
    # compare must fit both schedules: naive's backward dV kernel is the larger here
    assert main(["compare", *a100, "--pass", "bwd", "--json"]) == 0
    preds = json.loads(capsys.readouterr().out)
    assert preds["naive"]["tiling"] == preds["fa2"]["tiling"]
    assert preds["naive"]["legal"] and preds["fa2"]["legal"]
    # only residency falls back: a split count the default's K/V blocks cannot take is
    # refused, though 32-row blocks would take it
    decode = ["--schedule", "decode", "--seq", "1", "--kv-seq", "128", "--split-kv", "4"]
    assert main(["simulate", *decode]) == 2
    out, err = capsys.readouterr()
    assert err.strip() == "tilesim: error: split_kv=4 exceeds the 2 K/V blocks of 64 rows"
    assert out == ""


def test_the_fallback_rules_fit_by_the_resources_the_command_takes(capsys):
    """Where tilesim's table of compiles has the kernels, the default tiling falls back
    exactly where the user's same tiling is refused: both rule by the compile's shared
    memory, not the estimate's. On the A100 at d = 256 (as above) the table's 128 x 64
    compile fits; with the GPU's per-CTA limit set below it, the fallback is the first
    smaller tiling whose compile fits, which the estimate would have refused."""
    from kernels import table
    from traces.problem import AttentionProblem
    from traces.tiling import Tiling

    problem = AttentionProblem(batch=1, heads=2, seq_q=256, head_dim=256, dtype="fp16")
    names = ["fa2_fwd"]

    def shared(tiling):
        return table.problem_rows(problem, tiling, names, 80)["fa2_fwd"]["shared_bytes"]

    gemma = ["--hardware", "a100-sxm4-80gb", "--batch", "1", "--heads", "2", "--seq", "256",
             "--head-dim", "256", "--dtype", "fp16"]
    default, smaller, smallest = Tiling(), Tiling(64, 64), Tiling(64, 32)
    assert shared(default) <= 163 * 1024 < 192 * 1024  # the compile fits, the estimate not
    for argv in (gemma, gemma + ["--stages", str(default.num_stages)]):
        pred = _json(capsys, argv)
        tiles = pred["tiling"]
        assert (tiles["block_m"], tiles["block_n"]) == (default.block_m, default.block_n)
        assert pred["legal"] and pred["sram_peak_bytes_per_cta"] == shared(default)
    # the compile spills there every iteration, and the summary says so
    row = table.problem_rows(problem, default, names, 80)["fa2_fwd"]
    spilled = row["spill_load_bytes_per_iteration"] + row["spill_store_bytes_per_iteration"]
    assert spilled > 0
    assert main(["simulate", *gemma]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (f"fa2: fa2_fwd at this tiling compiles to {row['registers']} registers a thread "
            f"and spills {spilled} bytes a thread every iteration") in out
    # a limit between 64 x 64's compile and the default's: the table's fallback is 64 x 64
    limit = (shared(default) + shared(smaller)) // 2
    assert limit < 160 * 1024  # the estimate's 64 x 64 does not fit it; 64 x 32 (96 KiB) does
    capped = gemma + ["--set", f"smem_per_cta_max_bytes={limit}"]
    assert main(["simulate", *capped]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (f"fa2_fwd needs {shared(default) / 1024:.1f} KiB of shared memory per CTA, the "
            f"GPU allows {limit / 1024:.1f} KiB; using BM=64 BN=64 stages=2 warps=4") in out
    assert main(["simulate", *capped, "--stages", "2"]) == 2
    assert f"fa2_fwd needs {shared(default) / 1024:.1f} KiB" in capsys.readouterr().err
    assert main(["simulate", *capped, "--estimated-resources"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("fa2_fwd needs 192.0 KiB of shared memory per CTA, the GPU allows "
            f"{limit / 1024:.1f} KiB; using BM={smallest.block_m} BN={smallest.block_n} "
            "stages=2") in out


@pytest.mark.parametrize("setting, words", [
    ("max_threads_per_sm=64", ("threads", "at most 64")),
    ("registers_per_sm=4096", ("registers", "the SM has 4096")),
])
def test_refused_residency_names_the_limit_that_refuses(capsys, setting, words):
    """A CTA with too many threads is refused for its threads, not its registers."""
    assert main(["simulate", *SMALL, "--set", setting]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not fit" in err
    assert all(w in err for w in words)


def _check_trace(trace: dict) -> dict:
    slices = defaultdict(list)
    counters = set()
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            assert e["dur"] >= 0
            slices[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
        elif e["ph"] == "C":
            counters.add(e["name"])
    for spans in slices.values():  # slices on one track must not overlap
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert start >= end - 1e-6
    assert counters == {"HBM GB/s", "L2 GB/s", "SRAM in use"}
    return slices


def test_timeline_is_a_valid_chrome_trace(tmp_path, capsys):
    path = tmp_path / "run.json"
    assert main(["simulate", *SMALL, "--pass", "fwd+bwd", "--timeline", str(path)]) == 0
    assert "timeline written" in capsys.readouterr().out
    trace = json.loads(path.read_text())
    slices = _check_trace(trace)
    ctas = sum(len(v) for tid, v in slices.items() if tid != 0)
    pred = _json(capsys, SMALL + ["--pass", "fwd+bwd"])
    assert ctas == sum(k["grid"] for k in pred["kernels"])
    assert len(slices[0]) == len(pred["kernels"])  # one slice per kernel launch
    assert list(tmp_path.iterdir()) == [path]  # written atomically: no temporary left
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert "kernels" in names and "SM 000 slot 0" in names


def test_timeline_is_capped(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(timeline, "MAX_CTA_SLICES", 6)
    path = tmp_path / "capped.json"
    assert main(["simulate", *SMALL, "--timeline", str(path), "--json"]) == 0
    capsys.readouterr()
    trace = json.loads(path.read_text())
    _check_trace(trace)
    ctas = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "cta"]
    assert 0 < len(ctas) <= 6
    assert "slices kept for SMs" in trace["otherData"]["note"]


def test_timeline_to_missing_directory_fails_cleanly(capsys):
    assert main(["simulate", *SMALL, "--timeline", "/nonexistent/dir/run.json"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_same_answer_in_a_fresh_process():
    cmd = [sys.executable, "-m", "simulator", "simulate", *SMALL, "--causal", "--json"]
    outputs = []
    for _ in range(2):
        out = json.loads(subprocess.run(cmd, cwd=REPO, check=True, capture_output=True,
                                        text=True).stdout)
        for key in ("wall_s", "events_per_s", "tile_accesses_per_s"):
            out["simulation"].pop(key)
        outputs.append(out)
    assert outputs[0] == outputs[1]


def test_a_tile_its_warps_compute_twice_is_named(capsys):
    """dQ at 64 x 128 with 8 warps on the H200: the score products are laid 8 x 1 over 64
    rows (wgmma), so both warpgroups compute S and dP; dQ itself is split along N. The JSON
    says so per kernel, and the summary adds a note; at 128 rows there is none."""
    bwd = ["--hardware", "h200-sxm", "--batch", "1", "--heads", "2", "--seq", "1024",
           "--head-dim", "64", "--pass", "bwd", "--block-n", "128", "--warps", "8"]
    pred = _json(capsys, bwd + ["--block-m", "64"])
    layouts = {k["name"]: k["warp_layout"] for k in pred["kernels"]}
    assert layouts["fa2_bwd_preprocess"] is None
    assert layouts["fa2_bwd_dq"] == {
        "instruction": "wgmma", "matmuls": ["64x128:8x1", "64x128:8x1", "64x64:4x2"],
        "copies": {"tensor": pytest.approx(5 / 3), "elementwise": 2.0}}
    assert layouts["fa2_bwd_dkdv"]["copies"] == {"tensor": 1.0, "elementwise": 1.0}
    assert main(["simulate", *bwd, "--block-m", "64"]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert notes == ["note: fa2_bwd_dq lays 8 warps of 16 rows along a 64x128 tile (wgmma), "
                     "so its warps compute it 2 times: 1.67x the matmul work, 2x the "
                     "elementwise work; 128 rows or fewer warps avoid it"]
    assert main(["simulate", *bwd, "--block-m", "128"]) == 0
    assert "note:" not in capsys.readouterr().out


@pytest.mark.parametrize("extra, note", [
    # one batch of 8 K/V heads: 8 CTAs; 16 splits would give 128, fewer than 132 SMs
    ([], "note: decode_split runs 8 CTAs on 132 SMs (batch x K/V heads x --split-kv 1); "
         "--split-kv 32 gives 256 (`tilesim sweep --schedule decode` ranks the split counts)"),
    # 4 blocks of 64 keys: 4 splits at most
    (["--kv-seq", "256"], "note: decode_split runs 8 CTAs on 132 SMs (batch x K/V heads x "
                          "--split-kv 1); --split-kv 4 gives 32 (`tilesim sweep --schedule "
                          "decode` ranks the split counts)"),
    (["--kv-seq", "256", "--split-kv", "4"],
     "note: decode_split runs 32 CTAs on 132 SMs (batch x K/V heads x --split-kv 4); its "
     "keys have 4 blocks of 64, too few to split further (a smaller --block-n splits finer)"),
    (["--split-kv", "16"], None),  # 128 CTAs: every SM but 4 has one
    (["--batch", "16"], None)])
def test_decode_that_leaves_sms_idle_is_told_the_split_that_fills_them(capsys, extra, note):
    argv = ["simulate", "--hardware", "h200-sxm", "--schedule", "decode", "--batch", "1",
            "--heads", "32", "--kv-heads", "8", "--seq", "1", "--kv-seq", "8192",
            "--head-dim", "128", "--block-n", "64", *extra]
    assert main(argv) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert notes == ([note] if note else [])
