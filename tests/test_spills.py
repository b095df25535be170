"""Register spills that reach L2 (``simulator.spills``): every store, and the reloads that
miss the L1 shared memory leaves. The compile facts are the table's rows (sm_90, Triton
3.6.0) of the H200 records' spilling kernels."""

from __future__ import annotations

import dataclasses
import math

import pytest

from simulator.hardware import HardwareError, load_hardware
from simulator.occupancy import SMEM_RESERVED_PER_CTA_BYTES, CompiledResources, Residency
from simulator.sim import predict, run
from simulator.sim.fluid import ERROR_BOUND
from simulator.spills import NO_SPILLS, l1_left_bytes, reload_miss_fraction, spill_traffic
from traces.problem import AttentionProblem
from traces.tiling import Tiling

H200 = load_hardware("h200-sxm")
# dK/dV of the causal backward at d = 128, 32 x 128, 2 stages, 4 warps: 255 registers, a
# stack frame of 1,088 B a thread, 860 B reloaded and 648 B stored each iteration
BACKWARD_32X128 = CompiledResources(255, 98560, spill_bytes_per_iteration=860 + 648,
                                    spill_reload_waits=8, spill_store_bytes_per_iteration=648,
                                    stack_frame_bytes=1088)
# dK/dV at d = 128, 64 x 64, 4 warps: 80 B reloaded and 56 B stored, a frame of 232 B
BACKWARD_64X64 = CompiledResources(255, 99328, spill_bytes_per_iteration=80 + 56,
                                   spill_reload_waits=3, spill_store_bytes_per_iteration=56,
                                   stack_frame_bytes=232)


def test_reloads_hit_l1_while_the_resident_frames_fit():
    assert reload_miss_fraction(59392, 61440) == 0.0
    assert reload_miss_fraction(61440, 61440) == 0.0


@pytest.mark.parametrize("ratio", [1.001, 1.258, 2.0, 4.42, 30.0])
def test_the_miss_fraction_is_the_root_of_its_equation(ratio):
    """``m = 1 - exp(-m S / C)``: the root above 0 (0 solves it too, and is wrong beyond
    the capacity)."""
    miss = reload_miss_fraction(ratio * 4096, 4096)
    assert 0.0 < miss <= 1.0
    assert miss == pytest.approx(1.0 - math.exp(-miss * ratio), abs=1e-9)


def test_misses_grow_with_the_frames_towards_all():
    ratios = [1.1, 1.5, 2.0, 3.0, 5.0, 10.0]
    misses = [reload_miss_fraction(r, 1.0) for r in ratios]
    assert misses == sorted(misses) and len(set(misses)) == len(misses)
    assert misses[-1] > 0.9999


def test_without_the_l1_size_every_reload_reaches_l2():
    assert reload_miss_fraction(1.0, None) == 1.0
    assert reload_miss_fraction(1.0, 0.0) == 1.0
    unknown = dataclasses.replace(H200, l1_smem_per_sm_bytes=None)
    res = Residency(2, "registers", 99328, 255)
    assert l1_left_bytes(res, unknown) is None
    traffic = spill_traffic(BACKWARD_64X64, res, 128, unknown)
    assert traffic.reload_bytes == 80 * 128 and traffic.store_bytes == 56 * 128


def test_frames_beyond_l1_send_nearly_every_reload_to_l2():
    """Two resident CTAs of 128 threads with 1,088 B frames: 272 KB in the 61.5 KB that
    their shared memory leaves of the H200's 256 KB."""
    res = Residency(2, "registers", 98560, 255)
    left = 262144 - 2 * (98560 + SMEM_RESERVED_PER_CTA_BYTES)
    assert l1_left_bytes(res, H200) == left
    traffic = spill_traffic(BACKWARD_32X128, res, 128, H200)
    miss = reload_miss_fraction(1088 * 128 * 2, left)
    assert 0.98 < miss < 1.0
    assert traffic.store_bytes == 648 * 128
    assert traffic.reload_bytes == pytest.approx(860 * 128 * miss)


def test_frames_that_fit_send_only_the_stores():
    res = Residency(2, "registers", 99328, 255)  # 58 KB of frames in 60 KB
    traffic = spill_traffic(BACKWARD_64X64, res, 128, H200)
    assert traffic.reload_bytes == 0.0 and traffic.store_bytes == 56 * 128


def test_what_the_compile_does_not_say_is_not_guessed():
    res = Residency(2, "registers", 99328, 255)
    assert spill_traffic(CompiledResources(255, 99328), res, 128, H200) is NO_SPILLS
    split_unknown = CompiledResources(255, 99328, spill_bytes_per_iteration=136)
    traffic = spill_traffic(split_unknown, res, 128, H200)  # all counted as reloads
    assert traffic.store_bytes == 0.0
    # no frame: the bytes per iteration stand for it (136 B x 256 threads fit)
    assert traffic.reload_bytes == 0.0


def test_l1_below_shared_memory_is_refused():
    with pytest.raises(HardwareError, match="l1_smem_per_sm_bytes is below"):
        dataclasses.replace(H200, l1_smem_per_sm_bytes=H200.smem_per_sm_bytes - 1)


PROBLEM = AttentionProblem(4, 8, 2048, 128, causal=True, pass_="bwd")
TILING = Tiling(32, 128, 2, 4)


def _dkdv(pred: dict) -> dict:
    return next(k for k in pred["kernels"] if k["name"] == "fa2_bwd_dkdv")


