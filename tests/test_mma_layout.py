"""Shared-memory operand reads of mma.sync matmuls (traces.schedules.mma_layout)."""

from __future__ import annotations

from pathlib import Path

import pytest

from traces.schedules.mma_layout import Dot, smem_bytes_per_flop, smem_read_bytes, warps_per_tile
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


def _naive_qk_records():
    records, _ = read_records(RECORDS)
    kept, _ = latest_per_config(records)
    for rec in kept:
        facts = {f["name"]: f for f in rec.get("kernel_facts") or ()}
        qk = facts.get("naive_qk")
        if qk and qk.get("wgmma_smem_bytes_per_flop") is None and rec.get("counters"):
            yield rec


def test_naive_qk_shared_bytes_match_the_h200_counter():
    """naive_qk on the H200 with mma.sync: Nsight Compute's shared-memory bytes are exactly
    the copies of the Q and K tiles into shared memory, the operand reads of this module and
    the output tile's trip through shared memory (written, then read, for coalesced stores)."""
    checked = 0
    for rec in _naive_qk_records():
        p, t = rec["problem"], rec["tiling"]
        bm, bn, d, s = t["block_m"], t["block_n"], p["head_dim"], 2
        tiles = (p["seq_q"] // bm) * (p["seq_kv"] // bn) * p["batch"] * p["heads"]
        per_cta = ((bm + bn) * d * s + smem_read_bytes([Dot(bm, bn, d)], t["num_warps"], s,
                                                       chained=False) + 2 * bm * bn * s)
        measured = next(k for k in rec["counters"]["kernels"] if k["name"] == "naive_qk")
        assert measured["smem_bytes"] == pytest.approx(tiles * per_cta, rel=0.005), \
            rec["record_id"]
        checked += 1
    assert checked >= 20
