"""GPU hardware descriptions, loaded from TOML presets (the only source of hardware numbers).

A preset is ``simulator/presets/<name>.toml``; a user's own GPU is any TOML file with the
same keys, passed as a path. Every key carries its unit in its name; every number in a
shipped preset carries its source in a comment next to it.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, fields, replace
from pathlib import Path

from traces.problem import ProblemError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PRESET_DIR = Path(__file__).parent / "presets"
TENSOR_DTYPES = ("fp16", "bf16", "fp32", "fp8")
# Overheads may be none; an SM's units may not overlap at all (unit_overlap 0).
ZERO_ALLOWED = ("kernel_launch_overhead_s", "iteration_overhead_s", "unit_overlap")


# Fields a preset may leave out (the dataclass's default, None, says what that means).
OPTIONAL = ("sm_clock_tensor_hz", "warp_cycles_per_instruction", "l1_smem_per_sm_bytes")
L2_SECTOR_BYTES = 32  # the L2 model's unit of capacity and traffic (simulator/sim/l2.py)
# Fields a preset records for readers that no part of the model reads: a --set on them
# would change nothing, so it is refused with the reason.
NOT_MODELLED = {
    "l2_sector_bytes": "the L2 model counts 32-byte sectors; other sizes are not modelled",
}
# Keys earlier versions of the model read, and what took their place: a file that still
# gives one is refused with the reason rather than read as if it meant the same.
RETIRED = {
    "smem_overlap": "retired on 2026-12-05: unit_overlap now covers shared memory's pipe "
                    "with the math pipes (simulator/sim/compute.py)",
}


class HardwareError(ProblemError):
    """A hardware name or file that cannot be used."""


@dataclass(frozen=True)
class Hardware:
    """One GPU as the model sees it. SI units: bytes, seconds, hertz, operations per second.

    ``*_efficiency`` are the achievable fractions of a datasheet peak (from microbenchmark
    papers or our own measurement records); the model multiplies peaks by them.
    """

    name: str
    display_name: str
    # Streaming multiprocessors
    sm_count: int
    compute_capability: int  # 90 for sm_90 (Hopper): wgmma exists only there
    sm_subpartitions: int  # processing blocks per SM, each with its own tensor core
    sm_clock_hz: float
    smem_per_sm_bytes: int
    smem_per_cta_max_bytes: int
    smem_bandwidth_bytes_per_clk_per_sm: float
    registers_per_sm: int
    max_registers_per_thread: int
    max_threads_per_sm: int
    max_ctas_per_sm: int
    # L2 cache
    l2_bytes: int
    l2_sector_bytes: int
    l2_line_bytes: int
    l2_bandwidth_bytes_per_s: float
    l2_latency_s: float
    l2_efficiency: float
    # HBM
    hbm_bytes: int
    hbm_bandwidth_bytes_per_s: float
    hbm_latency_s: float
    hbm_efficiency: float
    # Compute
    tensor_flops_per_s: dict  # dtype -> dense tensor-core FLOP/s (fp32 means TF32)
    tensor_efficiency: float  # of the peak, for the asynchronous wgmma on sm_90
    tensor_sync_efficiency: float  # of the peak, for synchronous mma (all before sm_90)
    fp32_flops_per_s: float
    exp_ops_per_s: float
    unit_overlap: float  # share of an SM's non-busiest unit time that overlaps the busiest
    # Kernels
    kernel_launch_overhead_s: float
    iteration_overhead_s: float  # fixed latency of each loop iteration of a CTA
    # The SM clock while a kernel's warps issue tensor-core instructions, where the GPU
    # lowers it then (``at_tensor_clock``); None: the SMs keep ``sm_clock_hz``.
    sm_clock_tensor_hz: float | None = None
    # The fewest cycles a warp takes per instruction it issues, measured on this GPU
    # (``validation.pace``): no warp goes through its instructions faster, whatever its
    # units could do (``simulator.sim.program``). None: not measured, no such floor.
    warp_cycles_per_instruction: float | None = None
    # The SM's unified data cache, L1 and shared memory together: what shared memory leaves
    # caches the spills a kernel reloads (``simulator.spills``). None: not known, every
    # reload is taken to reach L2.
    l1_smem_per_sm_bytes: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in OPTIONAL and value is None:
                continue
            if f.name in ("name", "display_name"):
                if not isinstance(value, str) or not value:
                    raise HardwareError(f'hardware "{f.name}" must be a non-empty string.')
            elif f.name == "tensor_flops_per_s":
                if not isinstance(value, dict):
                    raise HardwareError(
                        f'hardware "{self.name}": tensor_flops_per_s must be a table of rates.'
                    )
                missing = [d for d in TENSOR_DTYPES if d not in value]
                if missing:
                    raise HardwareError(
                        f'hardware "{self.name}": tensor_flops_per_s lacks {", ".join(missing)} '
                        f"(every dtype of {', '.join(TENSOR_DTYPES)} needs a rate; a GPU "
                        "without FP8 tensor cores gives its FP16 rate, as the A100 presets do)."
                    )
                for dtype, rate in value.items():
                    if not _finite(rate) or rate <= 0:
                        raise HardwareError(
                            f'hardware "{self.name}": tensor_flops_per_s.{dtype} must be a '
                            "finite number > 0."
                        )
            elif f.name in ZERO_ALLOWED:
                if not _finite(value) or value < 0:
                    raise HardwareError(
                        f'hardware "{self.name}": "{f.name}" must be a finite number >= 0.')
            elif not _finite(value) or value <= 0:
                raise HardwareError(
                    f'hardware "{self.name}": "{f.name}" must be a finite number > 0.')
            elif f.type == "int" and not isinstance(value, int):
                raise HardwareError(f'hardware "{self.name}": "{f.name}" must be an integer.')
        for name in ("l2_efficiency", "hbm_efficiency", "tensor_efficiency",
                     "tensor_sync_efficiency", "unit_overlap"):
            if getattr(self, name) > 1:
                low = "[0" if name in ZERO_ALLOWED else "(0"
                raise HardwareError(f'hardware "{self.name}": "{name}" must be in {low}, 1].')
        if self.l2_sector_bytes != L2_SECTOR_BYTES:
            raise HardwareError(
                f'hardware "{self.name}": l2_sector_bytes {self.l2_sector_bytes} is not '
                f"modelled; the L2 model counts {L2_SECTOR_BYTES}-byte sectors, as every "
                "NVIDIA GPU since Maxwell has.")
        if self.l2_line_bytes % L2_SECTOR_BYTES:
            raise HardwareError(
                f'hardware "{self.name}": l2_line_bytes {self.l2_line_bytes} is not a whole '
                f"number of {L2_SECTOR_BYTES}-byte sectors.")
        if self.hbm_latency_s < self.l2_latency_s:
            raise HardwareError(
                f'hardware "{self.name}": hbm_latency_s is below l2_latency_s, but a miss '
                "passes through L2 on its way to HBM.")
        if self.smem_per_cta_max_bytes > self.smem_per_sm_bytes:
            raise HardwareError(
                f'hardware "{self.name}": smem_per_cta_max_bytes exceeds smem_per_sm_bytes.'
            )
        if self.l1_smem_per_sm_bytes is not None and \
                self.l1_smem_per_sm_bytes < self.smem_per_sm_bytes:
            raise HardwareError(
                f'hardware "{self.name}": l1_smem_per_sm_bytes is below smem_per_sm_bytes, '
                "but shared memory is carved out of the unified data cache.")

    # Derived rates the model uses.
    @property
    def hbm_effective_bytes_per_s(self) -> float:
        return self.hbm_bandwidth_bytes_per_s * self.hbm_efficiency

    @property
    def l2_effective_bytes_per_s(self) -> float:
        return self.l2_bandwidth_bytes_per_s * self.l2_efficiency

    def tensor_rate(self, dtype: str, wgmma: bool = True) -> float:
        """Achievable tensor-core FLOP/s for inputs of ``dtype``.

        ``wgmma``: the matmuls are Hopper's asynchronous wgmma, else synchronous mma
        (the only kind before sm_90, where both efficiencies are the same).
        """
        efficiency = self.tensor_efficiency if wgmma else self.tensor_sync_efficiency
        return self.tensor_flops_per_s[dtype] * efficiency

    def smem_operand_limit(self, dtype: str) -> float:
        """Shared-memory bytes per tensor-core FLOP an SM can feed at the datasheet peak.

        Matmuls that read more operand bytes per FLOP from shared memory than this (Hopper's
        wgmma reads B, and A unless it is in registers, from there) wait on shared memory,
        not on the tensor cores: ``smem_bandwidth_bytes_per_clk_per_sm`` at ``sm_clock_hz``
        over one SM's share of ``tensor_flops_per_s``. H100 SXM5, bf16: 128 B/clk x 1.83 GHz
        / (989 TFLOP/s / 132) = 0.031 B/FLOP. The simulator charges these reads for mma.sync
        matmuls (``simulator.sim.compute``), not for wgmma (docs/model.md: what the model leaves
        out); ``kernels resources`` and ``reconcile`` compare kernels against this.
        """
        smem_per_s = self.smem_bandwidth_bytes_per_clk_per_sm * self.sm_clock_hz
        return smem_per_s / (self.tensor_flops_per_s[dtype] / self.sm_count)

    def at_tensor_clock(self) -> Hardware:
        """This GPU as a kernel with matmuls sees it: its SMs at ``sm_clock_tensor_hz``
        (itself where that is not given or is the same clock). The rates counted per clock
        scale with it: the exp unit's, the FP32 ALUs' and shared memory's (bytes per clock
        at ``sm_clock_hz``). The tensor-core rate does not: its ``tensor_efficiency`` is a
        matmul's measured throughput over the datasheet peak, at the clock that matmul ran.
        Nor do L2 and HBM, which run in clock domains of their own."""
        clock = self.sm_clock_tensor_hz
        if clock is None or clock == self.sm_clock_hz:
            return self
        ratio = clock / self.sm_clock_hz
        return replace(self, sm_clock_hz=clock, exp_ops_per_s=self.exp_ops_per_s * ratio,
                       fp32_flops_per_s=self.fp32_flops_per_s * ratio)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _finite(value: object) -> bool:
    """A real number (not a bool), neither infinite nor NaN (TOML allows both)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def with_overrides(hw: Hardware, overrides: list[str]) -> Hardware:
    """``hw`` with fields replaced: ``["hbm_bandwidth_bytes_per_s=8e12",
    "tensor_flops_per_s.bf16=2e15"]`` (a what-if without writing a TOML file).

    Values are checked as a preset's are; the result's name says what changed, so that
    every output it reaches (JSON ``hardware`` fields included) shows it is not the preset.
    """
    if not overrides:
        return hw
    values = hw.to_dict()
    types = {f.name: f.type for f in fields(Hardware)}
    for item in overrides:
        key, sep, text = item.partition("=")
        key, text = key.strip(), text.strip()
        field, _, dtype = key.partition(".")
        if field in NOT_MODELLED:
            raise HardwareError(f"--set {key}: {NOT_MODELLED[field]}")
        if field in RETIRED:
            raise HardwareError(f"--set {key}: {field} was {RETIRED[field]}")
        if not sep or not text or field not in types or field in ("name", "display_name") \
                or (field == "tensor_flops_per_s") != bool(dtype):
            raise HardwareError(f'--set takes FIELD=VALUE with a field of `tilesim hardware '
                                f'show` (tensor rates as tensor_flops_per_s.bf16=...), got '
                                f'"{item}"')
        try:
            number = float(text)
        except ValueError:
            raise HardwareError(f'--set {key}: "{text}" is not a number') from None
        if types[field] == "int":
            if not number.is_integer():
                raise HardwareError(f'--set {key}: "{text}" must be an integer')
            number = int(number)
        if dtype:
            if dtype not in values[field]:
                raise HardwareError(f'--set {key}: no dtype "{dtype}"; known: '
                                    f'{", ".join(values[field])}')
            values[field] = dict(values[field], **{dtype: number})
        else:
            values[field] = number
    changed = [o.replace(" ", "") for o in overrides]
    values["name"] = "+".join([hw.name, *changed])  # no brackets: rich reads them as markup
    values["display_name"] = f"{hw.display_name} with {', '.join(changed)}"
    return Hardware(**values)


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def _flatten(table: dict) -> dict:
    """TOML sections ([sm], [l2], ...) group keys for readers; the dataclass is flat."""
    flat = {}
    for key, value in table.items():
        if isinstance(value, dict) and key != "tensor_flops_per_s":
            flat.update(_flatten(value))
        else:
            flat[key] = value
    return flat


