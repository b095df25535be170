"""Hardware counters from Nsight Compute: one ``ncu`` process for the whole matrix.

``ncu --csv`` prints its results in long form, one row per (kernel launch, metric)::

    "ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",
    "Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",
    "Metric Value"
    "0","1234","python3","host","fa2_fwd","1","7","(256, 1, 1)","(64, 16, 1)","0","9.0",
    "Command line profiler metrics","dram__bytes_read.sum","byte","1,234,567"

Columns are found by name (versions add and drop some), values may carry thousands
separators, and units may be scaled (``Kbyte``, ``Mbyte``, ``usecond``, ``Ksector``)
unless ``--print-units base`` is given; all are converted to bytes, sectors, seconds and
percent. Lines that are not CSV (``==PROF==`` messages, the application's output) are
skipped.

Launches are matched to configs by kernel name and launch order: the profiled process
writes a manifest of the calls it made (config id, role, expected kernel names, whether
the call succeeded), and ``match`` walks manifest and launches side by side.
"""

from __future__ import annotations

import csv
import glob
import re
import shutil
import subprocess
from dataclasses import dataclass, field

# Metric -> the key it is stored under in a record's counters.
METRICS = {
    "dram__bytes_read.sum": "dram_read_bytes",
    "dram__bytes_write.sum": "dram_write_bytes",
    "lts__t_sectors_srcunit_tex_op_read.sum": "l2_read_sectors",
    "lts__t_sectors_srcunit_tex_op_write.sum": "l2_write_sectors",
    "lts__t_sector_hit_rate.pct": "l2_hit_rate_pct",
    "sm__sass_data_bytes_mem_shared.sum": "smem_bytes",
    "gpu__time_duration.sum": "duration_s",
    # the SMs' clock during the launch (they are in the GPC clock domain): the clock a
    # preset's sm_clock_hz and sm_clock_tensor_hz stand for, read on every kernel
    "gpc__cycles_elapsed.avg.per_second": "sm_clock_hz",
}
# Per-launch rates: a call's value is their mean weighted by what each launch moved or
# lasted, not their sum.
RATES = ("l2_hit_rate_pct", "sm_clock_hz")
KERNEL_FILTER = "regex:^(fa2_|fa1_|naive_|decode_)"
L2_SECTOR_BYTES = 32  # Hopper L2 sectors (CUDA C++ Best Practices Guide)
LOOKAHEAD = 4  # launches skipped at most to re-align after an unexpected one
_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
           "Ki": 1024.0, "Mi": 1024.0**2, "Gi": 1024.0**3, "Ti": 1024.0**4}
_FREQUENCY = {"hz": 1.0, "khz": 1e3, "mhz": 1e6, "ghz": 1e9}
_TIME = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0, "ns": 1e-9,
         "us": 1e-6, "ms": 1e-3, "s": 1.0}
_THOUSANDS = re.compile(r"^-?\d{1,3}(,\d{3})+(\.\d*)?$")


class NcuParseError(ValueError):
    """The ncu output holds no result table."""


@dataclass
class ProfiledLaunch:
    id: int
    name: str
    metrics: dict[str, float | None] = field(default_factory=dict)  # metric -> base value


def find_ncu() -> str | None:
    """The ncu executable: on PATH, else in the usual CUDA and Nsight Compute folders."""
    found = shutil.which("ncu")
    if found:
        return found
    for pattern in ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu",
                    "/usr/local/cuda-*/bin/ncu"):
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    return None


def run_tool(argv: list[str], timeout: float = 60.0) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout + done.stderr if done.returncode == 0 else None


def version(ncu: str) -> str | None:
    out = run_tool([ncu, "--version"])
    if not out:
        return None
    match = re.search(r"Version\s+([\w.]+)", out)
    return match.group(1) if match else out.strip().splitlines()[-1]


def query_metrics(ncu: str, chip: str = "gh100") -> str | None:
    """``ncu --query-metrics --chip <chip>``: the base metric names it knows, as text."""
    return run_tool([ncu, "--query-metrics", "--chip", chip], timeout=120.0)


def usable_metrics(query_text: str | None, wanted=tuple(METRICS)) -> tuple[list[str], list[str]]:
    """(metrics whose base name the query lists, those it does not). No query: keep all."""
    if not query_text:
        return list(wanted), []
    names = set(re.findall(r"^\s*([a-z0-9_]+__[a-z0-9_]+)", query_text, flags=re.M))
    if not names:  # a listing we cannot read: let ncu itself judge the names
        return list(wanted), []
    kept = [m for m in wanted if m.split(".")[0] in names]
    return kept, [m for m in wanted if m not in kept]


def command(ncu: str, metrics: list[str], target: list[str], base_units: bool = True,
            kernel_filter: str = KERNEL_FILTER, cache_control: str = "all") -> list[str]:
    """The one ncu command line that profiles the whole matrix run by ``target`` (or, with
    another filter and cache control, the overheads probe's kernels)."""
    argv = [ncu, "--csv", "--metrics", ",".join(metrics), "--clock-control", "none",
            "--cache-control", cache_control, "--target-processes", "all", "-k", kernel_filter]
    if base_units:
        argv[2:2] = ["--print-units", "base"]
    return argv + target


def parse_value(text: str, unit: str) -> tuple[float | None, str]:
    """A metric value in base units: (value, base unit), None for n/a or unparsable."""
    text, unit = text.strip(), unit.strip()
    if _THOUSANDS.match(text):
        text = text.replace(",", "")
    try:
        value = float(text)
    except ValueError:
        return None, unit
    if unit in _TIME:
        return value * _TIME[unit], "second"
    if unit.lower() in _FREQUENCY:  # ncu writes "hz", scaled "Mhz" or "Ghz"
        return value * _FREQUENCY[unit.lower()], "hz"
    if unit == "cycle/second":
        return value, "hz"
    for base in ("byte", "sector", "cycle", "inst", "request"):
        if unit.endswith(base) and unit[: -len(base)] in _PREFIX:
            return value * _PREFIX[unit[: -len(base)]], base
    if unit.endswith("B") and unit[:-1] in _PREFIX:  # KB, MB, KiB ...
        return value * _PREFIX[unit[:-1]], "byte"
    return value, unit