def test_predicted_local_bytes_are_the_iterations_spills():
    """Exact: every iteration of every CTA stores 648 B a thread, and reloads the share of
    860 B that misses L1."""
    from traces.schedules import build_schedule

    spilled = {"fa2_bwd_dkdv": BACKWARD_32X128}
    pred, _ = predict(PROBLEM, TILING, "fa2", H200, compiled=spilled)
    kernel = next(k for k in build_schedule(PROBLEM, TILING, "fa2").kernels
                  if k.name == "fa2_bwd_dkdv")
    iterations = int(kernel.loop_count.sum())
    traffic = spill_traffic(BACKWARD_32X128, Residency(2, "registers", 98560, 255), 128, H200)
    dkdv = _dkdv(pred)
    assert dkdv["ctas_per_sm"] == 2
    assert dkdv["bytes"]["local_write"] == 648 * 128 * iterations
    assert dkdv["bytes"]["local_read"] == round(traffic.reload_bytes * iterations)
    assert pred["bytes"]["local_write"] == dkdv["bytes"]["local_write"]
    others = [k for k in pred["kernels"] if k["name"] != "fa2_bwd_dkdv"]
    assert all(k["bytes"]["local_read"] == k["bytes"]["local_write"] == 0 for k in others)


@pytest.mark.parametrize("mode", ["full", "aggregated"])
def test_spills_through_l2_take_its_bandwidth(mode):
    """With its spills crossing L2, dK/dV takes at least all its L2 bytes at L2's
    effective rate, and longer than with them hitting L1 (an L1 the frames fit in)."""
    spilled = {"fa2_bwd_dkdv": BACKWARD_32X128}
    pred, _ = predict(PROBLEM, TILING, "fa2", H200, mode=mode, compiled=spilled)
    dkdv = _dkdv(pred)
    moved = sum(dkdv["bytes"][k] for k in ("global_read", "global_write", "local_read",
                                           "local_write"))
    assert dkdv["time_s"] >= moved / H200.l2_effective_bytes_per_s
    roomy = dataclasses.replace(H200, l1_smem_per_sm_bytes=2**30)  # reloads all hit L1
    cached, _ = predict(PROBLEM, TILING, "fa2", roomy, mode=mode, compiled=spilled)
    assert _dkdv(cached)["bytes"]["local_read"] == 0
    assert _dkdv(cached)["time_s"] < dkdv["time_s"]
    assert dkdv["utilization"]["l2"] > 0.5 and dkdv["bound"] == "l2"


def test_the_engines_agree_on_spilling_kernels():
    spilled = {"fa2_bwd_dkdv": BACKWARD_32X128}
    full = run(PROBLEM, TILING, "fa2", H200, "full", spilled)
    fast = run(PROBLEM, TILING, "fa2", H200, "aggregated", spilled)
    for a, b in zip(full.runs, fast.runs, strict=True):
        assert b.time_s == pytest.approx(a.time_s, rel=ERROR_BOUND["time"]), a.name


def test_the_totals_table_shows_the_spills_l2_traffic():
    """``tilesim simulate`` prints what the spills move through L2 beside the tiles'."""
    from io import StringIO

    from rich.console import Console

    from simulator.cli.render import counts_tables, fmt_bytes

    def totals(pred):
        out = StringIO()
        Console(file=out, width=200).print(counts_tables(pred)[-1])
        return out.getvalue()

    pred, _ = predict(PROBLEM, TILING, "fa2", H200, compiled={"fa2_bwd_dkdv": BACKWARD_32X128})
    b = pred["bytes"]
    line = f"{fmt_bytes(b['local_read'])} / {fmt_bytes(b['local_write'])}"
    assert "spills through L2 read / write" in totals(pred) and line in totals(pred)
    plain, _ = predict(PROBLEM, TILING, "fa2", H200)
    assert "spills through L2" not in totals(plain)


def test_compare_shows_the_spills_of_the_tables_compile(capsys):
    """FA2's forward at d = 128, 128 x 64, 4 warps spills in the table of compiles
    (Triton 3.6.0: 255 registers, 256 B reloaded and 116 B stored a thread each
    iteration): ``tilesim compare`` shows its spills' L2 bytes, which ``--json`` carries as
    the prediction's ``local_read`` and ``local_write``; naive attention spills none."""
    import json

    from simulator.cli import main

    argv = ["compare", "--hardware", "h200-sxm", "--batch", "1", "--heads", "16", "--seq",
            "1024", "--head-dim", "128", "--block-m", "128", "--block-n", "64", "--stages",
            "2", "--warps", "4"]
    assert main(argv + ["--json"]) == 0
    preds = json.loads(capsys.readouterr().out)
    fa2, naive = preds["fa2"]["bytes"], preds["naive"]["bytes"]
    assert naive["local_read"] == naive["local_write"] == 0
    # every store reaches L2: 116 B x 128 threads an iteration, 16 iterations (1024 / 64)
    # of 128 CTAs (16 heads x 1024 / 128)
    assert preds["fa2"]["kernels"][0]["spill_bytes_per_iteration"] == 256 + 116
    assert fa2["local_write"] == 116 * 128 * 16 * 128
    assert 0 < fa2["local_read"] < 256 * 128 * 16 * 128
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert "spills through L2 read" in out and "spills through L2 write" in out
    # and says whose bytes those are, and where to look for a tiling without them
    assert ("fa2: fa2_fwd at this tiling compiles to 255 registers a thread and spills "
            "372 bytes a thread every iteration") in out
    assert "tilesim sweep --schedule fa2" in out and "naive:" not in out
    # with 8 warps the same tile fits in registers: no note
    assert main([*argv[:-1], "8"]) == 0
    out = capsys.readouterr().out
    assert "spills through L2" not in out and "every iteration" not in out
