"""Where the time goes inside a kernel: Nsight Compute's raw page, read per launch.

``validation/run_stalls.sh`` profiles a few configs with ncu's sections (``--csv --page
raw``: one row per launch, one column per metric, a units row under the header) and writes
a manifest of which config launched which kernels, as the matrix run does. This module
reads such a folder back and derives what the compute model needs from it:

- per launch: duration, how busy the tensor, exp (XU) and FMA pipes were (percent of their
  sustained peak while the SM was active), issue activity, resident warps, and the warp
  stall reasons that cost the most (ncu's stalls per issued instruction);
- the overlap bound. If the SM's four pipes, the tensor, exp (XU) and FMA pipes and the L1
  data pipe, are busy ``t``, ``x``, ``f`` and ``l`` percent of the time and they sum past
  100%, at least ``(sum - 100) / (sum - max)`` of the non-busiest pipes' time ran while the
  busiest one was busy too: time spent only by one pipe at a time adds up to at most 100%.
  Launches summing below 100% bound nothing (their pipes may take turns and still leave
  the SM idle some of the time). The data pipe's share is its LSU wavefronts' percent of
  peak (``l1tex__data_pipe_lsu_wavefronts``, one a clock: shared memory's reads and writes,
  shuffles, global loads and stores, and the operands wgmma reads from shared memory;
  of the elapsed cycles, where the math pipes' shares are of the SM's active ones, which
  only lowers the sum where SMs idle: a more cautious bound);
  where a profile lacks it, the shared-memory bytes (Nsight Compute's
  ``sm__sass_data_bytes_mem_shared`` of the same config and kernel in the matrix run's
  records, ``--records``) over the launch's duration at the preset's bytes per clock, at
  the clock the launch ran; where neither is known, the three math pipes alone. The
  preset's ``unit_overlap`` is the median of these bounds (``simulator.sim.compute``). Until
  2026-12-05 it was the median over the three math pipes (0.19: they alone rarely pass
  100%), with a second share (``smem_overlap``, 0.63) for the data pipe against them;
- the SM clock each launch ran at (``gpc__cycles_elapsed.avg.per_second``: the SMs are in
  the GPC clock domain), summarised for the kernels with matmuls and for the others: on
  the H200 the first ran near 1.79 GHz and the second near 1.97 (the preset's
  ``sm_clock_tensor_hz``, ``simulator.hardware.Hardware.at_tensor_clock``).

    python -m validation.stalls validation/records/raw/h200-stalls-2026-11-30/run1 ... \
        --records validation/records/h200-default-2026-11-30.jsonl
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from validation import stats
from validation.ncu import NcuParseError, kernel_base_name, parse_value

TENSOR = "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"
EXP = "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"
FMA = "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"
ISSUE = "sm__issue_active.avg.pct_of_peak_sustained_elapsed"
WARPS = "sm__warps_active.avg.per_cycle_active"
DURATION = "gpu__time_duration.sum"
LSU = "l1tex__data_pipe_lsu_wavefronts.avg.pct_of_peak_sustained_elapsed"
CLOCK = "gpc__cycles_elapsed.avg.per_second"  # the SMs' clock (GPC domain) during the launch
DEFAULT_PLAN = Path(__file__).parent / "plans" / "default.json"
STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"


@dataclass
class Launch:
    config: str  # the config id, or "setup" for a backward's set-up forward
    kernel: str
    duration_s: float
    pipes_pct: dict  # tensor, exp, fma: percent of peak while active
    issue_pct: float
    warps: float  # resident warps per active cycle
    stalls: dict = field(default_factory=dict)  # reason -> stalls per issued instruction
    lsu_pct: float | None = None  # LSU data pipe, percent of peak (elapsed); None: absent
    clock_hz: float | None = None  # SM clock during the launch; None: not profiled
    smem_pct: float | None = None  # shared-memory bytes, percent of peak (``attach_smem``)

    @property
    def pipes_sum_pct(self) -> float:
        return sum(self.pipes_pct.values())

    @property
    def cycles_per_instruction(self) -> float:
        """Cycles a warp takes per instruction it issues: the warps of a scheduler per
        cycle it issues, which is what the stall reasons (``selected`` included) sum to."""
        return sum(v for v in self.stalls.values() if v == v)  # NaN: a reason ncu left out

    @property
    def data_pipe_pct(self) -> float | None:
        """How busy the L1 data pipe was, percent: its LSU wavefronts where profiled, else
        the shared-memory bytes' share (``attach_smem``); None if neither is known."""
        return self.lsu_pct if self.lsu_pct is not None else self.smem_pct

    @property
    def all_pipes_pct(self) -> dict:
        """The math pipes' busy shares and the L1 data pipe's (``data`` where known)."""
        pipe = self.data_pipe_pct
        return dict(self.pipes_pct) if pipe is None else dict(self.pipes_pct, data=pipe)

    def overlap_bound(self) -> float | None:
        """The least share of the non-busiest pipes' time that overlapped the busiest
        (module docstring), over all four pipes (three where the data pipe's share is not
        known), or None where they sum to at most 100%."""
        pipes = self.all_pipes_pct.values()
        total, busiest = sum(pipes), max(pipes)
        if total <= 100.0 or total <= busiest:
            return None
        return (total - 100.0) / (total - busiest)