def load_hardware(name_or_path: str | Path) -> Hardware:
    """Load a preset by name (``h100-sxm5``) or a user's TOML file by path."""
    text_path = Path(name_or_path)
    if text_path.suffix == ".toml" or text_path.exists():
        path = text_path
        if not path.exists():
            raise HardwareError(f"hardware file not found: {path}")
        if path.is_dir():
            raise HardwareError(f"hardware file {path} is a directory; give the .toml file")
    else:
        path = PRESET_DIR / f"{name_or_path}.toml"
        if not path.is_file():
            raise HardwareError(
                f'unknown hardware "{name_or_path}"; known: {", ".join(preset_names())} '
                "(or give a path to a .toml file)"
            )
    try:
        table = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise HardwareError(f"hardware file {path} is not valid TOML: {exc}") from None
    flat = _flatten(table)
    flat.setdefault("name", path.stem)
    flat.setdefault("display_name", flat["name"])
    retired = sorted(set(flat) & set(RETIRED))
    if retired:
        raise HardwareError(f"hardware file {path}: {retired[0]} was {RETIRED[retired[0]]}; "
                            "delete the key")
    known = {f.name for f in fields(Hardware)}
    unknown = sorted(set(flat) - known)
    if unknown:
        raise HardwareError(f"hardware file {path}: unknown keys {', '.join(unknown)}")
    missing = sorted(known - set(flat) - set(OPTIONAL))
    if missing:
        raise HardwareError(f"hardware file {path}: missing keys {', '.join(missing)}")
    return Hardware(**flat)
