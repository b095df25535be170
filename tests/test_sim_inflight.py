"""HBM with few bytes in flight: Little's law with the queue, in both engines.

A kernel whose resident CTAs keep ``F`` bytes in flight moves its misses at
``B F / (F + L B)`` (``simulator.sim.costs``): each missed byte takes ``1 + L B / F`` bytes of
HBM's capacity. Decode's split kernel streams K and V once (every load misses), so its
simulated DRAM rate must follow that law, and the HBM timeline must still carry the bytes
DRAM really moved. That the latency inside the charge is not paid again after it (a lone
CTA waits one latency per load) is ``test_sim_compute``'s two-stage test, in both engines.
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator.hardware import load_hardware
from simulator.sim import run
from simulator.sim.costs import CtaCosts, miss_occupancy
from simulator.sim.program import schedule_programs
from traces.problem import AttentionProblem
from traces.schedules import build_schedule
from traces.tiling import Tiling

HW = load_hardware("h200-sxm")
# Decode at the records' shape, shorter: 512 CTAs of 4 warps, all resident in one wave.
DECODE = AttentionProblem(16, 32, 1, 64, seq_kv=4096, kv_heads=8)


def _split_costs(tiling: Tiling) -> tuple[CtaCosts, int]:
    schedule = build_schedule(DECODE, tiling, "decode")
    prog = schedule_programs(schedule, HW)[0]
    assert prog.name == "decode_split"
    slots = min(HW.sm_count * prog.residency.ctas_per_sm, prog.grid)
    return CtaCosts(prog, HW, tiling.num_stages, len(schedule.tensors)), slots


def test_occupancy_is_one_plus_the_latency_bandwidth_product_over_the_bytes_in_flight():
    lb = HW.hbm_latency_s * HW.hbm_effective_bytes_per_s
    assert miss_occupancy(HW, lb) == pytest.approx(2.0)
    assert miss_occupancy(HW, 4 * lb) == pytest.approx(1.25)
    assert miss_occupancy(HW, 0.0) == 1.0
    assert miss_occupancy(HW, lb, 0.5) == pytest.approx(1.5)


def test_bytes_in_flight_are_the_resident_ctas_tiles_ahead():
    costs, slots = _split_costs(Tiling(block_m=16, block_n=32, num_stages=2, split_kv=4))
    assert slots == 512  # 16 x 8 K/V heads x 4 splits, all resident
    # Two stages: one iteration's K and V tiles ahead, 32 rows x 64 x 2 bytes each.
    assert costs.inflight_bytes(slots) == pytest.approx(512 * 2 * 32 * 64 * 2)
    three, _ = _split_costs(Tiling(block_m=16, block_n=32, num_stages=3, split_kv=4))
    assert three.inflight_bytes(slots) == pytest.approx(2 * costs.inflight_bytes(slots))


@pytest.mark.parametrize("mode", ["full", "aggregated"])
def test_a_streaming_kernel_moves_its_bytes_at_the_rate_littles_law_allows(mode):
    rates, laws = {}, {}
    for block_n in (32, 128):
        tiling = Tiling(block_m=16, block_n=block_n, num_stages=2, split_kv=4)
        costs, slots = _split_costs(tiling)
        inflight = costs.inflight_bytes(slots)
        law = laws[block_n] = HW.hbm_effective_bytes_per_s / miss_occupancy(HW, inflight)
        split = run(DECODE, tiling, "decode", HW, mode).runs[0]
        body = split.end_s - split.start_s
        rates[block_n] = split.dram_read / body
        # The split kernel's own latencies and start-up come on top of the law's rate.
        assert 0.8 * law <= rates[block_n] <= 1.02 * law, (block_n, rates[block_n], law)
    # 4.2 MB in flight reach about 3.2 TB/s, 16.8 MB about 4.0: below the preset's rate,
    # and the more in flight the faster, as the law has it.
    assert rates[32] < 0.75 * HW.hbm_effective_bytes_per_s
    assert rates[128] / rates[32] == pytest.approx(laws[128] / laws[32], rel=0.1)


@pytest.mark.parametrize("mode", ["full", "aggregated"])
def test_the_hbm_timeline_carries_the_bytes_dram_moved(mode):
    tiling = Tiling(block_m=16, block_n=32, num_stages=2, split_kv=4)
    # The split kernel, not the last one: the last kernel's dirty data is counted as
    # written but never timed (``record.KernelRun``).
    split = run(DECODE, tiling, "decode", HW, mode).runs[0]
    seg = split.hbm_segments
    carried = float(np.sum((seg[:, 1] - seg[:, 0]) * seg[:, 2]))
    moved = split.dram_read + split.dram_write
    assert split.dram_read > 30e6  # K and V, 33.5 MB, each byte once
    assert carried == pytest.approx(moved, rel=0.01)
