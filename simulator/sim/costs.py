"""What each CTA of a kernel costs, as the aggregated engine's phases.

From a kernel's program (``program``), per CTA: bytes loaded and stored by phase of the
program, compute seconds, and — given its L2 misses — the four phases the fluid runs it as
(``fluid``): the latency of its first loads, their transfer, the body, the last stores.
Each phase is ``(B, M, K, CP)``: bytes through L2 and the SM's port (the body's include its
spills that reach L2, ``simulator.spills``), bytes through HBM,
busy seconds of its SM's units (``compute.busy_seconds``), and its critical path alone on
the GPU (which counts each compute step's critical path, ``simulator.sim.compute``).

**HBM with few bytes in flight** (``miss_occupancy``, both engines). A kernel whose
resident CTAs have ``F`` bytes of loads in flight at a time gets HBM's rate ``B`` only if
``F`` covers HBM's latency ``L``: a round of requests returns after the latency plus the
departure of every byte ahead of it, ``L + F / B`` (the memory waiting period of Hong and
Kim's analytical GPU model, ISCA 2009), so its misses move at ``B F / (F + L B)`` — Little's
law with the queue. The engines charge each missed byte ``1 + L B / F`` bytes of HBM's
capacity, which gives that rate when misses alone keep HBM busy, and leaves write-backs,
which no CTA waits for, at full rate; the latency inside that charge is the load's own,
not paid again after it (``full``). ``F`` (``inflight_bytes``) is the resident CTAs' loads
ahead of the one they wait for — ``num_stages - 1`` iterations' loads, a one-shot CTA's
first loads — counting every load in flight, hits included, with the preset's latency
and effective rate: no constant of its own. The first wave's first loads are the
exception: every CTA waits out their latency at once, before any byte moves, so they take
HBM's capacity byte for byte (the fluid's latency phase; ``full``). On the H200 records
decode's split kernel at N = 16k, d = 64 reaches 3.0 TB/s with 4.2 MB in flight and 4.3
TB/s with 16.8 MB; the law gives 3.2 and 4.0 (BENCHMARKS.md, "HBM with few bytes in
flight").

**Reads of parts of lines.** A missed byte of a load whose contiguous runs are shorter than
an L2 line takes ``w = line / run`` bytes of HBM's transfer (``program.hbm_line_cost``), so
with the latency's share it takes ``w + L B / F``: the waiting period with each request
served ``w`` times slower. The DRAM bytes stay the bytes read."""

from __future__ import annotations

import numpy as np

from simulator.hardware import Hardware
from simulator.sim.bandwidth import sm_port_bytes_per_s
from simulator.sim.program import KernelProgram, segment_sums
from traces.schedules.base import LOAD, STORE

FOLD = 0.05  # fold a CTA's short phases into its body below this share of it
# How much a CTA's latencies differ from the preset's, either way: Luo et al. measured L2
# hits at 258 cycles near and 414 far on the H100, (414 - 258) / (414 + 258) = 0.232 about
# their mean. Identical CTAs with identical latencies stay in lock-step in an engine (all
# load, then all compute, the memory idle meanwhile), which no GPU does; the spread also
# sets them apart (BENCHMARKS.md, "The full engine's lock-step is knife-edge").
LATENCY_SPREAD = 0.232
_GOLDEN = 0.6180339887498949


def miss_occupancy(hw: Hardware, inflight_bytes: float, scale=1.0):
    """How many bytes of HBM's capacity one missed byte takes with ``inflight_bytes`` of
    loads in flight: ``1 + L B / F`` (module docstring), with HBM's latency scaled by
    ``scale`` (a CTA's ``latency_factor``, or an array of them); 1 with nothing in flight."""
    if inflight_bytes <= 0:
        return np.ones_like(np.asarray(scale, dtype=np.float64))
    return 1.0 + scale * hw.hbm_latency_s * hw.hbm_effective_bytes_per_s / inflight_bytes


def latency_factor(cta):
    """The factor on CTA ``cta``'s latencies (an int or an array of them): spread evenly
    over ``1 +- LATENCY_SPREAD`` by a low-discrepancy sequence of the CTA's index, so that
    any run of consecutive CTAs averages close to 1. Both engines use it."""
    return 1.0 + LATENCY_SPREAD * (2.0 * ((np.asarray(cta) * _GOLDEN) % 1.0) - 1.0)


