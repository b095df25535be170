"""A kernel's program as flat arrays: what every CTA loads, stores and computes.

The schedules describe a kernel as one program template (prologue, loop, epilogue) whose
steps are numpy functions of the CTA coordinates and the loop index. The engines need the
evaluated steps as arrays. Prologue and epilogue are evaluated for every CTA. The loop is
where the volume is (a causal FA2 forward at N = 131072 has 33 million iterations), so it
is evaluated for one *period* of CTAs only, when the grid repeats:

- the grid repeats with period ``P`` when one CTA coordinate is ``cta // P`` (the plane
  axis, e.g. batch*heads), every other coordinate and the loop count of CTA ``c`` equal
  those of CTA ``c % P`` — checked exactly on the whole grid;
- CTA ``c`` then runs the loop of CTA ``c % P`` with every access moved by a constant
  plane offset per step (``plane_offset[step, c]``, from evaluating iteration 0 of every
  CTA). That is checked by evaluating the full loop of a spread of CTAs outside the first
  period and comparing every mask, coordinate, byte count and compute amount. If any
  differs, the whole grid is evaluated instead (slower, never wrong).

Compute steps are folded, per unit (CTA or iteration), into seconds of the tensor cores,
the exp unit and the FP32 ALUs of one SM and into busiest-unit seconds
(``simulator.sim.compute``). Within a phase the engines issue all loads together, run the
compute when they have arrived, then issue the stores; every schedule's phases are written
in that order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simulator.hardware import Hardware
from simulator.occupancy import Residency, residency
from simulator.sim.compute import unit_seconds
from traces.schedules import Schedule
from traces.schedules.base import LOAD, STORE, Access, Kernel, step_mask, valid_extent

VERIFY_CTAS = 12  # CTAs outside the first period whose whole loop is checked


@dataclass
class Phase:
    """Steps of one phase evaluated for ``u`` units; access steps are rows, in program order."""

    kind: np.ndarray  # [k] LOAD or STORE
    tensor: np.ndarray  # [k] index into the schedule's tensors
    tile_rows: np.ndarray  # [k]
    tile_cols: np.ndarray  # [k]
    mask: np.ndarray  # [k, u] the access happens
    plane: np.ndarray  # [k, u]
    row_block: np.ndarray  # [k, u]
    col_block: np.ndarray  # [k, u]
    nbytes: np.ndarray  # [k, u] valid bytes moved, 0 where masked
    unit_s: np.ndarray  # [3, u] seconds of tensor cores, exp unit, FP32 ALUs on one SM
    compute_s: np.ndarray  # [u] busiest-unit seconds, summed over the compute steps

    @property
    def units(self) -> int:
        return self.compute_s.shape[0]

    def bytes_of(self, kind: int) -> np.ndarray:
        """Bytes per unit moved by the steps of ``kind`` (LOAD or STORE)."""
        rows = self.kind == kind
        return self.nbytes[rows].sum(axis=0) if rows.any() else np.zeros(self.units, np.int64)


@dataclass
class KernelProgram:
    """Everything the engines need about one kernel launch."""

    name: str
    grid: int
    sram_bytes: int
    residency: Residency
    loop_count: np.ndarray  # [grid]
    period: int  # CTA c runs the loop of CTA c % period (moved by plane_offset)
    pre: Phase  # units: CTAs
    loop: Phase  # units: iterations of CTAs 0..period-1, CTA after CTA
    post: Phase  # units: CTAs
    loop_first: np.ndarray  # [period] first loop unit of each CTA of the period
    plane_offset: np.ndarray  # [k_loop, grid] plane shift of CTA c against CTA c % period
    _totals: dict = field(default_factory=dict, repr=False)

    @property
    def iterations(self) -> int:
        return int(self.loop_count.sum())

    def loop_units(self, cta: int) -> range:
        start = int(self.loop_first[cta % self.period])
        return range(start, start + int(self.loop_count[cta]))

    def totals(self) -> dict[str, np.ndarray]:
        """Per-CTA sums over all three phases: load and store bytes, compute seconds."""
        if not self._totals:
            reps = np.arange(self.grid) % self.period
            count, first = self.loop_count[: self.period], self.loop_first

            def per_cta(pick):
                loop = segment_sums(pick(self.loop), first, count)[..., reps]
                return loop + pick(self.pre) + pick(self.post)

            self._totals.update(
                load_bytes=per_cta(lambda p: p.bytes_of(LOAD)),
                store_bytes=per_cta(lambda p: p.bytes_of(STORE)),
                compute_s=per_cta(lambda p: p.compute_s),
                unit_s=per_cta(lambda p: p.unit_s),
            )
        return self._totals


def segment_sums(x: np.ndarray, first: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Sums of ``x[..., first[i] : first[i] + count[i]]`` (segments are contiguous, in order)."""
    out = np.zeros(x.shape[:-1] + (first.shape[0],), dtype=x.dtype)
    nonempty = count > 0
    if nonempty.any():
        out[..., nonempty] = np.add.reduceat(x, first[nonempty], axis=-1)
    return out


