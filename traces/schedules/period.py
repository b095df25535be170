"""A kernel's loop evaluated for one period of CTAs: the repetition of the grid over planes.

The loop is where a kernel's volume is (a causal FA2 forward at N = 131072 has 33 million
iterations). Most grids repeat over the batch*heads plane, so the loop only needs to be
evaluated for one *period* of CTAs:

- the grid repeats with period ``P`` when one CTA coordinate is ``cta // P`` (the plane
  axis, e.g. batch*heads), and every other coordinate and the loop count of CTA ``c`` equal
  those of CTA ``c % P`` — checked exactly on the whole grid (``find_period``);
- CTA ``c`` is then assumed to run the loop of CTA ``c % P`` with every access moved by a
  constant plane offset per step (``plane_offset[step, c]``: the plane at iteration 0 of
  CTA ``c`` minus that of CTA ``c % P``; zero for compute steps). The assumption is checked
  by evaluating the full loop of a spread of ``VERIFY_CTAS`` CTAs outside the first period
  and comparing every mask, and where a step happens, its shifted plane, its row and column
  blocks, and its compute amounts. If anything differs, the whole grid is evaluated instead
  (slower, never wrong on the checked CTAs).

The check is a sample: a schedule whose loop differed from its representative's only on
CTAs outside the sample would be missed. Schedules write loop coordinates as functions of
the CTA coordinates and ``t``, so a difference shows on every plane that has it.

Pure numpy, no simulator imports: the trace expander and the simulator's kernel programs
(``simulator.sim.program``) both build on it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from traces.schedules.base import Access, Kernel, Step, step_mask

VERIFY_CTAS = 12  # CTAs outside the first period whose whole loop is checked


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


def evaluate_steps(steps: list[Step], ctx: dict,
                   issued: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Evaluate every step for all units of ``ctx`` (CTAs or loop iterations) at once.

    Returns ``values[k, 0:3, u]`` — (plane, row_block, col_block) of an access, or
    (tensor_flops, exp_ops, other_flops) of a compute step, as int64 — and ``masks[k, u]``,
    True where step ``k`` happens for unit ``u``. ``issued``: compute steps give the work
    the hardware executes (``Compute.issued``, whole tiles), else the valid work.
    """
    units = ctx["cta"].shape[0]
    values = np.zeros((len(steps), 3, units), dtype=np.int64)
    masks = np.ones((len(steps), units), dtype=np.bool_)
    for k, step in enumerate(steps):
        if isinstance(step, Access):
            produced = step.coords(ctx)
        elif issued and step.issued is not None:
            produced = step.issued(ctx)
        else:
            produced = step.amounts(ctx)
        for f, column in enumerate(produced):
            values[k, f] = column
        if step.when is not None:
            masks[k] = step_mask(step, ctx)
    return values, masks


@dataclass(frozen=True)
class PeriodicLoop:
    """A kernel's loop steps evaluated for CTAs ``0 .. period-1``, iteration after iteration.

    CTA ``c`` runs units ``loop_first[c % period] + t`` for ``t < loop_count[c]``, with the
    plane of access step ``k`` moved by ``plane_offset[k, c]``.
    """

    period: int
    loop_first: np.ndarray  # [period] first unit of each representative CTA
    values: np.ndarray  # [k, 3, units] as from ``evaluate_steps``
    masks: np.ndarray  # [k, units]
    plane_offset: np.ndarray  # [k, grid] zero for compute steps and when period == grid


def plane_offsets(kernel: Kernel, period: int) -> np.ndarray:
    """Plane of each loop access step at iteration 0, minus that of the CTA's representative.

    ``[k, grid]`` over all loop steps; rows of compute steps, and CTAs without iterations,
    are zero.
    """
    offsets = np.zeros((len(kernel.loop), kernel.grid), dtype=np.int64)
    active = np.flatnonzero(kernel.loop_count > 0)
    if period == kernel.grid or active.size == 0:
        return offsets
    ctx = {name: values[active] for name, values in kernel.ctas.items()}
    ctx["t"] = np.zeros(active.size, dtype=np.int64)
    ctx["cta"] = active
    representative = np.arange(kernel.grid) % period
    for k, step in enumerate(kernel.loop):
        if not isinstance(step, Access):
            continue
        at_zero = np.zeros(kernel.grid, dtype=np.int64)
        at_zero[active] = step.coords(ctx)[0]
        offsets[k] = at_zero - at_zero[representative]
    return offsets


def _units_of(loop: PeriodicLoop, kernel: Kernel, ctas: np.ndarray) -> np.ndarray:
    """Representative units that ``ctas`` run, CTA after CTA, iteration after iteration."""
    counts = kernel.loop_count[ctas].astype(np.int64)
    starts = loop.loop_first[ctas % loop.period]
    first = np.cumsum(counts) - counts
    return np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(starts - first, counts)


def _verified(kernel: Kernel, loop: PeriodicLoop, issued: bool) -> bool:
    """Evaluate the loops of a spread of CTAs outside the first period; compare exactly."""
    outside = np.flatnonzero(kernel.loop_count[loop.period:] > 0) + loop.period
    if outside.size == 0:
        return True
    picks = np.unique(outside[np.linspace(0, outside.size - 1, VERIFY_CTAS).astype(np.int64)])
    values, masks = evaluate_steps(kernel.loop, kernel.loop_context(picks), issued)
    units = _units_of(loop, kernel, picks)
    owners = np.repeat(picks, kernel.loop_count[picks].astype(np.int64))
    expected = loop.values[:, :, units]
    expected[:, 0] += loop.plane_offset[:, owners]
    happens = masks[:, None, :]
    return (np.array_equal(masks, loop.masks[:, units])
            and np.array_equal(np.where(happens, values, 0), np.where(happens, expected, 0)))


def periodic_loop(kernel: Kernel, compress: bool = True, issued: bool = False) -> PeriodicLoop:
    """Evaluate ``kernel``'s loop for one verified period; ``compress=False`` takes the grid;
    ``issued``: compute steps give the work executed (``evaluate_steps``)."""
    loop_count = kernel.loop_count.astype(np.int64)
    for period in ((find_period(kernel),) if compress else ()) + (kernel.grid,):
        values, masks = evaluate_steps(
            kernel.loop, kernel.loop_context(np.arange(period, dtype=np.int64)), issued)
        loop = PeriodicLoop(
            period=period,
            loop_first=np.cumsum(loop_count[:period]) - loop_count[:period],
            values=values,
            masks=masks,
            plane_offset=plane_offsets(kernel, period),
        )
        if period == kernel.grid or _verified(kernel, loop, issued):
            return loop
    raise AssertionError("unreachable: the full grid is always a period")
