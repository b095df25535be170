"""A warp's pace through its loop, from records: ``validation.pace`` (SYNTHETIC records)."""

from __future__ import annotations

import json

import pytest
from synthetic_records import record

from simulator.hardware import load_hardware
from traces.problem import AttentionProblem
from traces.tiling import Tiling
from validation import pace

H200 = load_hardware("h200-sxm")


def _timed(schedule, problem, tiling, durations: dict, facts: list[dict]) -> dict:
    rec = record(schedule, problem, tiling, sum(durations.values()))
    rec["counters"] = {"kernels": [{"name": name, "duration_s": seconds}
                                   for name, seconds in durations.items()]}
    rec["kernel_facts"] = facts
    return rec


def test_cycles_per_instruction_by_hand():
    """FA2's forward at N = 1k, 16 heads, 128 x 32 with 4 warps: 128 CTAs of 32 iterations
    (4,096); at 165 registers an SM holds 3 CTAs, so all 128 run at once. 100 us at the
    matmul clock (1.789 GHz) is 100e-6 x 1.789e9 x 128 / 4096 = 5,590.6 cycles an iteration,
    12.54 for each of its 446 instructions. Half the time: half the cycles. Naive softmax
    has no loop, naive_qk's loop no instructions in its facts, and a record without the
    kernel's duration says nothing: none counts."""
    problem, tiling = AttentionProblem(1, 16, 1024, 128), Tiling(128, 32, 3, 4)
    fast = _timed("fa2", problem, tiling, {"fa2_fwd": 50e-6},
                  [{"name": "fa2_fwd", "registers": 165, "shared_bytes": 40960,
                    "loop_instructions": 446}])
    slow = json.loads(json.dumps(fast))
    slow["record_id"] += "-slow"
    slow["counters"]["kernels"][0]["duration_s"] = 100e-6
    untimed = json.loads(json.dumps(fast))
    untimed["counters"] = None
    naive = _timed("naive", AttentionProblem(1, 16, 1024, 64), Tiling(64, 64),
                   {"naive_qk": 1e-4, "naive_softmax": 1e-4, "naive_pv": 1e-4},
                   [{"name": "naive_qk", "registers": 62, "shared_bytes": 16384},
                    {"name": "naive_softmax", "registers": 20, "shared_bytes": 16,
                     "straight_instructions": 200}])
    paces = pace.loop_paces([slow, naive, fast, untimed], H200)
    assert [p["record_id"] for p in paces] == [fast["record_id"], slow["record_id"]]
    assert paces[1]["resident"] == 128 and paces[1]["iterations"] == 4096
    assert paces[1]["cycles_per_iteration"] == pytest.approx(100e-6 * 1.789e9 * 128 / 4096)
    assert paces[1]["cycles_per_instruction"] == pytest.approx(5590.625 / 446)
    assert paces[0]["cycles_per_instruction"] == pytest.approx(5590.625 / 446 / 2)
    # the instructions around its loops count too: 128 CTAs of 32 x 446 + 435 + 1,014
    around = json.loads(json.dumps(slow))
    around["kernel_facts"][0].update(prologue_instructions=435, epilogue_instructions=1014)
    (paced,) = pace.loop_paces([around], H200)
    assert paced["issued"] == 128 * (32 * 446 + 435 + 1014)
    assert paced["cycles_per_instruction"] == pytest.approx(
        100e-6 * 1.789e9 * 128 / (128 * (32 * 446 + 1449)))
    # causal at 128 x 32: Q block i visits 4 (i + 1) K/V blocks (16 heads x 4 x 36), the
    # last 4 of them on its diagonal, masked
    causal = _timed("fa2", AttentionProblem(1, 16, 1024, 128, causal=True), tiling,
                    {"fa2_fwd": 100e-6}, [{"name": "fa2_fwd", "registers": 165,
                                           "shared_bytes": 40960, "loop_instructions": 446,
                                           "masked_loop_instructions": 600}])
    (paced,) = pace.loop_paces([causal], H200)
    assert paced["iterations"] == 16 * 4 * 36
    assert paced["issued"] == paced["iterations"] * 446 + 128 * 4 * (600 - 446)


def test_cli_lists_the_fastest_first_and_says_when_nothing_counts(tmp_path, capsys):
    problem, tiling = AttentionProblem(1, 16, 1024, 128), Tiling(128, 32, 3, 4)
    rec = _timed("fa2", problem, tiling, {"fa2_fwd": 100e-6},
                 [{"name": "fa2_fwd", "registers": 165, "shared_bytes": 40960,
                   "loop_instructions": 446}])
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    assert pace.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "12.54" in out and "the fewest cycles per instruction: 12.54" in out
    del rec["kernel_facts"][0]["loop_instructions"]
    path.write_text(json.dumps(rec) + "\n")
    assert pace.main([str(path)]) == 2
    assert "no record has" in capsys.readouterr().err
    assert pace.main([str(tmp_path / "missing.jsonl")]) == 2
    assert "not found" in capsys.readouterr().err
