"""Measurement records: JSON Lines, schema ``tilesim.record/1``, one measured config a line.

A record is self-contained: the environment it was measured in (GPU, driver, CUDA, torch,
triton and ncu versions, clocks, date), the problem, the tiling and schedule (or the PyTorch
peer that ran instead), the kernels launched, the correctness error against the float64
reference, the timing (median, p20, p80 over repeats with L2 flushed before each) and the
Nsight Compute counters — or ``null`` with the reason why there are none. Triton records
of a device run also keep ``kernel_facts``: per kernel, as the GPU's own Triton compiled
it, its shared memory and what its wgmma ask of shared memory per FLOP
(``validation.compile.kernel_facts``; ``null`` where the run did not compile it ahead).

Reading validates every line and reports a malformed one as ``path:line: what is wrong``;
the other lines still load. Writing is atomic: a line is appended with one ``write`` and
fsynced, a whole file is written to a temporary file and renamed over the target, so a
crash never leaves half a record behind.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from traces.problem import AttentionProblem, ProblemError
from traces.tiling import Tiling

SCHEMA = "tilesim.record/1"
IMPLEMENTATIONS = ("triton", "sdpa_math", "sdpa_flash")
TIMING_KEYS = ("median_s", "p20_s", "p80_s")


class RecordError(ProblemError):
    """A record file or line that cannot be used."""


@dataclass(frozen=True)
class LineError:
    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


def validate_record(rec: object) -> None:
    """Raise ``RecordError`` with a short reason unless ``rec`` is a valid record dict."""
    if not isinstance(rec, dict):
        raise RecordError(f"a record must be a JSON object, got {type(rec).__name__}")
    if rec.get("schema") != SCHEMA:
        raise RecordError(f'"schema" must be "{SCHEMA}", got {rec.get("schema")!r}')
    for key in ("record_id", "kernel"):
        if not isinstance(rec.get(key), str) or not rec[key]:
            raise RecordError(f'"{key}" must be a non-empty string')
    if not isinstance(rec.get("environment"), dict):
        raise RecordError('"environment" must be an object')
    impl = rec.get("implementation")
    if impl not in IMPLEMENTATIONS:
        raise RecordError(f'"implementation" must be one of {", ".join(IMPLEMENTATIONS)}, '
                          f"got {impl!r}")
    try:
        AttentionProblem.from_dict(rec.get("problem") or {})
    except (ProblemError, TypeError) as exc:
        raise RecordError(f'"problem" is not valid: {exc}') from None
    if impl == "triton":
        if not isinstance(rec.get("schedule"), str):
            raise RecordError('a triton record needs a "schedule"')
        try:
            Tiling.from_dict(rec.get("tiling") or {})
        except (ProblemError, TypeError) as exc:
            raise RecordError(f'"tiling" is not valid: {exc}') from None
    timing = rec.get("timing")
    if timing is not None:
        if not isinstance(timing, dict):
            raise RecordError('"timing" must be an object or null')
        for key in TIMING_KEYS:
            value = timing.get(key)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise RecordError(f'"timing.{key}" must be a number > 0, got {value!r}')
    elif not rec.get("timing_reason"):
        raise RecordError('"timing" is null but "timing_reason" does not say why')
    counters = rec.get("counters")
    if counters is not None and not isinstance(counters, dict):
        raise RecordError('"counters" must be an object or null')
    if counters is None and not rec.get("counters_reason"):
        raise RecordError('"counters" is null but "counters_reason" does not say why')
    if not isinstance(rec.get("correctness"), dict):
        raise RecordError('"correctness" must be an object')


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
    if not path.is_file():
        raise RecordError(f"records file not found: {path}")
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


def append_record(path: str | Path, rec: dict) -> None:
    """Append one validated record as one line: a single write, flushed and fsynced."""
    validate_record(rec)
    line = (_dumps(rec) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_records(path: str | Path, records: list[dict]) -> None:
    """Write a whole records file atomically: temporary file in the same folder, rename."""
    for rec in records:
        validate_record(rec)
    _write_text(Path(path), "".join(_dumps(rec) + "\n" for rec in records))


def _write_text(path: Path, text: str) -> None:
    """Temporary file in the target's folder, fsync, rename: all or nothing."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp",
                               dir=path.parent if str(path.parent) else ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; records are for everyone to read
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def update_run(path: str | Path, run_id: str, update) -> int:
    """Rewrite ``path`` atomically with ``update(rec)`` applied to the records of ``run_id``.

    Lines of other runs (malformed ones included) are kept byte for byte. Returns how many
    records were updated.
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
            validate_record(rec)
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


def group_key(rec: dict) -> str:
    """Schedule and pass: the groups the summary reports MAPE for (``fa2 bwd``)."""
    return f"{rec.get('schedule') or rec['implementation']} {rec['problem'].get('pass', 'fwd')}"
