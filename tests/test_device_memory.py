"""Device memory: a problem whose tensors outgrow the GPU's HBM is reported, not simulated."""

from __future__ import annotations

import dataclasses
import json

import pytest

from simulator.cli import main
from simulator.device_memory import DeviceMemoryError, check_device_memory
from simulator.explain import report, roofline
from simulator.explain.model import predict_pair
from simulator.hardware import load_hardware
from simulator.prediction import count_prediction
from traces.problem import AttentionProblem
from traces.schedules import build_schedule, schedule_tensors
from traces.tiling import Tiling

H200 = load_hardware("h200-sxm")
TILING = Tiling(block_m=64, block_n=64)


def _problem(**kw) -> AttentionProblem:
    base = {"batch": 1, "heads": 2, "seq_q": 1024, "seq_kv": 1024, "head_dim": 64}
    return AttentionProblem(**{**base, **kw})


def _elements(p: AttentionProblem) -> tuple[int, int]:
    """(elements of one of Q/K/V/O, elements of one N x N score tensor)."""
    return p.batch * p.heads * p.seq_q * p.head_dim, p.batch * p.heads * p.seq_q * p.seq_kv


def test_footprint_is_every_tensor_of_the_pass():
    p = _problem()  # every size a multiple of the 256-byte alignment: no padding
    qkvo, nxn = _elements(p)
    naive = build_schedule(p, TILING, "naive").device_bytes
    fa2 = build_schedule(p, TILING, "fa2").device_bytes
    assert naive == 2 * (4 * qkvo + 2 * nxn)  # bf16 Q, K, V, O, S, P
    assert fa2 == 2 * 4 * qkvo + 4 * p.batch * p.heads * p.seq_q  # + fp32 LSE
    both = build_schedule(_problem(pass_="fwd+bwd"), TILING, "fa2").device_bytes
    assert both == fa2 + 2 * 4 * qkvo + 4 * p.batch * p.heads * p.seq_q  # dO dQ dK dV, delta


def test_footprint_keeps_the_alignment():
    p = _problem(seq_q=1, seq_kv=1000, heads=3)  # Q is 3 x 64 x 2 = 384 bytes: padded to 512
    tensors = schedule_tensors(p, TILING, "fa2")
    assert tensors["k"].base == 512
    assert build_schedule(p, TILING, "fa2").device_bytes == tensors["lse"].base + 3 * 4


def test_naive_at_64k_does_not_fit_an_h200_but_fa2_does():
    p = _problem(heads=32, seq_q=65536, seq_kv=65536, head_dim=128)
    with pytest.raises(DeviceMemoryError, match=r"naive does not fit in device memory: its "
                       r"tensors need 551\.90 GB \(s 274\.88 GB, p 274\.88 GB"):
        check_device_memory(p, TILING, "naive", H200)
    check_device_memory(p, TILING, "fa2", H200)


def test_count_reports_the_footprint_and_illegality(capsys):
    argv = ["count", "--hardware", "h200-sxm", "--schedule", "naive", "--heads", "32",
            "--seq", "65536", "--head-dim", "128", "--json"]
    assert main(argv) == 0
    pred = json.loads(capsys.readouterr().out)
    assert pred["device_memory_bytes"] == 551_903_297_536
    assert pred["fits_device_memory"] is False and pred["legal"] is False
    assert all(k["legal"] for k in pred["kernels"])  # every CTA fits; the tensors do not


