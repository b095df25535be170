"""``tilesim roofline``: roofs and ridge points from the presets, kernels placed by the model."""

from __future__ import annotations

import json

import pytest

import simulator.cli as cli
from simulator.explain import model, roofline
from simulator.hardware import TENSOR_DTYPES, load_hardware, preset_names
from traces.problem import AttentionProblem
from traces.tiling import Tiling

PNG = b"\x89PNG\r\n\x1a\n"
# Small problems: every prediction is a simulation (naive attention is the slow one).
SMALL = ["--heads", "1", "--seq", "512", "--head-dim", "64"]


@pytest.fixture(autouse=True)
def only_ours(monkeypatch):
    # Other subcommands are built elsewhere; these tests must not depend on them importing.
    monkeypatch.setattr(cli, "COMMANDS", ["roofline"])


def run(argv, capsys):
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_h100_bf16_ridge_point_by_hand():
    # 989 TFLOP/s dense bf16 / 3.35 TB/s HBM3 (h100-sxm5.toml); achievable: x 0.79 / x 0.9.
    c = roofline.ceilings(load_hardware("h100-sxm5"), "bf16", flops_per_exp=512.0)
    assert c["ridge_points"]["tensor"] == pytest.approx(295.2238806, rel=1e-9)
    assert c["ridge_points"]["tensor_achievable"] == pytest.approx(
        989e12 * 0.79 / (3.35e12 * 0.9), rel=1e-12)
    # exp: 16 a clock on each of 132 SMs at 1.98 GHz = 4.18176e12 exp/s, x 512 FLOP/exp =
    # 2.141e15 FLOP/s, ridge 639.1 FLOP/B
    assert c["exp_ceiling_flops_per_s"] == pytest.approx(4.18176e12 * 512, rel=1e-12)
    assert c["ridge_points"]["exp"] == pytest.approx(4.18176e12 * 512 / 3.35e12, rel=1e-12)
    assert c["ridge_points"]["fp32"] == pytest.approx(6.7e13 / 3.35e12, rel=1e-12)


@pytest.mark.parametrize("preset", preset_names())
@pytest.mark.parametrize("dtype", TENSOR_DTYPES)
def test_ridge_points_from_every_preset(preset, dtype):
    hw = load_hardware(preset)
    c = roofline.ceilings(hw, dtype, flops_per_exp=300.0)
    assert c["ridge_points"]["tensor"] == hw.tensor_flops_per_s[dtype] / \
        hw.hbm_bandwidth_bytes_per_s
    assert c["ridge_points"]["tensor_achievable"] == pytest.approx(
        hw.tensor_flops_per_s[dtype] * hw.tensor_efficiency
        / (hw.hbm_bandwidth_bytes_per_s * hw.hbm_efficiency), rel=1e-12)
    assert c["ridge_points"]["exp"] == pytest.approx(
        hw.exp_ops_per_s * 300.0 / hw.hbm_bandwidth_bytes_per_s, rel=1e-12)


def test_cli_json_places_every_kernel_at_flops_per_dram_byte(capsys):
    code, out, err = run(["roofline", "--hardware", "h100-sxm5", "--dtype", "bf16", *SMALL,
                          "--json"], capsys)
    assert code == 0, err
    result = json.loads(out)
    assert result["ceilings"]["ridge_points"]["tensor"] == 989e12 / 3.35e12
    hw = load_hardware("h100-sxm5")
    problem = AttentionProblem(batch=1, heads=1, seq_q=512, head_dim=64, dtype="bf16")
    expected = []
    for schedule in ("naive", "fa2"):
        for k in model.predict(problem, Tiling(), schedule, hw)["kernels"]:
            flops = k["flops"]["tensor"] + k["flops"]["exp"] + k["flops"]["other"]
            expected.append((k["name"], flops, model.dram_bytes(k["bytes"])))
    assert [k["name"] for k in result["kernels"]] == [e[0] for e in expected]
    assert [k["name"] for k in result["kernels"]] == [
        "naive_qk", "naive_softmax", "naive_pv", "fa2_fwd"]
    for k, (_, flops, dram) in zip(result["kernels"], expected, strict=True):
        assert k["flops"] == flops and k["dram_bytes"] == dram
        assert k["intensity"] == flops / dram


