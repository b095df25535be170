"""Calibration: fit the model's few effective parameters to measured times.

The parameters are the ones a preset exposes as achievable fractions or rates (whichever
exist on ``Hardware``): ``hbm_efficiency``, ``l2_efficiency``, ``tensor_efficiency`` and
``tensor_sync_efficiency`` (matmuls that compile to wgmma and to mma.sync), how far an SM's
units overlap (``unit_overlap``), the kernel launch overhead and the per-iteration overhead
(a fixed latency on every loop iteration's path). Not the exp rate: it trades against
``unit_overlap`` (a faster exp unit and less overlap give nearly the same times), so the
two cannot both be fitted. On records the simulator "measured" with known parameters
(``benchmarks/calibrate_recovery.py``, 2026-11-30) a fit of both reached 0.35% train and
0.54% held-out MAPE with the other six within 10% of their values, but exp 1.5 times and
the overlap 0.7 times theirs; on the H200 records it put the exp rate at 2.2 times the 16
per SM per clock the hardware has. The exp rate keeps that documented value; the overlap,
which only a profile bounds, is fitted (and the seven are then found within 2% of known
values, 181 evaluations). Since 2026-12-05 the one overlap covers shared memory's pipe
with the math pipes (there was a second, ``smem_overlap``, kept at its measured value).
They are fitted by least squares on
log(predicted / measured time) — relative errors, so that microsecond decode kernels weigh
as much as 10 ms naive ones — over a TRAINING set of shapes.

The split is by shape (problem and schedule), never by tiling: every tiling of a held-out
shape is held out, so the reported error is on problems the fit never saw. Within each
schedule-and-pass group, shapes are ordered by a seeded hash and the first
``holdout_fraction`` of them are held out. Only training records enter the residuals.
``validation.calibrated_preset`` writes the fit as a preset that says where it came from.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass

from traces.problem import ProblemError
from validation import stats
from validation.predict import predict_or_refusal, predict_record
from validation.records import group_key, latest_per_config, shape_key


@dataclass(frozen=True)
class Param:
    field: str
    lo: float
    hi: float
    unit: float = 1.0  # fitted variable = value / unit (keeps variables near 1)


PARAMS = (
    Param("hbm_efficiency", 0.3, 1.0),
    Param("l2_efficiency", 0.2, 1.0),
    Param("tensor_efficiency", 0.2, 1.0),
    Param("tensor_sync_efficiency", 0.1, 1.0),
    Param("unit_overlap", 0.0, 1.0),
    Param("kernel_launch_overhead_s", 0.0, 50.0, unit=1e-6),
    Param("iteration_overhead_s", 0.0, 5.0, unit=1e-6),
)


# Step of the finite-difference Jacobian, relative to max(1, |x|). The simulator's time is
# smooth in each parameter only at a coarse scale: events reorder and L2 hits change at
# small steps. On records the simulator itself "measured" with known parameters (45
# configs: fa2 forward, causal and backward, naive, decode; N = 1k-4k;
# benchmarks/calibrate_recovery.py, BENCHMARKS.md), steps of 1e-3 stalled 5.1% from them
# (train MAPE, 113 evaluations) and steps of 1e-2 found them (0.13%, 93 evaluations) with
# least squares' own differences; ours (``jacobian_steps``) find them in 74 (0.07%).
DIFF_STEP = 1e-2


def jacobian_steps(x, params: list[Param]) -> list[float]:
    """The forward-difference step of each variable: ``DIFF_STEP`` times max(1, |x|),
    backward where forward would leave the variable's bounds.

    Not least squares' ``diff_step``, which is relative to |x| alone: the per-iteration
    overhead starts at 0, where that falls back to about 1.5e-8 of its unit (1.5e-14 s),
    far below the scale at which the simulated time is smooth in it.
    """
    steps = []
    for v, p in zip(x, params, strict=True):
        h = DIFF_STEP * max(1.0, abs(v))
        steps.append(-h if v + h > p.hi else h)
    return steps


class _EvaluationsSpent(Exception):
    """The fit used the evaluations it was allowed."""


def _key(x) -> tuple:
    """A point of the fit as the cache's key (rounded: least squares' copies of one point
    differ in the last bits)."""
    return tuple(round(float(v), 12) for v in x)


def fitted_params(hw) -> list[Param]:
    """The parameters this hardware model exposes."""
    names = {f.name for f in dataclasses.fields(hw)}
    return [p for p in PARAMS if p.field in names]


def to_hardware(base, params: list[Param], x) -> object:
    values = {p.field: v * p.unit for p, v in zip(params, x, strict=True)}
    return dataclasses.replace(base, **values)


def initial(base, params: list[Param]) -> list[float]:
    x = [getattr(base, p.field) / p.unit for p in params]
    return [min(max(v, p.lo), p.hi) for v, p in zip(x, params, strict=True)]


def split_by_shape(records: list[dict], holdout_fraction: float = 0.25,
                   seed: int = 0) -> tuple[set[str], set[str]]:
    """(training shapes, held-out shapes); see the module docstring."""
    by_group: dict[str, set[str]] = {}
    for rec in records:
        by_group.setdefault(group_key(rec), set()).add(shape_key(rec))
    train, held = set(), set()
    for shapes in by_group.values():
        ordered = sorted(shapes, key=lambda s: hashlib.sha256(f"{seed}:{s}".encode()).digest())
        k = 0 if len(ordered) < 2 else max(1, round(holdout_fraction * len(ordered)))
        held.update(ordered[:k])
        train.update(ordered[k:])
    return train, held


def _time_of(pred: dict) -> float:
    if pred.get("time_s") is None:
        raise ProblemError("calibrate needs predicted times, and the model gave none: the "
                           "timing simulator (simulator.sim) is not available")
    return pred["time_s"]


def _time_one(task) -> float:
    predictor, rec, hw = task
    return _time_of(predict_record(predictor, rec, hw))


def _time_or_refusal(task) -> tuple[float | None, str | None]:
    """(time, None), or (None, why) when the model refuses the record's config."""
    pred, why = predict_or_refusal(task)
    if pred is None:
        return None, why
    try:
        return _time_of(pred), None
    except ProblemError as exc:
        return None, str(exc)


