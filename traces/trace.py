"""Access traces: the records of every kernel of a schedule, with metadata, as Parquet.

A ``Trace`` holds, per kernel, a numpy structured array of ``RECORD_DTYPE`` (one record per
tile load, tile store or compute step, in execution order) and the metadata that makes it
self-describing: problem, tiling, schedule, tensor layouts, the hardware it was written for
(the access stream does not depend on it; replay and simulation take their own), tool
version, a content hash over the records and a metadata hash over every other metadata
field (so an edited problem cannot give the records another meaning unnoticed).
Files are written atomically (temp file, then rename) and are deterministic: the same input
gives the same bytes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import njit

from traces.expand import RECORD_DTYPE, expand_kernel
from traces.problem import AttentionProblem, ProblemError
from traces.schedules import SCHEDULE_NAMES, Schedule, build_schedule
from traces.schedules.base import COMPUTE, LOAD, STORE, Tensor
from traces.tiling import Tiling

TRACE_SCHEMA = "tilesim.trace/1"
METADATA_KEY = b"tilesim"


class TraceError(ProblemError):
    """A trace file that cannot be read."""


@dataclass
class KernelTrace:
    name: str
    grid: int
    records: np.ndarray


@dataclass
class Trace:
    schedule: str
    problem: AttentionProblem
    tiling: Tiling
    tensors: dict[str, Tensor]
    kernels: list[KernelTrace]
    tool_version: str = ""
    hardware: str = ""

    @classmethod
    def from_schedule(cls, sched: Schedule, tool_version: str = "",
                      hardware: str = "") -> Trace:
        return cls(sched.name, sched.problem, sched.tiling, sched.tensors,
                   list(iter_kernel_traces(sched)), tool_version, hardware)

    @classmethod
    def build(cls, problem: AttentionProblem, tiling: Tiling, schedule: str,
              tool_version: str = "") -> Trace:
        return cls.from_schedule(build_schedule(problem, tiling, schedule), tool_version)

    @property
    def tensor_names(self) -> list[str]:
        return list(self.tensors)

    @property
    def n_records(self) -> int:
        return sum(k.records.size for k in self.kernels)

    def metadata(self) -> dict:
        info = {
            "schema": TRACE_SCHEMA,
            "tool_version": self.tool_version,
            "schedule": self.schedule,
            "problem": self.problem.to_dict(),
            "tiling": self.tiling.to_dict(),
            "hardware": self.hardware,
            "tensors": [vars(t) for t in self.tensors.values()],
            "kernels": [{"name": k.name, "grid": k.grid, "records": int(k.records.size)}
                        for k in self.kernels],
            "content_hash": self.content_hash(),
        }
        info["metadata_hash"] = metadata_hash(info)
        return info

    def content_hash(self) -> str:
        """SHA-256 over the records of every kernel, in order."""
        h = hashlib.sha256()
        for k in self.kernels:
            h.update(k.name.encode())
            h.update(np.ascontiguousarray(k.records).view(np.uint8).data)
        return h.hexdigest()


def metadata_hash(info: dict) -> str:
    """SHA-256 over the canonical JSON of every metadata field but ``metadata_hash`` itself.

    The fields include ``content_hash``, so this one hash vouches for the whole file.
    """
    fields = {k: v for k, v in info.items() if k != "metadata_hash"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":"))
                          .encode()).hexdigest()


def iter_kernel_traces(sched: Schedule) -> Iterator[KernelTrace]:
    """Expand one kernel at a time, so a caller can stream kernels to a file."""
    ids = {name: i for i, name in enumerate(sched.tensors)}
    for kernel in sched.kernels:
        yield KernelTrace(kernel.name, kernel.grid, expand_kernel(kernel, ids))


@njit(cache=True)
def _sum_records(records, n_tensors):  # pragma: no cover - numba
    reads = np.zeros(n_tensors, dtype=np.int64)
    writes = np.zeros(n_tensors, dtype=np.int64)
    work = np.zeros(3, dtype=np.int64)
    for i in range(records.shape[0]):
        r = records[i]
        if r.op == LOAD:
            reads[r.tensor] += r.bytes
        elif r.op == STORE:
            writes[r.tensor] += r.bytes
        else:
            work[0] += r.tensor_flops
            work[1] += r.exp_ops
            work[2] += r.other_flops
    return reads, writes, work


def record_counts(records: np.ndarray, n_tensors: int) -> dict:
    """Bytes read and written per tensor index, and compute totals, from records.

    One compiled pass over the records (the replay path of ``tilesim replay``).
    """
    reads, writes, work = _sum_records(records, n_tensors)
    return {"reads": reads, "writes": writes, "tensor_flops": int(work[0]),
            "exp_ops": int(work[1]), "other_flops": int(work[2])}


# ---- Parquet -----------------------------------------------------------------------------

def _arrow_table(kernel_index: int, records: np.ndarray):
    import pyarrow as pa

    columns = {"kernel": pa.array(np.full(records.size, kernel_index, dtype=np.uint16))}
    for field in RECORD_DTYPE.names:
        columns[field] = pa.array(np.ascontiguousarray(records[field]))
    return pa.table(columns)


def write_parquet(trace: Trace, path: str | Path) -> None:
    """Write ``trace`` to ``path`` (the caller makes it atomic); one row group per kernel."""
    import pyarrow.parquet as pq

    schema = _arrow_table(0, np.zeros(0, dtype=RECORD_DTYPE)).schema
    schema = schema.with_metadata({METADATA_KEY: json.dumps(trace.metadata()).encode()})
    with pq.ParquetWriter(str(path), schema, compression="zstd") as writer:
        for index, kernel in enumerate(trace.kernels):
            writer.write_table(_arrow_table(index, kernel.records).cast(schema))


# Metadata fields and their JSON types. "hardware" and "metadata_hash" are optional: files
# written before they existed lack them.
_FIELDS = {"schedule": str, "tool_version": str, "problem": dict, "tiling": dict,
           "tensors": list, "kernels": list, "content_hash": str}
_OPTIONAL = {"hardware": str, "metadata_hash": str}
# The integer fields of a "tensors" and a "kernels" entry (besides "name"), each with the
# least value it may take.
_ENTRY_INTS = {"tensors": {"planes": 1, "rows": 1, "cols": 1, "elem_bytes": 1, "base": 0},
               "kernels": {"grid": 1, "records": 0}}
_KINDS = {dict: "an object", list: "a list", str: "a string", int: "a number",
          float: "a number", bool: "true/false", type(None): "null"}


def _check_metadata(info, path: Path) -> None:
    """``TraceError`` naming the first metadata field that is missing or malformed."""

    def bad(what: str) -> TraceError:
        return TraceError(f"{path}: trace metadata {what}")

    if not isinstance(info, dict):
        raise bad(f"is {_KINDS.get(type(info), 'a value')}, not an object")
    if info.get("schema") != TRACE_SCHEMA:
        raise TraceError(f"{path}: unsupported trace schema {info.get('schema')!r}")
    for key, kind in {**_FIELDS, **_OPTIONAL}.items():
        if key not in info:
            if key in _FIELDS:
                raise bad(f'lacks "{key}"')
        elif type(info[key]) is not kind:
            raise bad(f'"{key}" is {_KINDS.get(type(info[key]))}, expected {_KINDS[kind]}')
    if info["schedule"] not in SCHEDULE_NAMES:
        raise bad(f'"schedule" {info["schedule"]!r} is not one of {", ".join(SCHEDULE_NAMES)}')
    for key, cls in (("problem", AttentionProblem), ("tiling", Tiling)):
        try:
            cls.from_dict(info[key])
        except (ProblemError, TypeError) as exc:  # a bad value, or a missing or unknown key
            raise bad(f'"{key}" is not valid: {exc}') from None
    if type(info["problem"].get("causal", False)) is not bool:
        raise bad('"problem" is not valid: "causal" must be true or false')
    for key, ints in _ENTRY_INTS.items():
        for i, entry in enumerate(info[key]):
            where = f'"{key}" entry {i}'
            if type(entry) is not dict or set(entry) != {"name", *ints}:
                raise bad(f"{where} is not an object of name, {', '.join(ints)}")
            if type(entry["name"]) is not str:
                raise bad(f'{where}: "name" is not a string')
            for field, least in ints.items():
                if type(entry[field]) is not int or entry[field] < least:
                    raise bad(f'{where}: "{field}" must be an integer >= {least}, '
                              f"got {entry[field]!r}")
    names = [t["name"] for t in info["tensors"]]
    if len(set(names)) != len(names):
        raise bad('"tensors" names a tensor twice')


def read_metadata(path: str | Path, verify: bool = True) -> dict:
    """The metadata of a trace file, checked field by field and, if ``verify``, against its
    metadata hash (files written before that hash existed have none; they load unchecked)."""
    import pyarrow.parquet as pq

    path = Path(path)
    if path.is_dir():
        raise TraceError(f"{path} is a directory, not a trace file")
    if not path.exists():
        raise TraceError(f"trace file not found: {path}")
    if not path.is_file():
        raise TraceError(f"{path} is not a regular file, so not a Parquet trace file")
    try:
        meta = pq.read_schema(str(path)).metadata or {}
    except Exception as exc:  # pyarrow raises several types for truncated/foreign files
        raise TraceError(f"{path} is not a readable Parquet file ({type(exc).__name__})") from None
    if METADATA_KEY not in meta:
        raise TraceError(f"{path} is a Parquet file but not a tilesim trace (no metadata)")
    try:
        info = json.loads(meta[METADATA_KEY])
    except (ValueError, RecursionError):  # bad JSON or bad UTF-8; absurdly deep nesting
        raise TraceError(f"{path}: tilesim metadata is corrupt") from None
    _check_metadata(info, path)
    if verify and "metadata_hash" in info and info["metadata_hash"] != metadata_hash(info):
        raise TraceError(f"{path}: metadata hash mismatch, the metadata was altered or is "
                         "corrupt")
    return info


def read_parquet(path: str | Path, verify: bool = True) -> Trace:
    """Read a trace written by ``write_parquet``.

    Checks the metadata (``read_metadata``), the columns' types, that no value is missing,
    that the records agree with the metadata's kernel and tensor lists and, if ``verify``,
    the content hash.
    """
    import pyarrow.parquet as pq

    path = Path(path)
    info = read_metadata(path, verify)
    try:
        table = pq.read_table(str(path))
    except Exception as exc:
        raise TraceError(f"{path} is truncated or corrupt ({type(exc).__name__})") from None
    if len(set(table.column_names)) != len(table.column_names):
        raise TraceError(f"{path}: trace has a column twice")
    expected = _arrow_table(0, np.zeros(0, dtype=RECORD_DTYPE)).schema
    missing = [f for f in expected.names if f not in table.column_names]
    if missing:
        raise TraceError(f"{path}: trace lacks columns {', '.join(missing)}")
    for field in expected:
        column = table.column(field.name)
        if column.type != field.type:
            raise TraceError(f"{path}: column {field.name} holds {column.type}, "
                             f"expected {field.type}")
        if column.null_count:
            raise TraceError(f"{path}: column {field.name} has missing values "
                             f"({column.null_count} of {len(column)})")
    kernel_col = table.column("kernel").to_numpy()
    records = np.zeros(table.num_rows, dtype=RECORD_DTYPE)
    for field in RECORD_DTYPE.names:
        records[field] = table.column(field).to_numpy()
    listed = sum(k["records"] for k in info["kernels"])
    if table.num_rows != listed:
        raise TraceError(f"{path}: the file has {table.num_rows} records, its metadata lists "
                         f"{listed}")
    if records.size and records["op"].max() > COMPUTE:
        raise TraceError(f"{path}: records hold op {records['op'].max()}, known ops are 0..2")
    accesses = records["tensor"][records["op"] != COMPUTE]
    if accesses.size and accesses.max() >= len(info["tensors"]):
        raise TraceError(f"{path}: records refer to tensor {accesses.max()}, its metadata "
                         f"lists {len(info['tensors'])} tensors")
    kernels = []
    for index, k in enumerate(info["kernels"]):
        sel = records[kernel_col == index]
        if sel.size != k["records"]:
            raise TraceError(f"{path}: kernel {k['name']} has {sel.size} records, "
                             f"metadata says {k['records']}")
        kernels.append(KernelTrace(k["name"], k["grid"], sel))
    tensors = {t["name"]: Tensor(**t) for t in info["tensors"]}
    trace = Trace(info["schedule"], AttentionProblem.from_dict(info["problem"]),
                  Tiling.from_dict(info["tiling"]), tensors, kernels, info["tool_version"],
                  info.get("hardware", ""))
    if verify and trace.content_hash() != info["content_hash"]:
        raise TraceError(f"{path}: content hash mismatch, the file was altered or is corrupt")
    return trace