def _evaluate(steps: list, ctx: dict, schedule: Schedule, hw: Hardware) -> Phase:
    """Evaluate a phase's steps for every unit of ``ctx`` at once."""
    units = ctx["cta"].shape[0]
    names = schedule.tensor_names
    accesses = [s for s in steps if isinstance(s, Access)]
    k = len(accesses)
    shape = (k, units)
    phase = Phase(
        kind=np.array([s.kind for s in accesses], dtype=np.int64),
        tensor=np.array([names.index(s.tensor) for s in accesses], dtype=np.int64),
        tile_rows=np.array([s.tile_rows for s in accesses], dtype=np.int64),
        tile_cols=np.array([s.tile_cols for s in accesses], dtype=np.int64),
        mask=np.zeros(shape, dtype=bool), plane=np.zeros(shape, dtype=np.int64),
        row_block=np.zeros(shape, dtype=np.int64), col_block=np.zeros(shape, dtype=np.int64),
        nbytes=np.zeros(shape, dtype=np.int64), unit_s=np.zeros((3, units)),
        compute_s=np.zeros(units),
    )
    for row, step in enumerate(accesses):
        t = schedule.tensors[step.tensor]
        mask = step_mask(step, ctx)
        plane, rb, cb = (np.broadcast_to(np.asarray(a, dtype=np.int64), (units,))
                         for a in step.coords(ctx))
        phase.mask[row], phase.plane[row] = mask, plane
        phase.row_block[row], phase.col_block[row] = rb, cb
        nbytes = (valid_extent(rb, step.tile_rows, t.rows)
                  * valid_extent(cb, step.tile_cols, t.cols) * t.elem_bytes)
        phase.nbytes[row] = np.where(mask, nbytes, 0)
    for step in steps:
        if isinstance(step, Access):
            continue
        mask = step_mask(step, ctx)
        amounts = np.stack([np.broadcast_to(np.asarray(a, dtype=np.float64), (units,))
                            for a in step.amounts(ctx)]) * mask
        seconds = unit_seconds(amounts, hw, schedule.problem.dtype)
        phase.unit_s += seconds
        phase.compute_s += seconds.max(axis=0)
    return phase


def _loop_context(kernel: Kernel, ctas: np.ndarray) -> dict[str, np.ndarray]:
    """Loop context (CTA coordinates, ``t``, ``cta``) of the iterations of ``ctas``, in order."""
    counts = kernel.loop_count[ctas].astype(np.int64)
    owner = np.repeat(ctas, counts)
    first = np.cumsum(counts) - counts
    ctx = {name: values[owner] for name, values in kernel.ctas.items()}
    ctx["t"] = np.arange(owner.size, dtype=np.int64) - np.repeat(first, counts)
    ctx["cta"] = owner
    return ctx


def _is_periodic(values: np.ndarray, period: int) -> bool:
    rows = values.reshape(-1, period)
    return bool((rows == rows[0]).all())


