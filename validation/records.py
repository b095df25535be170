"""Measurement records: JSON Lines, schema ``tilesim.record/1``, one measured config a line.

A record is self-contained: the environment it was measured in (GPU, driver, CUDA, torch,
triton and ncu versions, clocks, date), the problem, the tiling and schedule (or the PyTorch
peer that ran instead), the kernels launched, the correctness error against the float64
reference, the timing (median, p20, p80 over repeats with L2 flushed before each) and the
Nsight Compute counters — or ``null`` with the reason why there are none. Triton records
of a device run also keep ``kernel_facts``: per kernel, as the GPU's own Triton compiled
it, its shared memory, registers per thread and spilled bytes, and what its wgmma ask of
shared memory per FLOP
(``validation.compile.kernel_facts``; ``null`` where the run did not compile it ahead).

Reading validates every line and reports a malformed one as ``path:line: what is wrong``;
the other lines still load. Writing is atomic: a line is appended with one ``write`` and
fsynced, a whole file is written to a temporary file and renamed over the target, so a
crash never leaves half a record behind.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from simulator.cli.common import write_atomically
from traces.problem import AttentionProblem, ProblemError
from traces.tiling import Tiling
from validation.ncu import METRICS

SCHEMA = "tilesim.record/1"
IMPLEMENTATIONS = ("triton", "sdpa_math", "sdpa_flash")
TIMING_KEYS = ("median_s", "p20_s", "p80_s")
# ``timing.method`` of the runner's timings: do_bench, which zeroes 256 MiB (L2 flushed,
# ``timing.l2_flushed``) before every timed run.
DO_BENCH = "triton.testing.do_bench"
# A timing whose middle runs (p20 to p80) span more than this share of their median timed
# the config inconsistently: the runner times it again, reconcile lists it. The H200
# records' median spread is 0.36%; a repeat of 30 configs on a second machine agreed to
# 0.62% on average (BENCHMARKS.md).
UNSTABLE_SPREAD_PCT = 10.0
# What ncu measured, per kernel and summed over a record's kernels (``validation.ncu``):
# counts, bytes, seconds, a hit rate and the SMs' clock (the runner's since 2026-12-06), each
# >= 0 or null where ncu gave none.
KERNEL_COUNTER_KEYS = tuple(METRICS.values())
COUNTER_KEYS = (*KERNEL_COUNTER_KEYS, "l2_read_bytes", "l2_write_bytes")
FACT_KEYS = ("shared_bytes", "registers", "spill_bytes", "wgmma_smem_bytes_per_flop",
             "wgmma_smem_bytes_per_flop_max", "loads_in_flight", "loop_instructions",
             "spill_load_bytes_per_iteration", "spill_store_bytes_per_iteration",
             "spill_reload_waits", "straight_instructions", "prologue_instructions",
             "epilogue_instructions", "masked_loop_instructions")
COUNT_FACT_KEYS = ("shared_bytes", "registers", "spill_bytes", "loads_in_flight",
                   "loop_instructions", "spill_load_bytes_per_iteration",
                   "spill_store_bytes_per_iteration", "spill_reload_waits",
                   "straight_instructions", "prologue_instructions", "epilogue_instructions",
                   "masked_loop_instructions")


class RecordError(ProblemError):
    """A record file or line that cannot be used."""


@dataclass(frozen=True)
class LineError:
    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


def spread_pct(rec: dict) -> float | None:
    """How far apart a record's middle timed runs were: ``(p80 - p20) / median``, percent;
    None without the three."""
    t = rec.get("timing") or {}
    median, p20, p80 = (t.get(k) for k in TIMING_KEYS)
    if p20 is None or p80 is None or not median:
        return None
    return 100.0 * (p80 - p20) / median


def _kind(value: object) -> str:
    """What a JSON value is, in JSON's words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {dict: "an object", list: "a list", str: "a string"}.get(type(value), "a number")


def _number(value: object, where: str, positive: bool = False,
            optional: bool = False) -> None:
    """``RecordError`` unless ``value`` is a finite number >= 0 (> 0 if ``positive``), or
    null where ``optional``."""
    if value is None and optional:
        return
    if (not isinstance(value, (int, float)) or isinstance(value, bool)
            or not math.isfinite(value) or value < 0 or (positive and value == 0)):
        raise RecordError(f'"{where}" must be a finite number {"> 0" if positive else ">= 0"}'
                          f'{" or null" if optional else ""}, got {value!r}')


def _objects(value: object, where: str, numbers: tuple[str, ...]) -> None:
    """``RecordError`` unless ``value`` is null or a list of objects, each with a non-empty
    ``"name"`` and its ``numbers`` (where present) finite and >= 0 or null."""
    if value is None:
        return
    if not isinstance(value, list):
        raise RecordError(f'"{where}" must be a list of objects or null, got {_kind(value)}')
    for i, entry in enumerate(value):
        if not isinstance(entry, dict):
            raise RecordError(f'"{where}[{i}]" must be an object, got {_kind(entry)}')
        if not isinstance(entry.get("name"), str) or not entry["name"]:
            raise RecordError(f'"{where}[{i}].name" must be a non-empty string')
        for key in numbers:
            _number(entry.get(key), f"{where}[{i}].{key}", optional=True)


