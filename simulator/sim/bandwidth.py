"""Shared bandwidth as processor sharing: every transfer in flight gets an equal share.

A memory level (HBM, L2) moves ``rate`` bytes per second in total. With ``n`` transfers in
flight each progresses at ``rate / n`` (max-min fair sharing among equal flows, as the
many independent requests of a GPU's memory system see it); a transfer that starts or
ends changes every other transfer's speed. SimPy's ``Resource`` is a FIFO of channels and
cannot express this.

Implementation: *virtual time*. ``served`` is the number of bytes one flow present since
the beginning would have received; it grows at ``rate / n``. A transfer of ``b`` bytes that
starts when ``served = s`` ends when ``served`` reaches ``s + b``, whatever happens in
between, so finish marks never change: they sit in a heap, and only the earliest needs an
event. Each start or end is O(log n) and schedules at most one timer event (timers made
stale by a later change are recognised by a generation number and ignored).

Latency is not modelled here: the caller adds its level's latency after the transfer.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import simpy

from simulator.hardware import Hardware

# Relative slack when comparing virtual finish marks: completions that float rounding puts
# a hair apart finish together.
_REL_EPS = 1e-12


def sm_port_bytes_per_s(hw: Hardware) -> float:
    """What one SM can take in or send out per second: its shared-memory bandwidth.

    Loaded tiles are written into shared memory, so an SM cannot ingest faster than that
    (preset ``smem_bandwidth_bytes_per_clk_per_sm`` at ``sm_clock_hz``).
    """
    return hw.smem_bandwidth_bytes_per_clk_per_sm * hw.sm_clock_hz


class SharedBandwidth:
    """Processor-sharing bandwidth of ``rate`` bytes/s; ``start`` calls back when done."""

    def __init__(self, env: simpy.Environment, rate: float, name: str = ""):
        if rate <= 0:
            raise ValueError('"rate" must be > 0.')
        self.env, self.rate, self.name = env, float(rate), name
        self._flows: list[tuple[float, int, Callable[[], None]]] = []
        self._served = 0.0
        self._stamp = 0.0
        self._seq = 0
        self._generation = 0
        self.bytes_moved = 0.0
        self.busy_s = 0.0  # time with at least one transfer in flight
        self.busy_log: list[tuple[float, float]] = []  # (start, end) of busy periods
        self._busy_since: float | None = None
        self._idle_waiters: list[simpy.Event] = []

    @property
    def active(self) -> int:
        return len(self._flows)

    def idle(self) -> simpy.Event:
        """An event that fires when no transfer is in flight (at once if none is)."""
        event = self.env.event()
        if self._flows:
            self._idle_waiters.append(event)
        else:
            event.succeed()
        return event

    def _advance(self) -> None:
        now = self.env.now
        if self._flows:
            self._served += (now - self._stamp) * self.rate / len(self._flows)
        self._stamp = now

    def start(self, nbytes: float, done: Callable[[], None]) -> None:
        """Begin a transfer of ``nbytes``; ``done()`` is called when it has completed."""
        self._advance()
        if not self._flows:
            self._busy_since = self.env.now
        heapq.heappush(self._flows, (self._served + nbytes, self._seq, done))
        self._seq += 1
        self.bytes_moved += nbytes
        self._arm()

    def _arm(self) -> None:
        finish = self._flows[0][0]
        delay = max(finish - self._served, 0.0) * len(self._flows) / self.rate
        self._generation += 1
        timer = self.env.timeout(delay)
        timer.callbacks.append(self._make_fire(self._generation))

    def _make_fire(self, generation: int) -> Callable:
        def fire(_event) -> None:
            if generation == self._generation:
                self._complete()
        return fire

    def _complete(self) -> None:
        self._advance()
        # The timer was armed for the earliest flow: it is done even if rounding left
        # ``served`` a hair short of its mark.
        limit = max(self._served * (1.0 + _REL_EPS) + _REL_EPS, self._flows[0][0])
        finished = []
        while self._flows and self._flows[0][0] <= limit:
            finished.append(heapq.heappop(self._flows)[2])
        if self._flows:
            self._arm()
        else:
            self._served = 0.0  # an idle pool restarts its clock: keeps marks small
            self.busy_s += self.env.now - self._busy_since
            self.busy_log.append((self._busy_since, self.env.now))
            self._busy_since = None
        for done in finished:
            done()
        if not self._flows:
            waiters, self._idle_waiters = self._idle_waiters, []
            for event in waiters:
                event.succeed()
