"""Held L2 decisions: the aggregated engine timed again at other rates without the replay.

Calibration's Jacobian times a configuration at rates a step away from a point with the
L2 model's decisions at the point held (``simulator.sim.fluid.HeldL2``). At the point
itself that must be the exact run, to the last bit; a step away, the held run moves the
bytes the point moved, and its time differs from the exact run's only by what L2 decides
differently there.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simulator.hardware import load_hardware
from simulator.sim import run
from traces.problem import AttentionProblem
from traces.tiling import Tiling
from validation.predict import held_l2_times_for, predict, predict_times

HW = load_hardware("h200-sxm")
# One-shot CTAs of naive attention (merged jobs, queued bodies) and a looping causal FA2
# forward and backward (pass C refined, several kernels), all in the aggregated engine.
CASES = {
    "naive": ("naive", AttentionProblem(1, 4, 2048, 64), Tiling(32, 32)),
    "fa2 causal": ("fa2", AttentionProblem(1, 8, 2048, 128, causal=True), Tiling(64, 64)),
    "fa2 backward": ("fa2", AttentionProblem(1, 4, 1024, 64, pass_="bwd"), Tiling(64, 64)),
}
# Rates a few per cent away, as a Jacobian's step (and more).
MOVED = {"hbm": dataclasses.replace(HW, hbm_efficiency=HW.hbm_efficiency * 0.97),
         "l2": dataclasses.replace(HW, l2_efficiency=HW.l2_efficiency * 0.9),
         "tensor and launch": dataclasses.replace(HW, tensor_efficiency=0.5,
                                                  kernel_launch_overhead_s=7e-6)}


def _dram(sim) -> list[int]:
    return [int(r.dram_read + r.dram_write) for r in sim.runs]


@pytest.mark.parametrize("case", sorted(CASES))
def test_held_decisions_at_the_same_rates_are_the_exact_run(case):
    schedule, problem, tiling = CASES[case]
    plain = run(problem, tiling, schedule, HW, mode="aggregated")
    captured = run(problem, tiling, schedule, HW, mode="aggregated", capture_l2=True)
    assert plain.held_l2 is None
    assert len(captured.held_l2.kernels) == len(captured.runs) >= 1
    held = run(problem, tiling, schedule, HW, mode="aggregated", held_l2=captured.held_l2)
    assert captured.time_s == plain.time_s == held.time_s
    for a, b in zip(plain.runs, held.runs, strict=True):
        assert (a.start_s, a.end_s) == (b.start_s, b.end_s)
        assert np.array_equal(a.tensor_bytes, b.tensor_bytes)
        assert a.flush_bytes == b.flush_bytes and a.tile_accesses == b.tile_accesses
        assert np.array_equal(a.cta_end, b.cta_end)


@pytest.mark.parametrize("moved", sorted(MOVED))
@pytest.mark.parametrize("case", sorted(CASES))
def test_held_decisions_at_other_rates_move_the_same_bytes_and_nearly_the_time(case, moved):
    schedule, problem, tiling = CASES[case]
    hw = MOVED[moved]
    point = run(problem, tiling, schedule, HW, mode="aggregated", capture_l2=True)
    exact = run(problem, tiling, schedule, hw, mode="aggregated")
    held = run(problem, tiling, schedule, hw, mode="aggregated", held_l2=point.held_l2)
    assert _dram(held) == _dram(point)
    if moved == "tensor and launch":  # a launch costs more: every schedule is slower
        assert held.time_s > point.time_s
    # what L2 decides differently at the new timing (which CTA's tiles hit, if not how
    # many) is all that separates them
    assert held.time_s == pytest.approx(exact.time_s, rel=0.01)


def test_held_decisions_belong_to_one_aggregated_configuration():
    schedule, problem, tiling = CASES["fa2 backward"]
    captured = run(problem, tiling, schedule, HW, mode="aggregated", capture_l2=True)
    with pytest.raises(ValueError, match="full"):
        run(problem, tiling, schedule, HW, mode="full", held_l2=captured.held_l2)
    assert run(problem, tiling, schedule, HW, mode="full", capture_l2=True).held_l2 is None
    forward = dataclasses.replace(problem, pass_="fwd")
    with pytest.raises(ValueError, match="kernels"):
        run(forward, tiling, schedule, HW, mode="aggregated", held_l2=captured.held_l2)


def test_predict_times_is_exact_at_the_first_rates_and_in_the_full_engine():
    schedule, problem, tiling = CASES["naive"]  # above the full engine's limit: aggregated
    hws = [HW, MOVED["hbm"], MOVED["l2"]]
    times = predict_times(problem, tiling, schedule, hws)
    assert times[0] == predict(problem, tiling, schedule, HW)["time_s"]
    assert times[1] != times[0] and times[2] != times[0]
    small = AttentionProblem(1, 2, 256, 64)  # the full engine: every time exact
    tiny = predict_times(small, Tiling(64, 64), "fa2", hws)
    assert tiny == [predict(small, Tiling(64, 64), "fa2", hw)["time_s"] for hw in hws]


def test_only_the_simulator_is_given_held_decisions():
    assert held_l2_times_for(predict) is predict_times
    assert held_l2_times_for(lambda *a, **k: {"time_s": 1.0}) is None