def _non_finite(value: object, where: str) -> tuple[str, float] | None:
    """The first place in ``value`` that holds NaN or an infinity (which JSON has no words
    for: Python's reader takes them, our writer refuses them) and that number, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where, value
    if isinstance(value, dict):
        items = ((f"{where}.{k}" if where else str(k), v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for place, v in items:
        found = _non_finite(v, place)
        if found:
            return found
    return None


def validate_record(rec: object) -> None:
    """Raise ``RecordError`` with a short reason unless ``rec`` is a valid record dict.

    Every field that reconciliation, calibration or the report read is checked for its
    type and range (times > 0; counters, kernel facts and errors >= 0 or null), and no
    number anywhere may be NaN or infinite.
    """
    if not isinstance(rec, dict):
        raise RecordError(f"a record must be a JSON object, got {type(rec).__name__}")
    if rec.get("schema") != SCHEMA:
        raise RecordError(f'"schema" must be "{SCHEMA}", got {rec.get("schema")!r}')
    for key in ("record_id", "kernel"):
        if not isinstance(rec.get(key), str) or not rec[key]:
            raise RecordError(f'"{key}" must be a non-empty string')
    env = rec.get("environment")
    if not isinstance(env, dict):
        raise RecordError('"environment" must be an object')
    for key in ("gpu_name", "date_utc"):  # a record's preset and its age come from these
        if env.get(key) is not None and not isinstance(env[key], str):
            raise RecordError(f'"environment.{key}" must be a string or null, got {env[key]!r}')
    impl = rec.get("implementation")
    if impl not in IMPLEMENTATIONS:
        raise RecordError(f'"implementation" must be one of {", ".join(IMPLEMENTATIONS)}, '
                          f"got {impl!r}")
    problem = rec.get("problem")
    if not isinstance(problem, dict):
        raise RecordError(f'"problem" must be an object, got {_kind(problem)}')
    if not isinstance(problem.get("causal", False), bool):
        raise RecordError(f'"problem.causal" must be true or false, got {problem["causal"]!r}')
    try:
        AttentionProblem.from_dict(problem)
    except (ProblemError, TypeError) as exc:
        raise RecordError(f'"problem" is not valid: {exc}') from None
    if impl == "triton":
        if not isinstance(rec.get("schedule"), str):
            raise RecordError('a triton record needs a "schedule"')
        tiling = rec.get("tiling")
        if not isinstance(tiling, dict):
            raise RecordError(f'"tiling" must be an object, got {_kind(tiling)}')
        try:
            Tiling.from_dict(tiling)
        except (ProblemError, TypeError) as exc:
            raise RecordError(f'"tiling" is not valid: {exc}') from None
    timing = rec.get("timing")
    if timing is not None:
        if not isinstance(timing, dict):
            raise RecordError('"timing" must be an object or null')
        for key in TIMING_KEYS:
            _number(timing.get(key), f"timing.{key}", positive=True)
        _number(timing.get("tflops"), "timing.tflops", optional=True)
    elif not rec.get("timing_reason"):
        raise RecordError('"timing" is null but "timing_reason" does not say why')
    counters = rec.get("counters")
    if counters is not None and not isinstance(counters, dict):
        raise RecordError('"counters" must be an object or null')
    if counters is None and not rec.get("counters_reason"):
        raise RecordError('"counters" is null but "counters_reason" does not say why')
    if counters is not None:
        for key in COUNTER_KEYS:
            _number(counters.get(key), f"counters.{key}", optional=True)
        _objects(counters.get("kernels"), "counters.kernels", KERNEL_COUNTER_KEYS)
    _objects(rec.get("kernel_facts"), "kernel_facts", FACT_KEYS)
    names = [fact["name"] for fact in rec.get("kernel_facts") or ()]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:  # one compile per kernel: two facts for one would contradict each other
        raise RecordError(f'"kernel_facts" lists {", ".join(twice)} more than once')
    for i, fact in enumerate(rec.get("kernel_facts") or ()):
        layouts = fact.get("mma_layouts")
        if layouts is not None and not isinstance(layouts, str):
            raise RecordError(f'"kernel_facts[{i}].mma_layouts" must be a string or null, '
                              f"got {_kind(layouts)}")
        after = fact.get("loads_issued_after_compute")
        if after is not None and not isinstance(after, bool):
            raise RecordError(f'"kernel_facts[{i}].loads_issued_after_compute" must be true, '
                              f"false or null, got {_kind(after)}")
        for key in COUNT_FACT_KEYS:  # what a compiler counts is whole
            if fact.get(key) is not None and not isinstance(fact[key], int):
                raise RecordError(f'"kernel_facts[{i}].{key}" must be an integer or null, '
                                  f"got {fact[key]!r}")
    correctness = rec.get("correctness")
    if not isinstance(correctness, dict):
        raise RecordError('"correctness" must be an object')
    _number(correctness.get("max_abs_error"), "correctness.max_abs_error", optional=True)
    found = _non_finite(rec, "")
    if found:
        raise RecordError(f'"{found[0]}" must be a finite number, got {found[1]!r}')


def parse_lines(lines, path: str = "<records>") -> tuple[list[dict], list[LineError]]:
    """Records and per-line errors from an iterable of JSON Lines (blank lines skipped)."""
    records, errors = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            errors.append(LineError(path, number, f"not valid JSON ({exc.msg}, column "
                                                  f"{exc.colno})"))
            continue
        try:
            validate_record(rec)
        except RecordError as exc:
            errors.append(LineError(path, number, str(exc)))
            continue
        records.append(rec)
    return records, errors


def read_records(path: str | Path) -> tuple[list[dict], list[LineError]]:
    """All valid records of one file, and one error per malformed line."""
    path = Path(path)
    if not path.exists():
        raise RecordError(f"records file not found: {path}")
    if path.is_dir():
        raise RecordError(f"records file {path} is a directory; give the .jsonl file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordError(f"cannot read records file {path}: {exc}") from None
    return parse_lines(text.splitlines(), str(path))


def read_many(paths) -> tuple[list[dict], list[LineError]]:
    records, errors = [], []
    for path in paths:
        recs, errs = read_records(path)
        records += recs
        errors += errs
    return records, errors


def _dumps(rec: dict) -> str:
    return json.dumps(rec, sort_keys=False, separators=(",", ":"), allow_nan=False)


def append_json_lines(path: str | Path, objects: list[dict]) -> None:
    """Append JSON objects, one a line, in a single write, flushed and fsynced: a run
    killed afterwards keeps them whole (the records, the overheads probe's rows)."""
    text = "".join(_dumps(obj) + "\n" for obj in objects).encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, text)
        os.fsync(fd)
    finally:
        os.close(fd)