def read_folder(folder: str | Path) -> list[Launch]:
    """The launches of one ``run_stalls.sh`` folder (``stalls.csv`` and
    ``stalls_manifest.jsonl``), each labelled with its config by launch order."""
    folder = Path(folder)
    lines = [line for line in (folder / "stalls.csv").read_text().splitlines()
             if line.startswith('"')]  # ncu's own ==PROF== / ==WARNING== lines are not CSV
    rows = list(csv.reader(lines))
    if len(rows) < 2 or not rows[0] or rows[0][0] != "ID":
        raise NcuParseError(f"{folder / 'stalls.csv'}: no ncu raw table (header starting "
                            'with "ID", then a units row)')
    header, units, data = rows[0], rows[1], rows[2:]
    col = {name: i for i, name in enumerate(header)}
    missing = [m for m in (TENSOR, EXP, FMA, ISSUE, WARPS, DURATION, "Kernel Name")
               if m not in col]
    if missing:
        raise NcuParseError(f"{folder / 'stalls.csv'}: no column {', '.join(missing)}")
    labels = []
    for line in (folder / "stalls_manifest.jsonl").read_text().splitlines():
        entry = json.loads(line)
        labels += [(entry.get("config") or "setup", k) for k in entry.get("kernels", [])]
    if len(labels) != len(data):
        raise NcuParseError(f"{folder}: {len(data)} profiled launches but the manifest "
                            f"names {len(labels)}")

    def value(row, name) -> float:
        number, _ = parse_value(row[col[name]], units[col[name]])
        return float("nan") if number is None else number

    stall_names = [h for h in header if h.startswith(STALL_PREFIX) and h.endswith(STALL_SUFFIX)]
    launches = []
    for row, (config, kernel) in zip(data, labels, strict=True):
        name = kernel_base_name(row[col["Kernel Name"]])
        if name != kernel:
            raise NcuParseError(f"{folder}: launch {row[col['ID']]} is {name}, but the "
                                f"manifest expects {kernel} (config {config})")
        launches.append(Launch(
            config=config, kernel=kernel, duration_s=value(row, DURATION),
            pipes_pct={"tensor": value(row, TENSOR), "exp": value(row, EXP),
                       "fma": value(row, FMA)},
            issue_pct=value(row, ISSUE), warps=value(row, WARPS),
            stalls={s[len(STALL_PREFIX):-len(STALL_SUFFIX)]: value(row, s) for s in stall_names},
            lsu_pct=value(row, LSU) if LSU in col else None,
            clock_hz=_known(value(row, CLOCK)) if CLOCK in col else None,
        ))
    return launches


def _known(number: float) -> float | None:
    """``number``, or None for the NaN of a cell ncu left empty."""
    return None if number != number else number


def overlap_summary(launches: list[Launch]) -> dict:
    """The overlap bounds of the launches whose pipes sum past 100%: n, median, range."""
    return _bounds_summary(len(launches), [launch.overlap_bound() for launch in launches])