def find_period(kernel: Kernel) -> int:
    """Smallest period P of the grid (see the module docstring); ``grid`` when none."""
    grid = kernel.grid
    index = np.arange(grid, dtype=np.int64)
    best = grid
    for name, values in kernel.ctas.items():
        nonzero = np.flatnonzero(values)
        if grid < 2 or values[0] != 0 or nonzero.size == 0:
            continue
        period = int(nonzero[0])
        if period >= best or grid % period or not np.array_equal(values, index // period):
            continue
        others = [v for n, v in kernel.ctas.items() if n != name] + [kernel.loop_count]
        if all(_is_periodic(v, period) for v in others):
            best = period
    return best


def _plane_offsets(kernel: Kernel, loop: Phase, period: int) -> np.ndarray:
    """Plane of each loop access step at iteration 0, minus that of the CTA's representative."""
    k = loop.kind.shape[0]
    offsets = np.zeros((k, kernel.grid), dtype=np.int64)
    active = np.flatnonzero(kernel.loop_count > 0)
    if period == kernel.grid or k == 0 or active.size == 0:
        return offsets
    ctx = {name: values[active] for name, values in kernel.ctas.items()}
    ctx["t"] = np.zeros(active.size, dtype=np.int64)
    ctx["cta"] = active
    accesses = [s for s in kernel.loop if isinstance(s, Access)]
    for row, step in enumerate(accesses):
        plane = np.broadcast_to(np.asarray(step.coords(ctx)[0], dtype=np.int64), active.shape)
        at_zero = np.zeros(kernel.grid, dtype=np.int64)
        at_zero[active] = plane
        offsets[row] = at_zero - at_zero[np.arange(kernel.grid) % period]
    return offsets


def _verify_period(kernel: Kernel, schedule: Schedule, hw: Hardware, program: KernelProgram,
                   ) -> bool:
    """Evaluate the loops of a spread of CTAs outside the first period; compare exactly."""
    outside = np.flatnonzero(kernel.loop_count[program.period:] > 0) + program.period
    if outside.size == 0:
        return True
    picks = np.unique(outside[np.linspace(0, outside.size - 1, VERIFY_CTAS).astype(np.int64)])
    checked = _evaluate(kernel.loop, _loop_context(kernel, picks), schedule, hw)
    units = np.concatenate([np.asarray(program.loop_units(int(c))) for c in picks])
    owners = np.repeat(picks, kernel.loop_count[picks])
    rep = program.loop
    shifted = rep.plane[:, units] + program.plane_offset[:, owners]
    on = checked.mask
    return (np.array_equal(on, rep.mask[:, units])
            and np.array_equal(checked.plane[on], shifted[on])
            and np.array_equal(checked.row_block[on], rep.row_block[:, units][on])
            and np.array_equal(checked.col_block[on], rep.col_block[:, units][on])
            and np.array_equal(checked.nbytes, rep.nbytes[:, units])
            and np.array_equal(checked.unit_s, rep.unit_s[:, units]))


def kernel_program(kernel: Kernel, schedule: Schedule, hw: Hardware,
                   compress: bool = True) -> KernelProgram:
    """Evaluate ``kernel`` for the engines; ``compress=False`` evaluates every CTA's loop."""
    res = residency(kernel, schedule.tiling, schedule.problem.head_dim, hw)
    cta_ctx = kernel.cta_context()
    pre = _evaluate(kernel.pre, cta_ctx, schedule, hw)
    post = _evaluate(kernel.post, cta_ctx, schedule, hw)
    loop_count = kernel.loop_count.astype(np.int64)
    for period in ((find_period(kernel),) if compress else ()) + (kernel.grid,):
        reps = np.arange(period, dtype=np.int64)
        loop = _evaluate(kernel.loop, _loop_context(kernel, reps), schedule, hw)
        first = np.cumsum(loop_count[:period]) - loop_count[:period]
        program = KernelProgram(
            name=kernel.name, grid=kernel.grid, sram_bytes=kernel.sram_bytes, residency=res,
            loop_count=loop_count, period=period, pre=pre, loop=loop, post=post,
            loop_first=first, plane_offset=_plane_offsets(kernel, loop, period),
        )
        if period == kernel.grid or _verify_period(kernel, schedule, hw, program):
            return program
    raise AssertionError("unreachable: the full grid is always a period")


def schedule_programs(schedule: Schedule, hw: Hardware, compress: bool = True,
                      ) -> list[KernelProgram]:
    return [kernel_program(k, schedule, hw, compress) for k in schedule.kernels]