def test_placement_follows_the_model_dram_bytes(monkeypatch):
    """Halve the model's DRAM bytes (as an L2 would): every intensity doubles exactly."""
    real = model.predict

    def with_l2(problem, tiling, schedule, hw, compiled=None, l2_start="cold"):
        pred = real(problem, tiling, schedule, hw)
        for k in pred["kernels"]:
            k["bytes"]["dram_read"] //= 2
            k["bytes"]["dram_write"] //= 2
        return pred

    hw = load_hardware("h100-sxm5")
    problem = AttentionProblem(batch=1, heads=1, seq_q=512, head_dim=64)
    before = roofline.roofline(problem, Tiling(), hw)
    monkeypatch.setattr(model, "predict", with_l2)
    after = roofline.roofline(problem, Tiling(), hw)
    for a, b in zip(before["kernels"], after["kernels"], strict=True):
        assert b["intensity"] == b["flops"] / b["dram_bytes"]
        assert b["intensity"] == pytest.approx(2 * a["intensity"], rel=1e-6)


def test_every_number_is_the_simulators():
    """The roofline places the timing simulator's kernels: its times and its DRAM bytes."""
    from simulator import sim

    hw = load_hardware("h100-sxm5")
    problem = AttentionProblem(batch=1, heads=1, seq_q=512, head_dim=64)
    result = roofline.roofline(problem, Tiling(), hw)
    assert result["model"] == model.source() == {
        "source": model.SIMULATOR, "note": "SimPy timing simulator with L2 model"}
    placed = iter(result["kernels"])
    for schedule in ("naive", "fa2"):
        pred = sim.predict(problem, Tiling(), schedule, hw)[0]
        ours = model.predict(problem, Tiling(), schedule, hw)
        assert ours["model"] == model.source()
        for key in ("time_s", "bytes", "per_tensor", "kernels", "bound"):  # not wall times
            assert ours[key] == pred[key], key
        assert result["schedules"][schedule]["time_s"] == pred["time_s"]
        for k in pred["kernels"]:
            mine = next(placed)
            assert mine["name"] == k["name"] and mine["model_time_s"] == k["time_s"]
            assert mine["dram_bytes"] == model.dram_bytes(k["bytes"])
            # The L2 serves re-reads: DRAM traffic never exceeds the global traffic.
            assert 0 < mine["dram_bytes"] <= mine["global_bytes"]
            # A simulated kernel takes at least its roofline bound.
            assert mine["model_time_s"] >= mine["time_bound_s"] * (1 - 1e-9)
    assert not any(n.startswith("Model:") for n in roofline.notes(result))


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_attainable_is_the_roofline_bound(dtype):
    hw = load_hardware("h100-sxm5")
    problem = AttentionProblem(batch=1, heads=4, seq_q=1024, head_dim=128, dtype=dtype,
                               causal=True)
    result = roofline.roofline(problem, Tiling(), hw)
    peak, bw = hw.tensor_flops_per_s[dtype], hw.hbm_bandwidth_bytes_per_s
    for k in result["kernels"]:
        memory_s = k["dram_bytes"] / (bw * hw.hbm_efficiency)
        # A kernel with matmuls runs at the tensor clock (1.789 GHz against 1.98): its exp
        # and FP32 rates, counted per clock, with it; the tensor rate is measured as it is.
        clocked = hw.at_tensor_clock() if k["tensor_flops"] else hw
        # "Other" FLOPs are not FMAs: half the datasheet FP32 rate (simulator.sim.compute).
        units = (k["tensor_flops"] / (peak * hw.tensor_efficiency),
                 k["exp_ops"] / clocked.exp_ops_per_s,
                 k["other_flops"] / (clocked.fp32_flops_per_s / 2))
        # The busiest unit, plus the share of the others that does not overlap it.
        compute_s = max(units) + (1 - hw.unit_overlap) * (sum(units) - max(units))
        assert k["time_bound_s"] == pytest.approx(max(memory_s, compute_s), rel=1e-12)
        assert k["attainable_flops_per_s"] == pytest.approx(
            min(k["intensity"] * bw * hw.hbm_efficiency, k["flops"] / compute_s), rel=1e-12)
        assert k["bound"] == ("hbm" if memory_s >= compute_s else k["compute_unit"])
        # No kernel reaches more than the achievable fraction of the tensor peak.
        assert 0 <= k["tensor_utilisation"] <= hw.tensor_efficiency + 1e-12
    # Naive's score kernels sit left of FA2: the N x N matrix costs bytes, not FLOPs.
    by_name = {k["name"]: k for k in result["kernels"]}
    assert by_name["fa2_fwd"]["intensity"] > by_name["naive_qk"]["intensity"]
    # Softmax does a few FLOPs per score it reads and writes; the L2 may serve S back when
    # it fits (then only P's write reaches DRAM), still far left of every ridge point.
    assert by_name["naive_softmax"]["global_intensity"] < 5
    assert by_name["naive_softmax"]["intensity"] < 10


