"""Request-trace exports for DRAM simulators: Ramulator 2 and DRAMsim3.

Each tile load or store becomes the 64-byte requests that cover its bytes (row by row for a
strided tile, as one span for a contiguous one), in record order:

- Ramulator 2 LoadStoreTrace: ``LD 0x1f40`` / ``ST 0x1f40``, one request per line.
- DRAMsim3: ``0x1f40 READ 121``: address, READ or WRITE, issue cycle. Without timing the
  cycle is the request's index in the file.

Addresses are printed as fixed-width hexadecimal (wide enough for the largest address of
the trace) and cycles as fixed-width decimal; both parse as ordinary numbers. Lines are
formatted with numpy into byte buffers chunk by chunk, so memory stays flat however long
the export is.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import BinaryIO

import numpy as np

from traces.schedules.base import LOAD, STORE

REQUEST_BYTES = 64
CHUNK_LINES = 1 << 21
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_DEC = np.frombuffer(b"0123456789", dtype=np.uint8)


def _requests(records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """64-byte-aligned request addresses and their op (LOAD/STORE) for access records."""
    acc = records[(records["op"] == LOAD) | (records["op"] == STORE)]
    acc = acc[acc["bytes"] > 0]
    rows = acc["rows"].astype(np.int64)
    row_bytes = acc["row_bytes"].astype(np.int64)
    stride = acc["row_stride"].astype(np.int64)
    contiguous = row_bytes == stride
    # A contiguous tile is one span; a strided one is `rows` spans.
    spans = np.where(contiguous, 1, rows)
    owner = np.repeat(np.arange(acc.size), spans)
    first_span = np.zeros(acc.size, dtype=np.int64)
    np.cumsum(spans[:-1], out=first_span[1:])
    row = np.arange(owner.size, dtype=np.int64) - first_span[owner]
    start = acc["address"].astype(np.int64)[owner] + row * stride[owner]
    length = np.where(contiguous[owner], rows[owner] * row_bytes[owner], row_bytes[owner])
    first_line = start // REQUEST_BYTES
    n_lines = (start + length - 1) // REQUEST_BYTES - first_line + 1
    line_owner = np.repeat(np.arange(owner.size), n_lines)
    first_of = np.zeros(owner.size, dtype=np.int64)
    np.cumsum(n_lines[:-1], out=first_of[1:])
    line = first_line[line_owner] + np.arange(line_owner.size) - first_of[line_owner]
    return line * REQUEST_BYTES, acc["op"][owner][line_owner]


def _digits(values: np.ndarray, width: int, base: int) -> np.ndarray:
    """Fixed-width digit characters of non-negative integers, as a (n, width) uint8 array."""
    table = _HEX if base == 16 else _DEC
    out = np.empty((values.size, width), dtype=np.uint8)
    v = values.astype(np.uint64)
    for col in range(width - 1, -1, -1):
        out[:, col] = table[(v % base).astype(np.intp)]
        v //= base
    return out


def _chunks(records_iter: Iterable[np.ndarray]):
    for records in records_iter:
        # Bound the number of records per step so the request expansion stays small.
        step = max(1, CHUNK_LINES // 256)
        for lo in range(0, records.size, step):
            yield _requests(records[lo:lo + step])


def address_width(max_address: int) -> int:
    return max(1, (int(max_address).bit_length() + 3) // 4)


def write_ramulator2(records_iter: Iterable[np.ndarray], out: BinaryIO, width: int) -> int:
    """Write ``LD 0x...`` / ``ST 0x...`` lines; returns the number of lines."""
    total = 0
    for addresses, ops in _chunks(records_iter):
        n = addresses.size
        if not n:
            continue
        line = np.empty((n, 6 + width), dtype=np.uint8)
        line[:, 0] = np.where(ops == LOAD, ord("L"), ord("S"))
        line[:, 1] = np.where(ops == LOAD, ord("D"), ord("T"))
        line[:, 2:5] = np.frombuffer(b" 0x", dtype=np.uint8)
        line[:, 5:5 + width] = _digits(addresses, width, 16)
        line[:, -1] = ord("\n")
        out.write(line.tobytes())
        total += n
    return total


def write_dramsim3(records_iter: Iterable[np.ndarray], out: BinaryIO, width: int,
                   total_requests: int) -> int:
    """Write ``0x... READ|WRITE cycle`` lines, cycle = request index; returns line count."""
    cycle_width = max(1, len(str(max(total_requests - 1, 0))))
    done = 0
    for addresses, ops in _chunks(records_iter):
        n = addresses.size
        if not n:
            continue
        # "0x" + addr + " " + ("READ " | "WRITE") + " " + cycle + "\n"; READ padded by a space.
        line = np.empty((n, 2 + width + 1 + 5 + 1 + cycle_width + 1), dtype=np.uint8)
        line[:, 0:2] = np.frombuffer(b"0x", dtype=np.uint8)
        line[:, 2:2 + width] = _digits(addresses, width, 16)
        c = 2 + width
        line[:, c] = ord(" ")
        line[:, c + 1:c + 6] = np.where((ops == LOAD)[:, None],
                                        np.frombuffer(b"READ ", dtype=np.uint8),
                                        np.frombuffer(b"WRITE", dtype=np.uint8))
        line[:, c + 6] = ord(" ")
        line[:, c + 7:c + 7 + cycle_width] = _digits(np.arange(done, done + n), cycle_width, 10)
        line[:, -1] = ord("\n")
        raw = line.tobytes()
        # "READ  12" would carry two spaces; drop the padding space after READ.
        out.write(raw.replace(b"READ  ", b"READ "))
        done += n
    return done


def count_requests(records_iter: Iterable[np.ndarray]) -> int:
    return sum(a.size for a, _ in _chunks(records_iter))