def _bounds_summary(launches: int, bounds: list[float | None]) -> dict:
    """n, median and range of the bounds that exist, out of ``launches`` launches."""
    return {"launches": launches, **stats.spread(bounds)}


def matmul_kernels(plan_path: str | Path = DEFAULT_PLAN) -> tuple[object, dict[str, dict]]:
    """The plan's GPU preset and, per config id of the plan, its kernels that have matmuls,
    each with whether they compile to wgmma on it (``compute.uses_wgmma``; False: mma.sync)."""
    from simulator.hardware import load_hardware
    from simulator.sim.compute import uses_wgmma
    from traces.problem import AttentionProblem
    from traces.schedules import build_schedule
    from traces.tiling import Tiling

    plan = json.loads(Path(plan_path).read_text())
    out = {}
    try:
        hw = load_hardware(plan["hardware"])
        for cfg in plan["configs"]:
            tiling = Tiling.from_dict(cfg["tiling"])
            schedule = build_schedule(AttentionProblem.from_dict(cfg["problem"]), tiling,
                                      cfg["schedule"])
            out[cfg["id"]] = {k.name: uses_wgmma(hw, k.mma_rows, tiling.num_warps)
                              for k in schedule.kernels if k.mma_rows}
    except (KeyError, TypeError) as exc:
        raise ValueError(f"plan {plan_path}: no {exc} (not a tilesim plan?)") from None
    return hw, out


def mma_sync_kernels(plan_path: str | Path = DEFAULT_PLAN) -> tuple[object, dict[str, set[str]]]:
    """The plan's GPU preset and, per config id of the plan, the kernels whose matmuls
    compile to mma.sync on it (``compute.uses_wgmma``)."""
    hw, matmuls = matmul_kernels(plan_path)
    return hw, mma_sync_of(matmuls)


def mma_sync_of(matmuls: dict[str, dict]) -> dict[str, set[str]]:
    """Per config, the kernels of ``matmuls`` (``matmul_kernels``) that compile to mma.sync."""
    return {config: {name for name, wgmma in kernels.items() if not wgmma}
            for config, kernels in matmuls.items()}


def clock_summary(launches: list[Launch], matmuls: dict[str, dict]) -> dict:
    """The SM clock the launches ran at (Nsight Compute's GPC cycles per second), split
    into the launches of kernels with matmuls (``matmuls``: per config, as
    ``matmul_kernels`` gives them) and the others: per group n, median, range (Hz)."""
    groups = {"matmul": [], "other": []}
    for launch in launches:
        if launch.clock_hz is None or launch.config not in matmuls:
            continue  # not profiled, or a backward's set-up forward (config "setup")
        has_matmul = launch.kernel in matmuls[launch.config]
        groups["matmul" if has_matmul else "other"].append(launch.clock_hz)
    return {name: _bounds_summary(len(values), values) for name, values in groups.items()}


def issue_latency_summary(launches: list[Launch], sync: dict[str, set[str]]) -> dict:
    """Cycles per issued instruction of the warps of the wgmma FA launches that were not
    throughput-bound (math pipes together below 100% busy): there a warp waits on its own
    instructions' latencies and its loads, not on pipes the others hold, so its cycles per
    instruction are what its dependencies cost. With the main loop's instructions
    (``kernels.resources.main_loop``) that bounds an iteration's critical path from below,
    which the model does not yet take (BENCHMARKS.md, "Register spills, and warps that wait
    on their own instructions")."""
    free = sorted(launch.cycles_per_instruction for launch in launches
                  if launch.kernel.startswith("fa2_") and launch.config in sync
                  and launch.kernel not in sync[launch.config]
                  and launch.kernel != "fa2_bwd_preprocess" and launch.pipes_sum_pct < 100.0)
    if not free:
        return {"n": 0, "median": None}
    return {"n": len(free), "median": statistics.median(free), "min": free[0], "max": free[-1]}