@pytest.mark.parametrize("head_dim", [64, 128])
def test_exp_ceiling_uses_fa2_flops_per_exp(head_dim):
    hw = load_hardware("h100-sxm5")
    problem = AttentionProblem(batch=1, heads=1, seq_q=1024, head_dim=head_dim, dtype="fp8")
    result = roofline.roofline(problem, Tiling(), hw)
    fa2 = next(k for k in result["kernels"] if k["name"] == "fa2_fwd")
    c = result["ceilings"]
    assert c["flops_per_exp"] == fa2["flops"] / fa2["exp_ops"]
    # ~4d: 2d for QK^T and 2d for PV per score, a few softmax FLOPs, and the rescale exps
    # of each row once per K/V block (which pull it a little below 4d).
    assert 0.95 * 4 * head_dim <= c["flops_per_exp"] <= 4 * head_dim + 16
    assert c["exp_ceiling_flops_per_s"] == hw.exp_ops_per_s * c["flops_per_exp"]
    exp_roof = c["exp_ceiling_flops_per_s"] < c["tensor_flops_per_s"]
    if head_dim == 64:  # 3.86e12 exp/s x ~256 = ~1e15, half of fp8's 1979 TFLOP/s
        assert exp_roof
    assert any("exp unit, not the tensor cores" in n for n in roofline.notes(result)) == exp_roof


@pytest.mark.parametrize("suffix, magic", [(".png", PNG), (".svg", b"<?xml")])
def test_plot_and_table(tmp_path, capsys, suffix, magic):
    path = tmp_path / f"roofline{suffix}"
    code, out, err = run(["roofline", *SMALL, "--plot", str(path)], capsys)
    assert code == 0, err
    assert path.read_bytes()[: len(magic)] == magic and path.stat().st_size > 2000
    flat = " ".join(out.split())
    assert "Ridge point 295 FLOP/B" in flat and "fa2_fwd" in flat and "naive_softmax" in flat


@pytest.mark.parametrize("argv", [
    ["roofline", "--heads", "0"],
    ["roofline", "--hardware", "no-such-gpu"],
    ["roofline", "--block-m", "48"],
    ["roofline", "--plot", "roofline.jpg"],
    ["roofline", "--head-dim", "8"],
    ["roofline", "--dtype", "fp64"],  # argparse choices
])
def test_bad_input_exit_2_one_line(argv, capsys):
    code, out, err = run(argv, capsys)
    assert code == 2
    assert out == ""
    assert err.startswith("tilesim: error: ") and err.count("\n") == 1, err