def append_record(path: str | Path, rec: dict) -> None:
    """Append one validated record as one line: a single write, flushed and fsynced."""
    validate_record(rec)
    append_json_lines(path, [rec])


def write_records(path: str | Path, records: list[dict]) -> None:
    """Write a whole records file atomically: temporary file in the same folder, rename."""
    for rec in records:
        validate_record(rec)
    _write_text(Path(path), "".join(_dumps(rec) + "\n" for rec in records))


def _write_text(path: Path, text: str) -> None:
    """All or nothing (``write_atomically``: temporary file, fsync, rename)."""
    write_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def update_run(path: str | Path, run_id: str, update, on_invalid=None) -> int:
    """Rewrite ``path`` atomically with ``update(rec)`` applied to the records of ``run_id``.

    Lines of other runs (malformed ones included) are kept byte for byte. Returns how many
    records were updated. An updated record that is not valid raises ``RecordError``, or,
    with ``on_invalid``, keeps its line as it was and is passed to ``on_invalid(rec,
    error)`` (a device run must not lose every record's counters to one bad value).
    """
    path = Path(path)
    lines, n = path.read_text(encoding="utf-8").splitlines(), 0
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            rec = None
        if isinstance(rec, dict) and rec.get("run_id") == run_id:
            rec = update(rec)
            try:
                validate_record(rec)
            except RecordError as exc:
                if on_invalid is None:
                    raise
                on_invalid(rec, exc)
                out.append(line)
                continue
            line, n = _dumps(rec), n + 1
        out.append(line)
    _write_text(path, "".join(line + "\n" for line in out))
    return n


def shape_key(rec: dict) -> str:
    """What identifies a shape (everything but the tiling): schedule, pass and problem."""
    p = rec["problem"]
    return (f"{rec.get('schedule') or rec['implementation']} {p.get('pass', 'fwd')} "
            f"B={p['batch']} H={p['heads']}/{p.get('kv_heads') or p['heads']} "
            f"N={p['seq_q']}x{p.get('seq_kv') or p['seq_q']} d={p['head_dim']} {p['dtype']}"
            f"{' causal' if p.get('causal') else ''}")


def latest_per_config(records: list[dict]) -> tuple[list[dict], int]:
    """One record per (GPU, config), the latest measurement winning (a later run of the
    same plan repeats configs); returns the records kept and how many were dropped."""
    latest: dict[tuple, dict] = {}
    for rec in records:
        key = (rec["environment"].get("gpu_name"), rec["record_id"])
        if key not in latest or (rec["environment"].get("date_utc") or "") >= (
                latest[key]["environment"].get("date_utc") or ""):
            latest[key] = rec
    return list(latest.values()), len(records) - len(latest)


def group_key(rec: dict) -> str:
    """Schedule and pass: the groups the summary reports MAPE for (``fa2 bwd``)."""
    return f"{rec.get('schedule') or rec['implementation']} {rec['problem'].get('pass', 'fwd')}"
