"""Shared-memory operand reads of mma.sync matmuls (traces.schedules.mma_layout)."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.hardware import load_hardware
from simulator.sim.compute import sm_rates, uses_wgmma
from simulator.sim.program import schedule_programs
from traces.problem import AttentionProblem
from traces.schedules import build_schedule
from traces.schedules.mma_layout import Dot, smem_bytes_per_flop, smem_read_bytes, warps_per_tile
from traces.tiling import Tiling
from validation.records import latest_per_config, read_records

RECORDS = Path(__file__).resolve().parents[1] / "validation/records/h200-default-2026-11-30.jsonl"


@pytest.mark.parametrize("m,n,warps,chained,expected", [
    (32, 32, 4, True, (4, 1)),  # attention: every warp along M when M >= N
    (16, 64, 4, True, (1, 4)),  # ... and along N when M < N
    (16, 32, 4, False, (1, 4)),  # 1 x 4 instruction tiles: split N
    (32, 32, 4, False, (2, 2)),  # 2 x 4: N once, then M
    (64, 64, 8, False, (2, 4)),  # 4 x 8: N, M, then N again
    (16, 8, 4, False, (4, 1)),  # one instruction tile: the extra warps go along M
])
def test_warps_per_tile_follows_triton(m, n, warps, chained, expected):
    assert warps_per_tile(m, n, warps, chained) == expected


def test_operand_reads_by_hand():
    # Lone [32, 64] x [64, 32] bf16 product on 4 warps laid 2 x 2: A (4 KB) read by the two
    # warps along N, B (4 KB) by the two along M.
    assert smem_read_bytes([Dot(32, 32, 64)], 4, 2, chained=False) == 2 * 4096 + 2 * 4096
    # FA2's forward loop at 32 x 32, d = 64, 4 warps along M: K and V (4 KB each) read by
    # every warp; Q stays in registers and P is re-laid in registers (one warp per row).
    fwd = [Dot(32, 32, 64, a="regs"), Dot(32, 64, 32, a="result")]
    assert smem_read_bytes(fwd, 4, 2, chained=True) == 4 * 4096 + 4 * 4096
    # At 16 x 64 the warps split N: K and V are read once, P (2 KB) goes through shared
    # memory: written once and read by the four warps.
    fwd = [Dot(16, 64, 64, a="regs"), Dot(16, 64, 64, a="result")]
    assert smem_read_bytes(fwd, 4, 2, chained=True) == 8192 + 5 * 2048 + 8192
    assert smem_bytes_per_flop(fwd, 4, 2, True) == pytest.approx(
        (8192 + 5 * 2048 + 8192) / (2 * 2 * 16 * 64 * 64))
    assert smem_bytes_per_flop([], 4, 2, True) == 0.0


# Largest |error| of the predicted shared-memory bytes against Nsight Compute's, per kernel,
# over the H200 records with N <= 2048 (when the rule was written: naive_qk 0.0%, naive_pv
# 6.5%, FA2 forward 27.9%, dQ 28.6%, dK/dV 36.6%, decode's split 52.9%).
BOUND_PCT = {"naive_qk": 0.5, "naive_pv": 8, "fa2_fwd": 30, "fa2_bwd_dq": 30,
             "fa2_bwd_dkdv": 40, "decode_split": 55}


def test_shared_bytes_of_mma_sync_kernels_against_the_h200_counter():
    """Every mma.sync kernel of the H200 records (N <= 2048): Nsight Compute's shared-memory
    bytes against the model's — the copies of the loaded tiles into shared memory plus the
    operand reads it times (the ``smem`` unit), plus, for naive_qk, the output tile's trip
    through shared memory (written, then read, for coalesced stores). Exact for naive_qk;
    FA2's and decode's kernels move more than the rule knows of in some layouts (conversions
    between the chained matmuls) and less in others (BOUND_PCT)."""
    hw = load_hardware("h200-sxm")
    records, _ = read_records(RECORDS)
    worst: dict[str, float] = {}
    for rec in latest_per_config(records)[0]:
        if rec.get("implementation") != "triton" or rec["problem"]["seq_kv"] > 2048:
            continue
        problem, tiling = AttentionProblem.from_dict(rec["problem"]), Tiling.from_dict(
            rec["tiling"])
        schedule = build_schedule(problem, tiling, rec["schedule"])
        facts = {f["name"]: f for f in rec["kernel_facts"]}
        measured = {k["name"]: k["smem_bytes"] for k in rec["counters"]["kernels"]}
        for kernel, prog in zip(schedule.kernels, schedule_programs(schedule, hw), strict=True):
            if kernel.mma_rows == 0 or uses_wgmma(hw, kernel.mma_rows, tiling.num_warps):
                continue
            # the device's compile agrees: no wgmma in this kernel
            assert facts[kernel.name].get("wgmma_smem_bytes_per_flop") is None
            totals = prog.totals()
            reads = totals["unit_s"][3].sum() * sm_rates(hw, problem.dtype, wgmma=False)[3]
            predicted = reads + totals["load_bytes"].sum()
            if kernel.name == "naive_qk":
                predicted += 2 * tiling.block_m * tiling.block_n * problem.elem_bytes * kernel.grid
            error = abs(predicted / measured[kernel.name] - 1) * 100
            worst[kernel.name] = max(worst.get(kernel.name, 0.0), error)
    assert set(worst) == set(BOUND_PCT)
    for name, error in worst.items():
        assert error <= BOUND_PCT[name], (name, error)
