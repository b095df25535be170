"""Where a kernel's register spills go: the bytes its main loop moves to L2 and back.

A kernel that runs out of registers keeps some of its values in local memory (ptxas's stack
frame) and stores and reloads them every iteration of its loop (``occupancy.
CompiledResources``: the bytes a thread stores and reloads per iteration, read from the
compile's SASS, and its stack frame). Local memory is cached in the SM's L1, which shares
its capacity with shared memory. The model:

- **Stores reach L2 whole.** L1 writes through: in the H200 records FA2's backward dK/dV
  at d = 128, 64 x 64, 4 warps, N = 4k (56 B stored and 80 B reloaded a thread each
  iteration, its 2 resident CTAs' frames 58 KB) wrote 2.08 GB to L2, where dK and dV are
  0.13 GB and its stores of spills 1.88 GB; it read 7.4 GB, less than its tiles alone, so
  its reloads hit L1.
- **Reloads hit L1 while the frames fit.** The L1 left to a kernel is the SM's unified
  data cache (the preset's ``l1_smem_per_sm_bytes``) less its resident CTAs' shared memory
  (with the per-CTA reserve, ``occupancy.SMEM_RESERVED_PER_CTA_BYTES``). The driver rounds
  the shared memory up to one of a few carve-outs (CUDA C++ Programming Guide: 0, 8, 16,
  32, 64, 100, 132, 164, 196 or 228 KB on 9.0), which can leave up to 32 KB less: not
  modelled. Beyond that capacity ``C`` the resident frames ``S`` go round it in the same
  order every iteration, and a reload misses with the probability ``m`` that solves
  ``m = 1 - exp(-m S / C)``: a line is reused after the others' misses, ``m S`` of them,
  each evicting it with probability ``1 / C`` (a cache that evicts at random; one that
  evicts the least recently used would miss every reload of such a loop). ``m`` is 0 up to
  ``S = C`` and rises towards 1 beyond it; no constant is fitted.

On the H200 records (BENCHMARKS.md, "Spills through L2"): FA2's forward at d = 128, 128 x 64,
4 warps (S / C = 78 / 62 KB, m = 0.38) stored 1.95 GB and reloaded 4.29 GB of spills, and
its L2 traffic exceeded its tiles' by 3.84 GB, where the rule gives 3.6; dK/dV at 128 x 64,
8 warps (118 / 94 KB, m = 0.38), by 11.9 GB where it gives 10.2 (its tiles' L2 is
over-predicted by 10-30% without spills, so the excess understates its spills: its
reloads may miss L1 more often than the rule says); the causal backward at 32 x 128,
4 warps (272 / 61.5 KB, m = 0.99), by 26.0 GB where it gives 24.8.

Where the preset does not give the L1's size, every reload is taken to reach L2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.hardware import Hardware
from simulator.occupancy import SMEM_RESERVED_PER_CTA_BYTES, CompiledResources, Residency


@dataclass(frozen=True)
class SpillTraffic:
    """Bytes one CTA's loop iteration moves between L1 and L2 for its spills."""

    reload_bytes: float  # reloads that miss L1, read from L2
    store_bytes: float  # stores, written through to L2

    @property
    def total_bytes(self) -> float:
        return self.reload_bytes + self.store_bytes


NO_SPILLS = SpillTraffic(0.0, 0.0)


def reload_miss_fraction(frames_bytes: float, l1_bytes: float | None) -> float:
    """The share of reloads that miss L1 (module docstring): 0 while the resident frames
    ``frames_bytes`` fit in ``l1_bytes``, else the root of ``m = 1 - exp(-m S / C)`` in
    (0, 1]; 1 where the L1's size is not known or nothing of it is left."""
    if l1_bytes is None or l1_bytes <= 0:
        return 1.0
    ratio = frames_bytes / l1_bytes
    if ratio <= 1.0:
        return 0.0
    # Bisect: 1 - exp(-m r) - m is above 0 between the two roots and below beyond the
    # larger (a fixed-point iteration crawls there where r is close to 1).
    low, high = 0.0, 1.0
    for _ in range(64):
        mid = 0.5 * (low + high)
        if 1.0 - math.exp(-mid * ratio) > mid:
            low = mid
        else:
            high = mid
    return 0.5 * (low + high)


def l1_left_bytes(residency: Residency, hw: Hardware) -> float | None:
    """The unified L1 an SM keeps beside its resident CTAs' shared memory; None where the
    preset does not give the L1's size."""
    if hw.l1_smem_per_sm_bytes is None:
        return None
    shared = residency.ctas_per_sm * (residency.smem_per_cta_bytes
                                      + SMEM_RESERVED_PER_CTA_BYTES)
    return float(max(hw.l1_smem_per_sm_bytes - shared, 0))


def spill_traffic(given: CompiledResources, residency: Residency, threads: int,
                  hw: Hardware) -> SpillTraffic:
    """L2 bytes of one CTA's loop iteration for its spills (module docstring); nothing
    where the compile does not say what the loop spills."""
    total = given.spill_bytes_per_iteration
    if not total:
        return NO_SPILLS
    stored = given.spill_store_bytes_per_iteration
    if stored is None:  # the split is not known: all of it counted as reloads
        stored = 0
    reloaded = total - stored
    frame = given.stack_frame_bytes
    frames = (frame if frame is not None else total) * threads * residency.ctas_per_sm
    miss = reload_miss_fraction(frames, l1_left_bytes(residency, hw))
    return SpillTraffic(reload_bytes=reloaded * threads * miss,
                        store_bytes=stored * threads)