class CtaCosts:
    """Per-CTA bytes and seconds of one kernel, by phase of the program (length ``grid``)."""

    def __init__(self, prog: KernelProgram, hw: Hardware, stages: int, tensors: int):
        self.hw = hw
        # Loop iterations whose loads are issued ahead of the one waited for: Triton's
        # ``num_stages - 1`` (``kernels.resources.loop_pipeline``); one at one stage.
        self.ahead = max(stages - 1, 1)
        self.latency_scale = latency_factor(np.arange(prog.grid))
        reps = np.arange(prog.grid) % prog.period
        count, first = prog.loop_count[: prog.period], prog.loop_first

        def loop(values: np.ndarray) -> np.ndarray:
            return segment_sums(values, first, count)[..., reps]

        self.n = prog.loop_count.astype(np.float64)
        self.pre_load = prog.pre.bytes_of(LOAD).astype(np.float64)
        self.loop_load = loop(prog.loop.bytes_of(LOAD)).astype(np.float64)
        self.post_load = prog.post.bytes_of(LOAD).astype(np.float64)
        self.post_store = prog.post.bytes_of(STORE).astype(np.float64)
        pre_store = prog.pre.bytes_of(STORE).astype(np.float64)
        self.store = pre_store + loop(prog.loop.bytes_of(STORE)) + self.post_store
        # The stores after the CTA's last compute: the epilogue's, or the prologue's in a
        # kernel without loop or epilogue stores (naive attention's one-shot kernels).
        self.last_store = np.where(self.post_store > 0, self.post_store,
                                   np.where(self.n == 0, pre_store, 0.0))
        self.pre_path = prog.pre.path_s
        self.loop_path = loop(prog.loop.path_s)
        self.post_path = prog.post.path_s
        self.load = self.pre_load + self.loop_load + self.post_load
        # Each iteration's spills that reach L2 (``program.KernelProgram.spill``): bytes
        # through L2 and the port beside the tiles', none of them through HBM.
        self.spill_it = prog.spill.total_bytes
        self.local = self.n * self.spill_it
        self.compute = (prog.pre.compute_s + loop(prog.loop.compute_s)
                        + prog.post.compute_s)  # busy seconds of the SM's units
        per = np.maximum(self.n, 1)
        self.load_it, self.path_it = self.loop_load / per, self.loop_path / per
        self.store_it = loop(prog.loop.bytes_of(STORE)) / per
        # Issued at the start: the prologue's loads and the first ``ahead`` iterations'.
        self.first_load = self.pre_load + np.minimum(self.n, self.ahead) * self.load_it
        self.per_tensor = _per_tensor(prog, tensors, reps, count, first)
        # The HBM capacity a missed byte of each tensor's loads takes, before the
        # occupancy (``program.hbm_line_cost``), averaged over its loads: pass A's guess.
        self.tensor_hbm_cost = np.ones(tensors)
        if any((p.hbm_cost != 1.0).any() for p in (prog.pre, prog.loop, prog.post)):
            weighted = _per_tensor(prog, tensors, reps, count, first, weighted=True)[0]
            loads = self.per_tensor[0].sum(axis=1)
            np.divide(weighted.sum(axis=1), loads, out=self.tensor_hbm_cost, where=loads > 0)

    def inflight_bytes(self, slots: int) -> float:
        """Bytes the kernel's ``slots`` resident CTAs have in flight at a time (module
        docstring), averaged over its CTAs: each CTA's loads ahead of the one it waits for
        — ``ahead`` iterations' in a loop, a one-shot CTA's first loads."""
        ahead = np.where(self.n > 0, self.load_it * np.minimum(self.n, self.ahead),
                         self.first_load)
        return float(ahead.mean() * slots) if ahead.size else 0.0

    def miss_occupancy(self, slots: int) -> np.ndarray:
        """Per CTA, the HBM capacity one missed byte takes (``miss_occupancy`` with the
        CTA's latency factor), the kernel's ``slots`` resident CTAs in flight."""
        return miss_occupancy(self.hw, self.inflight_bytes(slots), self.latency_scale)

    def compulsory_misses(self, tensor_bytes: np.ndarray
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A first guess of each CTA's (load misses, write-backs, HBM capacity of the
        misses before the occupancy): an infinite cache.

        Every block a kernel touches misses once, shared evenly by the CTAs that load it
        (each attention kernel touches all of each tensor it reads), and every stored byte
        is written back once. Pass A orders the L2 replay with this; the replay then counts.
        """
        loads, stores = self.per_tensor  # [tensors, grid]
        def shared(per_cta, weight=1.0):
            total = per_cta.sum(axis=1, keepdims=True)
            ratio = np.minimum(1.0, np.divide(tensor_bytes[:, None], total,
                                              out=np.zeros_like(total), where=total > 0))
            return (per_cta * ratio * weight).sum(axis=0)
        return shared(loads), shared(stores), shared(loads, self.tensor_hbm_cost[:, None])

    def phases(self, miss: np.ndarray, first_miss: np.ndarray, written: np.ndarray,
               missed_steps: np.ndarray, burst: np.ndarray, miss_cost: np.ndarray | None = None,
               first_cost: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
        """``(B, M, K, CP, W, moved)``, each ``[grid, 4]``: latency, first loads, body, last
        stores. ``W`` is the write-backs of dirty blocks the phase's accesses evict: HBM
        bytes that no CTA waits for (the fluid moves them as one flow of the kernel's).
        ``M`` is the HBM capacity the phase's misses take before the occupancy
        (``miss_cost``, ``first_cost``: ``program.hbm_line_cost``; the missed bytes where
        not given), ``moved`` the bytes they are.

        Only the CTAs marked in ``burst`` (those that start the first wave together) keep
        their latency and first loads as phases of their own; every other CTA starts as a
        slot frees, not in a burst, and has them folded into its body when they are a small
        part of it.

        ``missed_steps`` is the fraction of the CTA's loading steps that missed L2 somewhere:
        those wait for HBM's latency, the others for L2's.
        """
        hw = self.hw
        miss_cost = miss if miss_cost is None else miss_cost
        first_cost = first_miss if first_cost is None else first_cost
        l2, hbm = hw.l2_effective_bytes_per_s, hw.hbm_effective_bytes_per_s
        through = min(l2, sm_port_bytes_per_s(hw))
        # HBM capacity per byte loaded: its share that missed, at its cost
        fraction = np.divide(miss_cost, self.load, out=np.zeros_like(miss), where=self.load > 0)
        latency = (hw.l2_latency_s + missed_steps * (hw.hbm_latency_s - hw.l2_latency_s)
                   ) * self.latency_scale

        def transfer(nbytes, missed):
            return np.maximum(nbytes / through, missed / hbm)

        n = self.n
        # The SM's port also carries the iteration's stores.
        moved_it = self.load_it + self.store_it
        step = np.maximum(self.path_it, (latency + self.path_it
                                         + transfer(moved_it, self.load_it * fraction))
                          / self.ahead)
        # Its spills move while it computes (the full engine's reloads and stores): the
        # port and L2 bound the step, they do not lengthen its chain.
        step = np.maximum(step, (moved_it + self.spill_it) / through)
        loop = np.where(n > 0, self.path_it + (n - 1) * step, 0.0)
        drain = np.where(self.post_load > 0,
                         latency + transfer(self.post_load, self.post_load * fraction), 0.0)
        body = self.pre_path + loop + drain + self.post_path
        last = self.last_store / through
        separate = last > FOLD * body
        grid = n.shape[0]
        B, M, K, CP, W, moved = (np.zeros((grid, 4)) for _ in range(6))
        CP[:, 0] = np.where(self.first_load > 0, latency, 0.0)
        B[:, 1], M[:, 1], moved[:, 1] = self.first_load, first_cost, first_miss
        CP[:, 1] = transfer(self.first_load, first_cost)
        B[:, 2] = (self.load + self.store + self.local - self.first_load
                   - np.where(separate, self.last_store, 0))
        M[:, 2] = np.maximum(miss_cost - first_cost, 0.0)
        moved[:, 2] = np.maximum(miss - first_miss, 0.0)
        W[:, 2] = written
        K[:, 2] = self.compute
        CP[:, 2] = np.maximum(body + np.where(separate, 0.0, last), 1e-12)
        B[:, 3] = np.where(separate, self.last_store, 0.0)
        CP[:, 3] = np.where(separate, last, 0.0)
        fold = ~burst & (CP[:, 0] + CP[:, 1] < FOLD * CP[:, 2])
        for x in (B, M, moved):
            x[fold, 2] += x[fold, 1]
        CP[fold, 2] += CP[fold, 0] + CP[fold, 1]
        for x in (B, M, moved, CP):
            x[fold, :2] = 0.0
        return B, M, K, CP, W, moved


def _per_tensor(prog: KernelProgram, tensors: int, reps, count, first,
                weighted: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Load and store bytes of every CTA per tensor: two ``[tensors, grid]`` arrays;
    ``weighted``: each access's bytes times its ``hbm_cost``."""
    out = np.zeros((2, tensors, prog.grid))
    for phase, looped in ((prog.pre, False), (prog.loop, True), (prog.post, False)):
        for row in range(phase.kind.size):
            nbytes = phase.nbytes[row].astype(np.float64)
            if weighted:
                nbytes = nbytes * phase.hbm_cost[row]
            if looped:
                nbytes = segment_sums(nbytes, first, count)[reps]
            out[int(phase.kind[row] == STORE), phase.tensor[row]] += nbytes
    return out[0], out[1]