def attach_smem(launches: list[Launch], records: list[dict], hw) -> int:
    """Set each launch's ``smem_pct`` from the records' shared-memory bytes of its config
    and kernel (the latest record of each config) over its own duration, at ``hw``'s
    shared-memory bytes per clock on every SM, at the clock the launch ran (``hw``'s
    ``sm_clock_hz`` where the profile lacks it). Returns how many launches got one."""
    from validation.records import latest_per_config

    per_clock = hw.smem_bandwidth_bytes_per_clk_per_sm * hw.sm_count
    smem = {}
    for rec in latest_per_config(records)[0]:
        for k in (rec.get("counters") or {}).get("kernels") or []:
            if k.get("smem_bytes") is not None:
                smem[(rec["record_id"], k["name"])] = k["smem_bytes"]
    found = 0
    for launch in launches:
        nbytes = smem.get((launch.config, launch.kernel))
        if nbytes is not None and launch.duration_s > 0:
            clock = launch.clock_hz or hw.sm_clock_hz
            launch.smem_pct = 100.0 * nbytes / launch.duration_s / (per_clock * clock)
            found += 1
    return found


def _row(launch: Launch) -> str:
    top = sorted(launch.stalls.items(), key=lambda kv: -kv[1])[:3]
    p = launch.pipes_pct
    bound = launch.overlap_bound()
    return (f"{launch.config[:56]:56s} {launch.kernel:18s} {launch.duration_s * 1e6:9.1f} us  "
            f"tensor {p['tensor']:5.1f}  exp {p['exp']:5.1f}  fma {p['fma']:5.1f}  "
            f"sum {launch.pipes_sum_pct:5.1f}  "
            f"{'' if launch.lsu_pct is None else f'lsu {launch.lsu_pct:5.1f}  '}"
            f"{'' if launch.smem_pct is None else f'smem {launch.smem_pct:5.1f}  '}"
            f"all {sum(launch.all_pipes_pct.values()):5.1f}  "
            f"{'' if bound is None else f'bound {bound:.2f}  '}issue {launch.issue_pct:4.1f}  "
            f"warps {launch.warps:4.1f}  | " + ", ".join(f"{k} {v:.2f}" for k, v in top))


def _clock_line(summary: dict) -> str:
    parts = []
    for name, label in (("matmul", "kernels with matmuls"), ("other", "the others")):
        c = summary[name]
        if c["n"]:
            parts.append(f"{label} {c['median'] / 1e9:.3f} GHz (median of {c['n']}; "
                         f"{c['min'] / 1e9:.3f}-{c['max'] / 1e9:.3f})")
    return "SM clock: " + ("; ".join(parts) if parts else "not in the profiles")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validation.stalls",
                                     description="Pipe activity and stall reasons per launch "
                                     "from run_stalls.sh folders; the unit-overlap bound "
                                     "over the SM's four pipes; the SM clock.")
    parser.add_argument("folders", nargs="+")
    parser.add_argument("--plan", default=str(DEFAULT_PLAN),
                        help="the plan whose configs were profiled (which kernels are mma.sync)")
    parser.add_argument("--records", default=None,
                        help="the matrix run's records (JSON Lines) with the same configs' "
                        "shared-memory bytes: listed per launch, and the data pipe's share "
                        "where a profile lacks its LSU wavefronts")
    args = parser.parse_args(argv)
    launches = []
    try:
        for folder in args.folders:
            launches += read_folder(folder)
        hw, matmuls = matmul_kernels(args.plan)
        sync = mma_sync_of(matmuls)
        if args.records:
            from validation.records import read_records

            attach_smem(launches, read_records(args.records)[0], hw)
    except (OSError, ValueError, NcuParseError) as exc:  # JSON errors are ValueErrors
        print(f"tilesim: stalls: {exc}", file=sys.stderr)
        return 2
    for launch in launches:
        print(_row(launch))
    s = overlap_summary(launches)
    if s["n"]:
        print(f"unit overlap: {s['n']} of {s['launches']} launches have their pipes (the L1 "
              f"data pipe's where known) summing past 100%; their overlap bounds: median "
              f"{s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f})")
    else:
        print(f"unit overlap: none of {s['launches']} launches has its pipes summing past "
              "100%")
    print(_clock_line(clock_summary(launches, matmuls)))
    c = issue_latency_summary(launches, sync)
    if c["n"]:
        print(f"issue latency: {c['n']} wgmma FA launches with the math pipes below 100% "
              f"together; cycles per issued instruction of a warp: median {c['median']:.2f} "
              f"({c['min']:.2f}-{c['max']:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