def predictable(records: list[dict], hw, predictor, pool=None) -> tuple[list, list, list]:
    """(records the model predicts, their times on ``hw``, refusals): a record the model
    refuses (a tiling that does not fit, ``kernel_facts`` of another config) is left out
    with its reason, ``{"record_id", "reason"}``, instead of stopping the fit."""
    results = _map(_time_or_refusal, records, hw, predictor, pool)
    kept, times, refused = [], [], []
    for rec, (time_s, reason) in zip(records, results, strict=True):
        if reason is None:
            kept.append(rec)
            times.append(time_s)
        else:
            refused.append({"record_id": rec["record_id"], "reason": reason})
    return kept, times, refused


def predicted_times(records: list[dict], hw, predictor, pool=None) -> list[float]:
    """The model's time for each record on ``hw`` (one evaluation of the fit), in ``pool``'s
    processes if given."""
    return _map(_time_one, records, hw, predictor, pool)


def _map(fn, records: list[dict], hw, predictor, pool) -> list:
    """``fn((predictor, record, hw))`` for each record, in ``pool``'s processes if given."""
    tasks = [(predictor, rec, hw) for rec in records]
    if pool is None:
        return [fn(task) for task in tasks]
    return list(pool.map(fn, tasks, chunksize=max(1, len(tasks) // 64)))


def subsample(records: list[dict], k: int | None, seed: int = 0) -> list[dict]:
    """At most ``k`` records, taken round-robin over schedule groups in a seeded order."""
    if k is None or len(records) <= k:
        return records
    by_group: dict[str, list[dict]] = {}
    for rec in sorted(records, key=lambda r: hashlib.sha256(
            f"{seed}:{r['record_id']}".encode()).digest()):
        by_group.setdefault(group_key(rec), []).append(rec)
    queues, out = list(by_group.values()), []
    while len(out) < k:
        for queue in queues:
            if queue and len(out) < k:
                out.append(queue.pop(0))
    return out


def _errors(pred: list[float], meas: list[float]) -> dict:
    if not pred:
        return {"n": 0, "mape_pct": None, "max_pct": None}
    return {"n": len(pred), "mape_pct": stats.mape(pred, meas),
            "max_pct": stats.max_abs_error(pred, meas)}


def sequence_length(rec: dict) -> int:
    """The longer of a record's query and key/value lengths (what simulation cost grows
    with: a decode record's K/V length, an attention record's N)."""
    return max(rec["problem"]["seq_q"], rec["problem"].get("seq_kv") or 0)


def fit(records: list[dict], base, predictor, holdout_fraction: float = 0.25, seed: int = 0,
        max_evals: int = 200, jobs: int = 1, max_train_records: int | None = None,
        train_max_seq: int | None = None, warn=None, progress=None) -> dict:
    """Fit on the training shapes, evaluate on the held-out ones; returns the report.

    Every evaluation re-simulates the training records, so the cost is (evaluations x
    records x one simulation): ``jobs`` spreads the records over processes (``predictor``
    must then be a module-level function), ``train_max_seq`` fits only on training shapes
    up to that sequence length (a simulation's cost grows with it; naive attention at 16k
    takes about 20 s) and ``max_train_records`` on a seeded, schedule-balanced subset of the
    training records. Neither changes the held-out shapes: they are split off first, at
    every length, and training records left out by either are neither fitted nor reported.
    Records the model refuses are left out before the fit starts (``warn(line)`` is called
    for each, if given) and listed in the report's ``refused``. ``progress(line)``, if
    given, hears what the fit is doing: its start, each evaluation (with the training
    error there and the best so far) and the held-out predictions at the end.

    The Jacobian is a forward difference (``jacobian_steps``), its points simulated like
    any other.
    """
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=jobs) as pool:
            return _fit(records, base, predictor, holdout_fraction, seed, max_evals, pool,
                        max_train_records, train_max_seq, warn, progress)
    return _fit(records, base, predictor, holdout_fraction, seed, max_evals, None,
                max_train_records, train_max_seq, warn, progress)


def _fit(records, base, predictor, holdout_fraction, seed, max_evals, pool,
         max_train_records, train_max_seq, warn, progress) -> dict:
    import numpy as np
    from scipy.optimize import least_squares

    # A config measured twice (a later run of the same plan) counts once: its latest record.
    usable = [r for r in latest_per_config(records)[0]
              if r["implementation"] == "triton" and r["timing"]]
    if not usable:
        raise ProblemError("no timed Triton records to calibrate on")
    train_shapes, held_shapes = split_by_shape(usable, holdout_fraction, seed)
    if not train_shapes or not held_shapes:
        raise ProblemError("calibration needs at least two shapes in one schedule (one to "
                           "fit, one held out)")
    train = subsample([r for r in usable if shape_key(r) in train_shapes
                       and (train_max_seq is None or sequence_length(r) <= train_max_seq)],
                      max_train_records, seed)
    if not train:
        raise ProblemError(f"no training record is at most {train_max_seq} long; raise "
                           "--train-max-seq")
    # Both sets are predicted on the base preset first: what the model refuses is left out
    # (and listed) before hours of fitting, not found after them. The held-out records'
    # base predictions are only reported; nothing of them enters the fit.
    train, before_train, refused_train = predictable(train, base, predictor, pool)
    held, before_held, refused_held = predictable(
        [r for r in usable if shape_key(r) in held_shapes], base, predictor, pool)
    for which, kept, refusals in (("training", train, refused_train),
                                  ("held-out", held, refused_held)):
        if not kept:
            raise ProblemError(f"the model refuses every {which} record ("
                               f"{refusals[0]['record_id']}: {refusals[0]['reason']})")
    refused = refused_train + refused_held
    for refusal in refused if warn else ():
        warn(f"left out record {refusal['record_id']}: {refusal['reason']}")
    # The shapes the fit actually saw (the split's others were left out by the filters).
    fitted_shapes = {shape_key(r) for r in train}
    params = fitted_params(base)
    meas_train = [r["timing"]["median_s"] for r in train]
    meas_held = [r["timing"]["median_s"] for r in held]
    # Every simulation of the training records, the Jacobian's included (least_squares'
    # nfev leaves those out), counts against max_evals. The answer is the evaluated point
    # of least cost: least_squares' own, or a Jacobian point that did better.
    cache: dict[tuple, list[float]] = {}
    best: dict = {"cost": math.inf, "key": None}

    def residuals(x) -> list[float]:
        key = _key(x)
        new = key not in cache
        if new:
            if len(cache) >= max_evals:
                raise _EvaluationsSpent
            cache[key] = predicted_times(train, to_hardware(base, params, key), predictor,
                                         pool)
        res = [math.log(p / m) for p, m in zip(cache[key], meas_train, strict=True)]
        cost = sum(r * r for r in res)
        if cost < best["cost"]:
            best.update(cost=cost, key=key)
        if new and progress:
            progress(f"evaluation {len(cache)} of at most {max_evals}: training time MAPE "
                     f"{stats.mape(cache[key], meas_train):.2f}% (best so far "
                     f"{stats.mape(cache[best['key']], meas_train):.2f}%)")
        return res

    def jacobian(x):
        key = _key(x)
        r0 = np.array(residuals(key))
        columns = []
        for i, h in enumerate(jacobian_steps(key, params)):
            point = _key([v + h if j == i else v for j, v in enumerate(key)])
            columns.append((np.array(residuals(point)) - r0) / (point[i] - key[i]))
        return np.stack(columns, axis=1)

    if progress:
        progress(f"fitting {len(params)} parameters to {len(train)} training records "
                 f"({len(fitted_shapes)} shapes; {len(held)} held-out records of "
                 f"{len(held_shapes)} shapes wait for the end); an evaluation simulates "
                 f"every training record, and each step's Jacobian takes {len(params)}")
    x0 = initial(base, params)
    start = _key(x0)
    if to_hardware(base, params, start) == base:  # the fit starts where before_train was
        cache[start] = before_train  # one evaluation fewer (minutes with real records)
    try:
        result = least_squares(residuals, x0, jac=jacobian,
                               bounds=([p.lo for p in params], [p.hi for p in params]),
                               x_scale="jac")
        converged, message = bool(result.success), str(result.message)
    except _EvaluationsSpent:
        converged = False
        message = f"stopped after {max_evals} evaluations (--max-evals)"
    x = best["key"]
    fitted_hw = to_hardware(base, params, x)
    after_train = cache[x]
    # The held-out records are predicted with fitted parameters only here, after the fit.
    if progress:
        progress(f"fit done ({message}); predicting the {len(held)} held-out records")
    after_held = predicted_times(held, fitted_hw, predictor, pool)
    values = []
    for p, v in zip(params, x, strict=True):
        at_bound = math.isclose(v, p.lo, abs_tol=1e-6) or math.isclose(v, p.hi, abs_tol=1e-6)
        values.append({"field": p.field, "base": getattr(base, p.field),
                       "fitted": getattr(fitted_hw, p.field), "at_bound": at_bound})
    return {"hardware": fitted_hw, "base": base.name, "params": values,
            "train_shapes": sorted(fitted_shapes), "held_out_shapes": sorted(held_shapes),
            "unused_train_shapes": sorted(train_shapes - fitted_shapes),
            "train_max_seq": train_max_seq, "max_train_records": max_train_records,
            "n_train": len(train), "n_held_out": len(held), "refused": refused,
            "train": {"before": _errors(before_train, meas_train),
                      "after": _errors(after_train, meas_train)},
            "held_out": {"before": _errors(before_held, meas_held),
                         "after": _errors(after_held, meas_held)},
            "evaluations": len(cache), "converged": converged,
            "message": message, "seed": seed,
            "holdout_fraction": holdout_fraction}
