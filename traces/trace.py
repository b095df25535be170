"""Access traces: the records of every kernel of a schedule, with metadata, as Parquet.

A ``Trace`` holds, per kernel, a numpy structured array of ``RECORD_DTYPE`` (one record per
tile load, tile store or compute step, in execution order) and the metadata that makes it
self-describing: problem, tiling, schedule, tensor layouts, the hardware it was written for
(the access stream does not depend on it; replay and simulation take their own), tool
version and a content hash.
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
from traces.schedules import Schedule, build_schedule
from traces.schedules.base import LOAD, STORE, Tensor
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
        return {
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

    def content_hash(self) -> str:
        """SHA-256 over the records of every kernel, in order."""
        h = hashlib.sha256()
        for k in self.kernels:
            h.update(k.name.encode())
            h.update(np.ascontiguousarray(k.records).view(np.uint8).data)
        return h.hexdigest()


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


def read_metadata(path: str | Path) -> dict:
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise TraceError(f"trace file not found: {path}")
    try:
        meta = pq.read_schema(str(path)).metadata or {}
    except Exception as exc:  # pyarrow raises several types for truncated/foreign files
        raise TraceError(f"{path} is not a readable Parquet file ({type(exc).__name__})") from None
    if METADATA_KEY not in meta:
        raise TraceError(f"{path} is a Parquet file but not a tilesim trace (no metadata)")
    try:
        info = json.loads(meta[METADATA_KEY])
    except json.JSONDecodeError:
        raise TraceError(f"{path}: tilesim metadata is corrupt") from None
    if info.get("schema") != TRACE_SCHEMA:
        raise TraceError(f"{path}: unsupported trace schema {info.get('schema')!r}")
    return info


def read_parquet(path: str | Path, verify: bool = True) -> Trace:
    """Read a trace written by ``write_parquet``; checks structure and the content hash."""
    import pyarrow.parquet as pq

    info = read_metadata(path)
    try:
        table = pq.read_table(str(path))
    except Exception as exc:
        raise TraceError(f"{path} is truncated or corrupt ({type(exc).__name__})") from None
    missing = [f for f in ("kernel", *RECORD_DTYPE.names) if f not in table.column_names]
    if missing:
        raise TraceError(f"{path}: trace lacks columns {', '.join(missing)}")
    kernel_col = table.column("kernel").to_numpy()
    records = np.zeros(table.num_rows, dtype=RECORD_DTYPE)
    for field in RECORD_DTYPE.names:
        records[field] = table.column(field).to_numpy()
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