def first_error(text: str) -> str | None:
    """ncu's first ``==ERROR==`` line, without the prefix (why it produced no table: e.g.
    "Failed to initialize the profiler: LibraryNotLoaded" where the runtime hides the
    counters)."""
    for line in text.splitlines():
        if line.startswith("==ERROR=="):
            return line[len("==ERROR=="):].strip() or None
    return None


def parse_csv(text: str) -> list[ProfiledLaunch]:
    """Kernel launches, in ID (launch) order, with their metrics in base units."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise NcuParseError("no ncu result table (no header line starting with \"ID\")")
    rows = csv.reader(line for line in lines[start:] if line.startswith('"'))
    header = next(rows)
    try:
        col = {name: header.index(name) for name in
               ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value")}
    except ValueError as exc:
        raise NcuParseError(f"ncu table lacks a column: {exc}") from None
    launches: dict[int, ProfiledLaunch] = {}
    for row in rows:
        if len(row) != len(header) or row == header:
            continue
        try:
            launch_id = int(row[col["ID"]].replace(",", ""))
        except ValueError:
            continue
        launch = launches.setdefault(launch_id,
                                     ProfiledLaunch(launch_id, kernel_base_name(
                                         row[col["Kernel Name"]])))
        value, _ = parse_value(row[col["Metric Value"]], row[col["Metric Unit"]])
        launch.metrics[row[col["Metric Name"]]] = value
    return [launches[i] for i in sorted(launches)]


def kernel_base_name(name: str) -> str:
    """``void fa2_fwd(float*, ...)`` or ``fa2_fwd`` -> ``fa2_fwd``."""
    name = name.strip()
    name = name.split("(", 1)[0].strip()
    return name.split()[-1] if name else name


def match(launches: list[ProfiledLaunch], manifest: list[dict]) -> tuple[dict, dict]:
    """Assign launches to manifest calls by name and order.

    Returns ({config id: [launches]} for measured calls that succeeded and whose every
    kernel was found, {config id: reason} for the measured calls that did not).
    """
    matched, missing, pos = {}, {}, 0
    for entry in manifest:
        if entry.get("role") == "stopped":
            for cid in entry.get("remaining", []):
                missing[cid] = "not profiled: the ncu phase reached its time budget"
            continue
        got, lost = [], []
        for name in entry.get("kernels", []):
            hit = next((j for j in range(pos, min(pos + LOOKAHEAD + 1, len(launches)))
                        if launches[j].name == name), None)
            if hit is None:
                lost.append(name)
                continue
            got.append(launches[hit])
            pos = hit + 1
        cid = entry.get("config")
        if entry.get("role") != "measure" or cid is None:
            continue
        if not entry.get("ok", True):
            missing[cid] = f"the profiled call failed: {entry.get('error', 'unknown error')}"
        elif lost:
            missing[cid] = f"ncu has no result for {', '.join(lost)} (launch order mismatch)"
        else:
            matched[cid] = got
    return matched, missing


def counters(launches: list[ProfiledLaunch]) -> dict:
    """A record's ``counters``: totals over the call's kernels, and each kernel's values."""
    per_kernel = [{"name": k.name, **{key: k.metrics.get(m) for m, key in METRICS.items()}}
                  for k in launches]

    def total(key: str) -> float | None:
        values = [k[key] for k in per_kernel]
        return None if any(v is None for v in values) else sum(values)

    out = {key: total(key) for key in METRICS.values() if key not in RATES}
    for side in ("read", "write"):
        sectors = out.get(f"l2_{side}_sectors")
        out[f"l2_{side}_bytes"] = None if sectors is None else sectors * L2_SECTOR_BYTES
    # the hit rate weighted by each kernel's L2 sectors from the SMs, the clock by its time
    out["l2_hit_rate_pct"] = _weighted_mean(
        [k["l2_hit_rate_pct"] for k in per_kernel],
        [(k["l2_read_sectors"] or 0) + (k["l2_write_sectors"] or 0) for k in per_kernel])
    out["sm_clock_hz"] = _weighted_mean([k["sm_clock_hz"] for k in per_kernel],
                                        [k["duration_s"] or 0 for k in per_kernel])
    out["kernels"] = per_kernel
    out["source"] = "ncu --cache-control all --clock-control none"
    return out


def _weighted_mean(values: list, weights: list) -> float | None:
    """The mean of per-kernel ``values`` weighted by ``weights``; a single kernel's own value;
    None where a value is missing or nothing weighs."""
    if len(values) == 1:
        return values[0]
    if None in values or sum(weights) == 0:
        return None
    return sum(v * w for v, w in zip(values, weights, strict=True)) / sum(weights)


def attach(records: list[dict], matched: dict, missing: dict, default_reason: str) -> int:
    """Fill ``counters`` of the triton records; returns how many got counters."""
    n = 0
    for rec in records:
        if rec["implementation"] != "triton":
            rec["counters"] = None
            rec["counters_reason"] = "peer: only the Triton kernels are profiled"
            continue
        rid = rec["record_id"]
        if rid in matched:
            rec["counters"], rec["counters_reason"] = counters(matched[rid]), None
            n += 1
        else:
            rec["counters"] = None
            rec["counters_reason"] = missing.get(rid, default_reason)
    return n
