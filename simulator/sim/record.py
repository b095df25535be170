"""What a simulation records about each kernel launch, whichever engine ran it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simpy

from simulator.sim.l2 import HIT, MISS, WRITE, WRITEBACK


class CountingEnvironment(simpy.Environment):
    """A SimPy environment that counts the events it processes (``events``)."""

    def __init__(self) -> None:
        super().__init__()
        self.events = 0

    def step(self) -> None:
        self.events += 1
        super().step()


@dataclass
class KernelRun:
    """One kernel launch as simulated.

    Times are seconds from the start of the run. ``tensor_bytes[t]`` holds the L2 traffic
    of tensor ``t`` during this kernel: load bytes that hit, load bytes that missed (read
    from DRAM), bytes stored, and bytes written back to DRAM while it ran (the dirty blocks
    its misses and stores evicted, whichever kernel stored them). ``dirty_bytes[t]`` is
    what L2 held dirty of tensor ``t`` at its end.

    What a kernel leaves dirty: L2 is a write-back cache that keeps its contents across
    launches, and a kernel completes when its last CTA retires, its stores in L2. Its dirty
    blocks stay there: the next kernel hits them or, where its misses and stores need the
    room, evicts them and writes them back, in HBM time among its own (as it does another
    program's dirty lines, ``foreign_writeback_bytes``). After the last kernel of a run
    they are written back in no time the run reports; a CUDA event after it, or Nsight
    Compute's duration, would not wait for them either. So a kernel ends with its last CTA,
    or when the write-backs its CTAs caused have reached DRAM, if later.

    Whose DRAM writes they are: each tensor is stored by one kernel of a schedule
    (``simulator.sim.run`` checks), and a kernel's ``dram_write`` is every byte it stored
    that reaches DRAM, sooner or later: its tensors' write-backs while it ran and what it
    left dirty of them (``left_dirty``). The write-backs of earlier kernels' tensors while
    it ran are ``carried_writeback_bytes``: HBM time of its, bytes of theirs. Summed over
    a run's kernels, ``dram_write`` is every stored byte that reaches DRAM, once.
    ``*_segments`` are ``(start, end, bytes/s)`` rows of the bandwidth each level
    delivered, for timelines.
    """

    name: str
    launch_s: float  # the launch begins (the launch overhead runs first)
    start_s: float  # the first CTA starts
    end_s: float  # the last CTA retired, the write-backs of its evictions in DRAM
    ctas_per_sm: int
    slots: int  # CTAs resident at once on the whole GPU
    sram_bytes_per_cta: int
    cta_start: np.ndarray
    cta_end: np.ndarray
    cta_slot: np.ndarray  # slot s is on SM s % sm_count
    tensor_bytes: np.ndarray  # [tensors, 4]: HIT, MISS, WRITE, WRITEBACK
    dirty_bytes: np.ndarray  # [tensors]: held dirty in L2 at its end
    events: int  # discrete events the engine processed
    tile_accesses: int  # tile loads and stores looked up in L2
    hbm_segments: np.ndarray
    l2_segments: np.ndarray
    mode: str  # "full" or "aggregated"
    unit_s: np.ndarray  # [4] busy seconds of tensor cores, exp units, FP32 ALUs, shared memory
    issued: np.ndarray  # [3] tensor FLOPs, exps, other FLOPs issued (whole, padded tiles)
    # Another program's dirty data this kernel's allocations evicted and wrote to DRAM
    # (``l2.L2Cache.fill_foreign``): HBM time of the kernel's, bytes of no tensor of its.
    foreign_writeback_bytes: int = 0
    # HBM time its reads of parts of lines took beyond their bytes, in bytes at HBM's
    # rate (``program.hbm_line_cost``): busy time of HBM's that moved nothing counted.
    hbm_line_extra_bytes: float = 0.0

    @property
    def time_s(self) -> float:
        return self.end_s - self.launch_s

    @property
    def dram_read(self) -> int:
        return int(self.tensor_bytes[:, MISS].sum())

    @property
    def stored(self) -> np.ndarray:
        """Which tensors the kernel stores (a mask over ``tensor_bytes``' rows)."""
        return self.tensor_bytes[:, WRITE] > 0

    @property
    def dram_write_by_tensor(self) -> np.ndarray:
        """Per tensor, the bytes the kernel stored that reach DRAM: its stored tensors'
        write-backs while it ran and what it left dirty of them; 0 for the others."""
        return np.where(self.stored, self.tensor_bytes[:, WRITEBACK] + self.dirty_bytes, 0)

    @property
    def dram_write(self) -> int:
        return int(self.dram_write_by_tensor.sum())

    @property
    def left_dirty(self) -> int:
        """What L2 held dirty at its end of the tensors it stores: part of ``dram_write``,
        written back while a later kernel runs, or after the run."""
        return int(self.dirty_bytes[self.stored].sum())

    @property
    def carried_writeback_bytes(self) -> int:
        """Write-backs while it ran of what earlier kernels left dirty."""
        return int(self.tensor_bytes[~self.stored, WRITEBACK].sum())

    @property
    def hbm_bytes(self) -> int:
        """Every byte the kernel moved between L2 and DRAM while it ran: its reads, the
        write-backs of any tensor's blocks it evicted and of another program's."""
        return (self.dram_read + int(self.tensor_bytes[:, WRITEBACK].sum())
                + self.foreign_writeback_bytes)

    @property
    def hbm_busy_bytes(self) -> float:
        """HBM's busy time in bytes at its rate: ``hbm_bytes`` and what reads of parts of
        lines took beyond theirs."""
        return self.hbm_bytes + self.hbm_line_extra_bytes

    @property
    def l2_hit(self) -> int:
        return int(self.tensor_bytes[:, HIT].sum())

    @property
    def global_write(self) -> int:
        return int(self.tensor_bytes[:, WRITE].sum())

    def sram_peak_per_sm(self, sm_count: int) -> int:
        """Most shared memory in use on one SM at any time, from the CTA placements."""
        if self.cta_start.size == 0:
            return 0
        sms = self.cta_slot % sm_count
        times = np.concatenate([self.cta_start, self.cta_end])
        delta = np.concatenate([np.ones_like(sms), -np.ones_like(sms)])
        where = np.concatenate([sms, sms])
        # Ends sort before starts at equal times: a slot freed and refilled at once.
        order = np.lexsort((delta, times, where))
        running = np.cumsum(delta[order])
        starts = np.flatnonzero(np.diff(where[order], prepend=-1))
        base = np.repeat(running[starts] - delta[order][starts],
                         np.diff(np.append(starts, order.size)))
        return int((running - base).max()) * self.sram_bytes_per_cta