@pytest.mark.parametrize("command", ["simulate", "sweep"])
def test_simulating_a_problem_too_large_is_one_line(command, capsys):
    argv = [command, "--hardware", "h200-sxm", "--schedule", "naive", "--heads", "32",
            "--seq", "65536", "--head-dim", "128"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert "does not fit in device memory" in err and "151.40 GB" in err


@pytest.mark.parametrize("command", ["simulate", "sweep"])
def test_a_problem_too_large_builds_no_schedule(command, monkeypatch, capsys):
    """The table of compiles is looked up before the tilings are checked, and it needs the
    schedule's kernels: they come from a tiling whose tensors fit, and from none here
    (naive attention at 16x16 tiles, N = 64k, H = 32, has 2^29 QK CTAs: building its
    schedule took 19 GB and 83 s before saying it does not fit)."""
    import traces.schedules

    def refuse(problem, tiling, name):
        raise AssertionError(f"built {name} at {tiling}")

    monkeypatch.setattr(traces.schedules, "build_schedule", refuse)
    argv = [command, "--hardware", "h200-sxm", "--schedule", "naive", "--heads", "32",
            "--seq", "65536", "--head-dim", "128"]
    assert main(argv) == 2
    assert "does not fit in device memory" in capsys.readouterr().err


def test_compare_counts_naive_when_only_flashattention_fits():
    p = _problem()
    qkvo, nxn = _elements(p)
    small = dataclasses.replace(H200, hbm_bytes=2 * (4 * qkvo + nxn))  # no room for P
    preds = predict_pair(p, TILING, small)
    naive, fa2 = preds["naive"], preds["fa2"]
    assert naive["time_s"] is None and naive["legal"] is False
    assert "does not fit in device memory" in naive["note"]
    assert naive["bytes"]["global_write"] >= 2 * 2 * nxn  # S and P still counted
    assert fa2["time_s"] > 0 and fa2["legal"] is True and "note" not in fa2


def test_compare_refuses_when_flashattention_does_not_fit_either(monkeypatch):
    """Before naive attention is counted: at N = 10^8 its tiles alone would take tens of
    terabytes of the host's memory."""
    import simulator.prediction

    def refuse(*args, **kwargs):
        raise AssertionError("naive attention counted")

    monkeypatch.setattr(simulator.prediction, "count_prediction", refuse)
    small = dataclasses.replace(H200, hbm_bytes=1_000_000)
    with pytest.raises(DeviceMemoryError, match="fa2 does not fit"):
        predict_pair(_problem(), TILING, small)


def test_roofline_and_report_show_flashattention_alone_when_naive_does_not_fit(tmp_path):
    p = _problem()
    qkvo, nxn = _elements(p)
    small = dataclasses.replace(H200, hbm_bytes=2 * (4 * qkvo + nxn))  # no room for P
    gauge = roofline.roofline(p, TILING, small)
    assert {k["schedule"] for k in gauge["kernels"]} == {"fa2"}
    naive = gauge["schedules"]["naive"]
    assert naive["dram_bytes"] is None and naive["time_s"] is None
    counted = count_prediction(p, TILING, "naive", small)["flops"]  # counted all the same
    assert counted["tensor"] == 4 * nxn * p.head_dim
    assert naive["flops"] == counted["tensor"] + counted["exp"] + counted["other"]
    assert any(line.startswith("naive: not placed, naive does not fit in device memory")
               for line in roofline.notes(gauge))

    data = report.build(p, TILING, small, sweep_blocks=(32, 64))
    cmp = data["compare"]
    assert cmp["naive"]["time_s"] is None and cmp["naive"]["dram_bytes"] is None
    assert cmp["speedup"] is None and cmp["dram_ratio"] is None
    assert cmp["fa2"]["time_s"] > 0 and cmp["fa2"]["note"] is None
    assert cmp["footprint_ratio"] == (cmp["naive"]["hbm_footprint_bytes"]
                                      / cmp["fa2"]["hbm_footprint_bytes"])
    assert cmp["naive"]["hbm_footprint_bytes"] > small.hbm_bytes >= cmp["fa2"][
        "hbm_footprint_bytes"]
    page = report.html(data)
    assert "does not fit" in page and "not timed" in page
    # The page's numbers are still its data: a missing one is shown as "-", value null.
    assert 'data-key="compare.naive.time_s" data-value="null">-<' in page
    assert f'data-key="hardware.hbm_bytes" data-value="{small.hbm_bytes}"' in page
