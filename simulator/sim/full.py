"""The full engine: every tile load, store and compute step of every CTA is an event.

Model (``DESIGN.md``, level 3), per kernel launch:

- **Launch**: the launch overhead elapses, then CTAs are dispatched in launch order to
  ``sm_count x ctas_per_sm`` slots (slot ``s`` on SM ``s % sm_count``, so the first wave
  spreads over all SMs before doubling up); whenever a CTA retires, the next CTA takes its
  slot. The kernel ends when its last CTA has retired and L2 has written the dirty blocks
  it evicted back to DRAM; what it leaves dirty stays in L2 for the next kernel to hit or
  evict (``record.KernelRun``), which then launches (kernels of a pass run one after
  another).
- **Loads run ahead** (Triton's software pipelining, as the compile does it:
  ``kernels.resources.loop_pipeline``): the prologue's loads and those of the first
  ``num_stages - 1`` loop iterations are issued when the CTA starts; iteration ``t`` waits
  for its own loads, computes, issues the loads of ``t + num_stages - 1`` into the buffer
  it has just read, and issues its stores. So ``num_stages - 1`` iterations' loads are in
  flight while it waits, and at two stages a CTA's loads never overlap its own compute
  (other CTAs on its SM can); ``num_stages = 1`` loads, waits and computes in turn.
  Shared memory holds ``num_stages`` buffers, which is what the schedules count as SRAM.
- **Memory**: every tile access is looked up in L2 (``l2``) when it is issued. All its bytes
  cross L2 (a processor-sharing pool at the preset's effective L2 bandwidth) and the SM's
  port (a pool per SM at its shared-memory bandwidth: an SM cannot take in data faster
  than it can write it to shared memory); the bytes that miss also cross HBM (effective
  HBM bandwidth). A load's data is there when all its transfers are done plus the latency
  of the farthest level it reached, scaled by its CTA's ``costs.latency_factor`` (near
  and far L2 slices: without a spread, identical CTAs stay in lock-step). With few bytes
  in flight HBM does not reach its rate (``costs``, Little's law with the queue): each
  missed byte takes ``costs.miss_occupancy`` bytes of its capacity, the CTA's latency
  inside (and a read of part of a line the line's transfer: ``program.hbm_line_cost``),
  so a miss's data is there when HBM has moved its charge, or its latency after its
  transfers at the rate it got, whichever is later: a lone load pays the latency once,
  one in a queue has paid it queueing. Write-backs of
  evicted dirty blocks are HBM transfers nobody waits for. Stores cross the port and L2
  and are not waited for, except that a CTA retires only once its stores have been
  accepted by L2.
- **Spills** (``simulator.spills``): each iteration of a loop that spills moves the
  reloads that miss L1 and its spill stores through L2 and the SM's port while it
  computes (its spill instructions are spread over its compute), waits for the reloads
  before its next step, and counts the stores among those in flight (no lookup in the L2
  model: spills' trips to HBM are not modelled).
- **Compute** (``compute``): a step ends its critical path after it starts, but not before
  its SM's units have done the busy seconds (``compute.busy_seconds``) queued before it
  and its own: the CTAs of one SM share its units first come, first served.

This engine is exact for its model and costs a few events per tile step, so it is used for
problems of up to about a hundred thousand loop iterations; ``fluid`` aggregates the
same model for larger ones.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import simpy

from simulator.hardware import Hardware
from simulator.sim.bandwidth import SharedBandwidth, sm_port_bytes_per_s
from simulator.sim.costs import CtaCosts
from simulator.sim.l2 import TILE_FIELDS, L2Cache
from simulator.sim.program import KernelProgram, Phase
from simulator.sim.record import CountingEnvironment, KernelRun
from traces.schedules.base import LOAD, STORE


class _Requests:
    """The tile rows of every access of a phase, built once per kernel."""

    def __init__(self, phase: Phase, kind: int, offsets: np.ndarray | None):
        rows = np.flatnonzero(phase.kind == kind)
        self.rows = rows
        self.mask = phase.mask[rows].T  # [units, k]
        self.bytes = phase.nbytes[rows].sum(axis=0)  # [units]
        self.hbm_cost = phase.hbm_cost[rows]  # [k] program.hbm_line_cost
        tiles = np.zeros((phase.units, rows.size, TILE_FIELDS), dtype=np.int64)
        tiles[:, :, 0] = phase.tensor[rows]
        tiles[:, :, 1] = phase.plane[rows].T
        tiles[:, :, 2] = phase.row_block[rows].T
        tiles[:, :, 3] = phase.col_block[rows].T
        tiles[:, :, 4] = phase.tile_rows[rows]
        tiles[:, :, 5] = phase.tile_cols[rows]
        tiles[:, :, 6] = kind == STORE
        self.tiles = tiles
        self.offsets = None if offsets is None else offsets[rows].T  # [grid, k]

    def tiles_of(self, unit: int, cta: int) -> tuple[np.ndarray, np.ndarray]:
        """The unit's tiles (rows of ``TILE_FIELDS``) and each one's ``hbm_cost``."""
        mask = self.mask[unit]
        tiles = self.tiles[unit][mask]
        if self.offsets is not None:
            tiles[:, 1] += self.offsets[cta][mask]
        return tiles, self.hbm_cost[mask]


class FullEngine:
    """Runs every kernel of a schedule on one SimPy environment (see the module docstring)."""

    def __init__(self, programs: list[KernelProgram], hw: Hardware, cache: L2Cache,
                 num_stages: int):
        self.programs, self.hw, self.cache, self.stages = programs, hw, cache, num_stages
        self.env = CountingEnvironment()
        self.l2 = SharedBandwidth(self.env, hw.l2_effective_bytes_per_s, "l2")
        self.hbm = SharedBandwidth(self.env, hw.hbm_effective_bytes_per_s, "hbm")
        self.ports = [SharedBandwidth(self.env, sm_port_bytes_per_s(hw), f"sm{i}")
                      for i in range(hw.sm_count)]
        self.tiles = 0
        self.runs: list[KernelRun] = []

    def run(self) -> list[KernelRun]:
        self.env.process(self._kernels())
        self.env.run()
        return self.runs

    # -- kernels and slots -------------------------------------------------------------

    def _kernels(self):
        hw = self.hw
        for prog in self.programs:
            launch, counted = self.env.now, self.env.events
            yield self.env.timeout(hw.kernel_launch_overhead_s)
            start, before = self.env.now, self.cache.stats.copy()
            hbm_log, l2_log = len(self.hbm.busy_log), len(self.l2.busy_log)
            self.prog = prog
            costs = CtaCosts(prog, hw, self.stages, self.cache.layout.rows.size)
            self.latency_scale = costs.latency_scale.tolist()  # costs.latency_factor
            self.req = {
                (phase, kind): _Requests(getattr(prog, phase), kind,
                                         prog.plane_offset if phase == "loop" else None)
                for phase in ("pre", "loop", "post") for kind in (LOAD, STORE)
            }
            self.next_cta = 0
            self.sm_free = np.zeros(hw.sm_count)
            self.cta_start = np.zeros(prog.grid)
            self.cta_end = np.zeros(prog.grid)
            self.cta_slot = np.zeros(prog.grid, dtype=np.int64)
            slots = min(hw.sm_count * prog.residency.ctas_per_sm, prog.grid)
            # The HBM capacity a missed byte takes, per CTA (``costs.miss_occupancy``);
            # the first wave's first loads (CTAs below ``slots``) take it byte for byte.
            self.first_wave, self.occupancy = slots, costs.miss_occupancy(slots).tolist()
            self.hbm_moved = self.hbm_charged = self.line_extra = 0.0
            yield simpy.AllOf(self.env, [self.env.process(self._slot(s)) for s in range(slots)])
            # The write-backs of evicted blocks still in flight finish within the kernel
            # (bytes it moved); what it leaves dirty stays in L2 (record.KernelRun).
            yield self.hbm.idle()
            traffic, foreign = self.cache.traffic_since(before)
            self.runs.append(KernelRun(
                name=prog.name, launch_s=launch, start_s=start, end_s=self.env.now,
                ctas_per_sm=prog.residency.ctas_per_sm, slots=slots,
                sram_bytes_per_cta=prog.sram_bytes, cta_start=self.cta_start,
                cta_end=self.cta_end, cta_slot=self.cta_slot,
                tensor_bytes=traffic, dirty_bytes=self.cache.dirty_bytes(),
                foreign_writeback_bytes=foreign,
                events=self.env.events - counted, tile_accesses=self.tiles, mode="full",
                hbm_segments=_segments(self.hbm, hbm_log,
                                       self.hbm_moved / max(self.hbm_charged, 1.0)),
                l2_segments=_segments(self.l2, l2_log),
                unit_s=prog.totals()["unit_s"].sum(axis=1),
                issued=prog.totals()["work"].sum(axis=1), hbm_line_extra_bytes=self.line_extra,
            ))
            self.tiles = 0

    def _slot(self, slot: int):
        sm = slot % self.hw.sm_count
        while self.next_cta < self.prog.grid:
            cta = self.next_cta
            self.next_cta += 1
            self.cta_start[cta], self.cta_slot[cta] = self.env.now, slot
            yield from self._cta(cta, sm)
            self.cta_end[cta] = self.env.now

    # -- one CTA -----------------------------------------------------------------------

    def _cta(self, cta: int, sm: int):
        prog, stages = self.prog, self.stages
        pending = [0, None]  # stores in flight, event to wake the CTA when they are done
        first = cta < self.first_wave  # waiting out its first loads' latency with all
        first_loads = self._load("pre", cta, cta, sm, first)
        units = prog.loop_units(cta)
        ahead = deque(self._load("loop", cta, units[t], sm, first)
                      for t in range(min(len(units), stages - 1)))
        if first_loads is not None:
            yield first_loads
        yield from self._compute(sm, prog.pre.compute_s[cta], prog.pre.path_s[cta])
        self._store("pre", cta, cta, sm, pending)
        spill = prog.spill
        for t, unit in enumerate(units):
            loads = ahead.popleft() if stages > 1 else self._load("loop", cta, unit, sm)
            if loads is not None:
                yield loads
            reloads = self._reload(sm, spill.reload_bytes)
            if spill.store_bytes:  # its spill stores, spread over its compute
                self._write(sm, spill.store_bytes, pending)
            yield from self._compute(sm, prog.loop.compute_s[unit], prog.loop.path_s[unit])
            if reloads is not None:
                yield reloads
            if stages > 1 and t + stages - 1 < len(units):  # into the buffer just read
                ahead.append(self._load("loop", cta, units[t + stages - 1], sm))
            self._store("loop", cta, unit, sm, pending)
        last_loads = self._load("post", cta, cta, sm)
        if last_loads is not None:
            yield last_loads
        yield from self._compute(sm, prog.post.compute_s[cta], prog.post.path_s[cta])
        self._store("post", cta, cta, sm, pending)
        if pending[0]:
            pending[1] = self.env.event()
            yield pending[1]

    def _compute(self, sm: int, busy_s: float, path_s: float):
        if path_s > 0:
            now = self.env.now
            self.sm_free[sm] = max(now, self.sm_free[sm]) + busy_s
            yield self.env.timeout(max(path_s, self.sm_free[sm] - now))

    # -- memory ------------------------------------------------------------------------

    def _access(self, phase: str, kind: int, cta: int, unit: int):
        """Look the unit's tiles of ``kind`` up in L2; (bytes, missed bytes, the HBM
        capacity the misses take before the occupancy: ``program.hbm_line_cost``) or
        None."""
        req = self.req[(phase, kind)]
        if not req.bytes[unit]:
            return None
        tiles, cost = req.tiles_of(unit, cta)
        self.tiles += tiles.shape[0]
        out = self.cache.access(tiles)
        hit, miss, written = (int(x) for x in out.sum(axis=0))
        if written:
            self._hbm(written, 1.0, _nothing)  # write-backs: nobody waits
        return int(req.bytes[unit]), miss, float(out[:, 1] @ cost) if miss else 0.0

    def _hbm(self, nbytes: int, occupancy: float, done) -> None:
        """Move ``nbytes`` through HBM, each taking ``occupancy`` bytes of its capacity."""
        self.hbm_moved += nbytes
        self.hbm_charged += nbytes * occupancy
        self.hbm.start(nbytes * occupancy, done)

    def _load(self, phase: str, cta: int, unit: int, sm: int, first: bool = False):
        """Issue the loads of one unit (``first``: a first-wave CTA's first loads); returns
        the event of their arrival (or None)."""
        moved = self._access(phase, LOAD, cta, unit)
        if moved is None:
            return None
        total, miss, cost = moved
        arrived = self.env.event()
        scale = self.latency_scale[cta]
        latency = (self.hw.hbm_latency_s if miss else self.hw.l2_latency_s) * scale
        occupancy = 1.0 if first else self.occupancy[cta]
        issued = self.env.now
        parts = [3 if miss else 2]
        ready = [issued]  # when the latency starts: the last transfer's end, uncharged

        def transferred(end: float) -> None:
            parts[0] -= 1
            ready[0] = max(ready[0], end)
            if not parts[0]:  # the latency after the transfers, or the charge if later
                now = self.env.now
                _succeed_after(self.env, arrived, max(ready[0] + latency, now) - now)

        def part_done() -> None:
            transferred(self.env.now)

        # HBM's capacity the misses take: their transfer's (``cost``) and the latency's
        # share of the occupancy (``costs.miss_occupancy``: ``1 + L B / F`` a byte).
        charge = cost + miss * (occupancy - 1.0)

        def hbm_done() -> None:
            # HBM gave ``charge`` bytes of its capacity since the issue: the transfer took
            # ``cost``'s share of that time, the rest the latency.
            transferred(issued + (self.env.now - issued) * cost / charge)

        self.l2.start(total, part_done)
        self.ports[sm].start(total, part_done)
        if miss:
            self.line_extra += cost - miss
            self._hbm(miss, charge / miss, hbm_done)
        return arrived

    def _store(self, phase: str, cta: int, unit: int, sm: int, pending: list) -> None:
        moved = self._access(phase, STORE, cta, unit)
        if moved is not None:
            self._write(sm, moved[0], pending)

    def _write(self, sm: int, nbytes: float, pending: list) -> None:
        """Write ``nbytes`` through SM ``sm``'s port and L2, not waited for: one more of the
        CTA's stores in flight (``pending``) until L2 has taken them."""
        pending[0] += 1

        def accepted() -> None:
            pending[0] -= 1
            if not pending[0] and pending[1] is not None:
                pending[1].succeed()

        self._through(sm, nbytes, accepted)

    def _through(self, sm: int, nbytes: float, done) -> None:
        """Move ``nbytes`` through L2 and SM ``sm``'s port, then call ``done``."""
        parts = [2]

        def transferred() -> None:
            parts[0] -= 1
            if not parts[0]:
                done()

        self.l2.start(nbytes, transferred)
        self.ports[sm].start(nbytes, transferred)

    def _reload(self, sm: int, nbytes: float):
        """Reload ``nbytes`` of spills from L2 (``program.KernelProgram.spill``: those that
        miss L1; their latency is on the iteration's path already); the event of their
        arrival, or None without any."""
        if not nbytes:
            return None
        arrived = self.env.event()
        self._through(sm, nbytes, arrived.succeed)
        return arrived


def _nothing() -> None:
    pass


def _succeed_after(env: simpy.Environment, event: simpy.Event, delay: float) -> None:
    """Trigger ``event`` ``delay`` seconds from now.

    NOTE: sets the event's outcome and schedules it directly, as ``Event.succeed`` does but
    with a delay, instead of chaining a ``Timeout``: one event instead of two, for
    performance.
    """
    event._ok = True
    event._value = None
    env.schedule(event, delay=delay)


def _segments(pool: SharedBandwidth, first: int, moved: float = 1.0) -> np.ndarray:
    """The pool's busy periods since log entry ``first`` as (start, end, bytes/s) rows;
    ``moved``: the bytes it moved per byte of its capacity taken (HBM: below 1 where
    misses took more, ``costs.miss_occupancy``)."""
    log = pool.busy_log[first:]
    if not log:
        return np.zeros((0, 3))
    rows = np.array(log, dtype=np.float64)
    return np.column_stack([rows, np.full(len(log), pool.rate * moved)])
