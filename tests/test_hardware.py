"""Hardware presets: they load, every number has a source, derived numbers agree with their
formulas, and bad hardware input ends in one line on stderr with exit code 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.hardware import (
    OPTIONAL,
    PRESET_DIR,
    TENSOR_DTYPES,
    Hardware,
    HardwareError,
    load_hardware,
    preset_names,
    with_overrides,
)

REPO = Path(__file__).resolve().parents[1]
PRESETS = ("a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm5", "h200-sxm", "rtx-4090")
# `key = number` (TOML int or float, underscores allowed), then the rest of the line.
NUMBER_LINE = re.compile(r"^\s*([A-Za-z0-9_]+)\s*=\s*([-+]?[0-9][0-9_.eE+-]*)\s*(.*)$")
NUMERIC_FIELDS = [f.name for f in fields(Hardware) if f.name not in ("name", "display_name")]
# Dense bf16 tensor FLOPs per SM per clock implied by the datasheet peak at the clock the
# datasheet quotes it at: the preset's, except on the Hopper presets, whose clock is the one
# measured on our H200 (1980 MHz) while NVIDIA's 989 TFLOPS are at 1830 MHz (FA3 §3.1).
BF16_FLOPS_PER_CLK_PER_SM = {
    "a100-sxm4-40gb": 2048, "a100-sxm4-80gb": 2048, "h100-sxm5": 4096, "h200-sxm": 4096,
    "rtx-4090": 512,
}
DATASHEET_CLOCK_HZ = {"h100-sxm5": 1.83e9, "h200-sxm": 1.83e9}


@pytest.fixture(params=PRESETS)
def preset(request) -> str:
    return request.param


def run_cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_all_presets_ship():
    assert set(PRESETS) <= set(preset_names())


def test_preset_loads(preset):
    hw = load_hardware(preset)
    assert hw.name == preset
    assert set(hw.tensor_flops_per_s) == set(TENSOR_DTYPES)


def test_every_number_has_a_source_comment(preset):
    text = (PRESET_DIR / f"{preset}.toml").read_text()
    numeric = [m for line in text.splitlines() if (m := NUMBER_LINE.match(line))]
    # One number per line: the dataclass's numeric fields plus one line per tensor dtype,
    # less the optional fields the preset leaves out.
    absent = [name for name in OPTIONAL if getattr(load_hardware(preset), name) is None]
    assert len(numeric) == len(NUMERIC_FIELDS) - 1 + len(TENSOR_DTYPES) - len(absent)
    for m in numeric:
        key, value, rest = m.groups()
        assert rest.startswith("#"), f"{preset}: {key} = {value} has no source comment"
        source = rest.lstrip("#").strip()
        assert re.search(r"[A-Za-z]{2,}", source), f"{preset}: {key} source comment is empty"


def test_exp_rate_is_16_per_sm_per_clock(preset):
    hw = load_hardware(preset)
    expected = 16 * hw.sm_count * hw.sm_clock_hz
    assert hw.exp_ops_per_s == pytest.approx(expected, rel=1e-9)


def test_tensor_peak_matches_clock_and_sm_count(preset):
    hw = load_hardware(preset)
    clock = DATASHEET_CLOCK_HZ.get(preset, hw.sm_clock_hz)
    per_clk_per_sm = hw.tensor_flops_per_s["bf16"] / (hw.sm_count * clock)
    assert per_clk_per_sm == pytest.approx(BF16_FLOPS_PER_CLK_PER_SM[preset], rel=5e-3)


def test_rates_are_ordered(preset):
    hw = load_hardware(preset)
    t = hw.tensor_flops_per_s
    assert t["fp16"] == t["bf16"]
    assert t["fp8"] >= t["bf16"] > t["fp32"] >= hw.fp32_flops_per_s > hw.exp_ops_per_s
    assert hw.smem_per_cta_max_bytes <= hw.smem_per_sm_bytes
    assert hw.l2_bandwidth_bytes_per_s > hw.hbm_bandwidth_bytes_per_s
    assert hw.l2_latency_s < hw.hbm_latency_s
    assert hw.l2_line_bytes % hw.l2_sector_bytes == 0
    for name in ("l2_efficiency", "hbm_efficiency", "tensor_efficiency"):
        assert 0.5 <= getattr(hw, name) <= 1.0


def test_hopper_derived_numbers():
    for preset in ("h100-sxm5", "h200-sxm"):
        hw = load_hardware(preset)
        # arXiv:2501.12084v2: L2 4472 B/clk; ~300-cycle L2 hits; ~700-cycle DRAM accesses.
        assert hw.l2_bandwidth_bytes_per_s == pytest.approx(4472 * hw.sm_clock_hz, rel=1e-9)
        assert hw.l2_latency_s * hw.sm_clock_hz == pytest.approx(300, rel=1e-3)
        assert hw.hbm_latency_s * hw.sm_clock_hz == pytest.approx(700, rel=1e-3)


def test_h200_efficiencies_are_the_most_its_records_reached():
    """hbm_efficiency and l2_efficiency of the H200 preset: the highest DRAM and L2 rates
    (ncu bytes over ncu duration) any kernel of the committed H200 records reached."""
    from pathlib import Path

    from validation.records import read_records

    records, errors = read_records(
        Path(__file__).parents[1] / "validation/records/h200-default-2026-11-30.jsonl")
    assert errors == []
    kernels = [k for rec in records for k in (rec["counters"] or {}).get("kernels", [])]
    assert len(kernels) == 695
    dram = max((k["dram_read_bytes"] + k["dram_write_bytes"]) / k["duration_s"]
               for k in kernels)
    l2 = max((k["l2_read_sectors"] + k["l2_write_sectors"]) * 32 / k["duration_s"]
             for k in kernels)
    h200 = load_hardware("h200-sxm")
    assert h200.hbm_efficiency == pytest.approx(dram / h200.hbm_bandwidth_bytes_per_s, abs=1e-3)
    assert h200.l2_efficiency == pytest.approx(l2 / h200.l2_bandwidth_bytes_per_s, abs=1e-3)


def test_h200_tensor_clock_is_the_median_its_profiles_measured():
    """sm_clock_tensor_hz of the H200 preset: the median SM clock (Nsight Compute's GPC
    cycles per second) of the profiled launches of our kernels with matmuls; the kernels
    without ran near the preset's sm_clock_hz, as that field assumes."""
    from validation import stalls

    root = REPO / "validation/records/raw/h200-stalls-2026-11-30"
    launches = [x for folder in sorted(root.iterdir()) for x in stalls.read_folder(folder)]
    _, matmuls = stalls.matmul_kernels()
    summary = stalls.clock_summary(launches, matmuls)
    assert summary["matmul"]["n"] == 96 and summary["other"]["n"] == 43
    h200 = load_hardware("h200-sxm")
    assert h200.sm_clock_tensor_hz == pytest.approx(summary["matmul"]["median"], rel=1e-3)
    assert summary["other"]["median"] == pytest.approx(h200.sm_clock_hz, rel=0.01)


def test_h200_warp_pace_is_the_fastest_loop_of_its_records():
    """warp_cycles_per_instruction of the H200 preset: the cycles per instruction of the
    fastest loop in the H200 records (``validation.pace``), with the loop facts of the
    device compile (Triton 3.6) that tilesim's table of compiles gives them: FA2's forward
    at d = 128, N = 16k, 128 x 32, 3 stages, 4 warps, whose loop compiles to 446
    instructions a warp, with 435 before it and 1,014 after (since 2026-12-05 the pace
    counts them too); 2 CTAs per SM at 255 registers."""
    from validation import pace
    from validation.fill_facts import fill_loop_facts
    from validation.records import read_records

    records, _ = read_records(REPO / "validation/records/h200-default-2026-11-30.jsonl")
    records, _ = fill_loop_facts(records, compile_here=False)
    h200 = load_hardware("h200-sxm")
    fastest = pace.loop_paces(records, h200)[0]
    assert fastest["record_id"] == "fa2-fwd-b1-h16-q16384-k16384-d128-bf16-m128-n32-s3-w4"
    (rec,) = [r for r in records if r["record_id"] == fastest["record_id"]]
    (fact,) = rec["kernel_facts"]
    assert fact["registers"] == 255 and fastest["resident"] == 2 * 132
    assert (fact["loop_instructions"], fact["prologue_instructions"],
            fact["epilogue_instructions"]) == (446, 435, 1014)
    assert h200.warp_cycles_per_instruction == pytest.approx(
        fastest["cycles_per_instruction"], abs=0.005)
    assert load_hardware("h100-sxm5").warp_cycles_per_instruction == (
        h200.warp_cycles_per_instruction)  # the same SM and compiler
    assert load_hardware("a100-sxm4-80gb").warp_cycles_per_instruction is None  # unmeasured


def test_tensor_clock_scales_the_rates_counted_per_clock_and_nothing_else():
    h200 = load_hardware("h200-sxm")
    slow = h200.at_tensor_clock()
    ratio = h200.sm_clock_tensor_hz / h200.sm_clock_hz
    assert slow.sm_clock_hz == h200.sm_clock_tensor_hz
    assert slow.exp_ops_per_s == pytest.approx(16 * 132 * h200.sm_clock_tensor_hz)
    assert slow.fp32_flops_per_s == pytest.approx(h200.fp32_flops_per_s * ratio)
    changed = {k for k, v in h200.to_dict().items() if slow.to_dict()[k] != v}
    assert changed == {"sm_clock_hz", "exp_ops_per_s", "fp32_flops_per_s"}
    assert slow.at_tensor_clock() is slow  # already there
    a100 = load_hardware("a100-sxm4-80gb")  # gives no tensor clock: the SMs keep theirs
    assert a100.sm_clock_tensor_hz is None and a100.at_tensor_clock() is a100


def test_same_chip_differs_only_where_it_should():
    h100, h200 = load_hardware("h100-sxm5"), load_hardware("h200-sxm")
    assert h200.hbm_bandwidth_bytes_per_s > h100.hbm_bandwidth_bytes_per_s
    assert h200.hbm_bytes > h100.hbm_bytes
    # the same GH100 chip: the H100 takes what the H200 records measured of the chip (its
    # clocks, L2 rate, launch cost, ...) and differs in its memory and the L2 it enables
    differing = {k for k, v in h100.to_dict().items() if h200.to_dict()[k] != v}
    assert differing == {"name", "display_name", "hbm_bytes", "hbm_bandwidth_bytes_per_s",
                         "hbm_efficiency", "l2_bytes"}
    a40, a80 = load_hardware("a100-sxm4-40gb"), load_hardware("a100-sxm4-80gb")
    assert a80.hbm_bandwidth_bytes_per_s > a40.hbm_bandwidth_bytes_per_s
    differing = {k for k, v in a40.to_dict().items() if a80.to_dict()[k] != v}
    assert differing == {"name", "display_name", "hbm_bytes", "hbm_bandwidth_bytes_per_s"}


def _custom(tmp_path: Path, edit=lambda text: text, name: str = "my-gpu.toml") -> Path:
    text = (PRESET_DIR / "h100-sxm5.toml").read_text()
    text = text.replace('name = "h100-sxm5"', 'name = "my-gpu"', 1)
    path = tmp_path / name
    path.write_text(edit(text))
    return path


def test_custom_toml_path(tmp_path, capsys):
    path = _custom(tmp_path)
    hw = load_hardware(path)
    assert hw.name == "my-gpu"
    assert hw.sm_count == load_hardware("h100-sxm5").sm_count
    rc, out, err = run_cli(capsys, ["hardware", "show", str(path), "--json"])
    assert rc == 0 and err == ""
    assert json.loads(out)["name"] == "my-gpu"


def _drop_line(key: str):
    return lambda text: re.sub(rf"(?m)^{key} = .*\n", "", text)


def _set_value(key: str, value: str):
    return lambda text: re.sub(rf"(?m)^{key} = [^#]*", f"{key} = {value}  ", text)


BAD_FILES = {
    "malformed": lambda text: text + "\nsm_count = = 3\n",
    "missing key": _drop_line("l2_bytes"),
    "unknown key": lambda text: text.replace("[l2]\n", "[l2]\nl3_bytes = 1  # made up\n"),
    "negative": _set_value("sm_count", "-1"),
    "efficiency above 1": _set_value("hbm_efficiency", "1.5"),
    "missing dtype": _drop_line("fp8"),
    "tensor rates not a table": lambda text: re.sub(
        r"(?s)\[compute\.tensor_flops_per_s\].*?\n\n", "tensor_flops_per_s = 1.0e15\n\n", text),
    "fractional count": _set_value("sm_count", "132.5"),
    "boolean rate": _set_value("fp8", "true"),
    # TOML has inf and nan; a simulation on them would never end.
    "infinite bandwidth": _set_value("hbm_bandwidth_bytes_per_s", "inf"),
    "nan latency": _set_value("l2_latency_s", "nan"),
    "infinite rate": _set_value("bf16", "inf"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_toml_is_one_line_exit_2(case, tmp_path, capsys):
    path = _custom(tmp_path, BAD_FILES[case])
    rc, out, err = run_cli(capsys, ["hardware", "show", str(path)])
    assert rc == 2
    assert out == ""
    assert err.startswith("tilesim: error: ")
    assert err.count("\n") == 1 and err.endswith("\n")
    assert "Traceback" not in err


@pytest.mark.parametrize("argv", [
    ["hardware", "show", "nope"],
    ["hardware", "show", "no/such/file.toml"],
])
def test_unknown_hardware_is_one_line_exit_2(argv, capsys):
    rc, out, err = run_cli(capsys, argv)
    assert rc == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "nope" in err or "no/such/file.toml" in err


def test_unknown_name_lists_known_presets(capsys):
    _, _, err = run_cli(capsys, ["hardware", "show", "nope"])
    assert all(name in err for name in PRESETS)


def test_module_entry_point_unknown_hardware():
    proc = subprocess.run(
        [sys.executable, "-m", "simulator", "hardware", "show", "nope"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert 'unknown hardware "nope"' in proc.stderr


@pytest.mark.parametrize("argv", [["hardware"], ["hardware", "list"]])
def test_list_mentions_all_presets(argv, capsys):
    rc, out, err = run_cli(capsys, argv)
    assert rc == 0 and err == ""
    for name in PRESETS:
        assert name in out
    assert "989" in out  # H100 bf16 dense TFLOPS


@pytest.mark.parametrize("argv", [["hardware", "list", "--json"], ["hardware", "--json"]])
def test_list_json_has_every_preset_as_loaded(argv, capsys):
    rc, out, _ = run_cli(capsys, argv)
    assert rc == 0
    presets = json.loads(out)["presets"]
    assert [p["name"] for p in presets] == sorted(PRESETS)
    assert presets == [load_hardware(name).to_dict() for name in sorted(PRESETS)]


def test_show_json_round_trips(preset, capsys):
    rc, out, _ = run_cli(capsys, ["hardware", "show", preset, "--json"])
    assert rc == 0
    assert json.loads(out) == load_hardware(preset).to_dict()


def test_show_human_readable(capsys):
    rc, out, _ = run_cli(capsys, ["hardware", "show", "h100-sxm5"])
    assert rc == 0
    for text in ("NVIDIA H100", "228 KiB", "50 MiB", "3.35 TB/s", "1.98 GHz", "989 TFLOP/s",
                 "90 %", "151.5 ns", "1 µs", "1.789 GHz"):
        assert text in out, text


def test_smem_operand_limit_by_hand():
    """What shared memory can feed the tensor cores per FLOP at the datasheet peak:
    H100 SXM5, bf16: 128 B/clk x 1.98 GHz over 989 TFLOP/s / 132 SMs; at the clock the
    datasheet quotes that peak at, 1.83 GHz, 128 B over 4096 FLOP a clock."""
    h100 = load_hardware("h100-sxm5")
    assert h100.smem_operand_limit("bf16") == pytest.approx(128 * 1.98e9 * 132 / 989e12)
    datasheet = with_overrides(h100, ["sm_clock_hz=1.83e9"])
    assert datasheet.smem_operand_limit("bf16") == pytest.approx(128 / 4096, rel=2e-3)
    # fp8 runs at twice the rate (1979 TFLOP/s): half the bytes per FLOP.
    assert h100.smem_operand_limit("fp8") == pytest.approx(128 * 1.98e9 * 132 / 1979e12)


def test_what_if_overrides_replace_fields_and_rename():
    h200 = load_hardware("h200-sxm")
    hw = with_overrides(h200, ["hbm_bandwidth_bytes_per_s=9.6e12", "sm_count = 144",
                               "tensor_flops_per_s.bf16=2e15"])
    assert hw.hbm_bandwidth_bytes_per_s == 9.6e12 and hw.sm_count == 144
    assert isinstance(hw.sm_count, int)
    assert hw.tensor_flops_per_s == dict(h200.tensor_flops_per_s, bf16=2e15)
    assert h200.tensor_flops_per_s["bf16"] == 989e12  # the preset is left alone
    assert hw.name == ("h200-sxm+hbm_bandwidth_bytes_per_s=9.6e12+sm_count=144"
                       "+tensor_flops_per_s.bf16=2e15")
    for field in fields(Hardware):  # nothing else moved
        if field.name not in ("name", "display_name", "hbm_bandwidth_bytes_per_s", "sm_count",
                              "tensor_flops_per_s"):
            assert getattr(hw, field.name) == getattr(h200, field.name), field.name
    assert with_overrides(h200, []) is h200


@pytest.mark.parametrize("override, match", [
    ("nonsense=1", "FIELD=VALUE"), ("sm_count", "FIELD=VALUE"), ("name=x", "FIELD=VALUE"),
    ("tensor_flops_per_s=1e15", "FIELD=VALUE"), ("sm_count.bf16=1", "FIELD=VALUE"),
    ("sm_count=1.5", "integer"), ("hbm_latency_s=fast", "not a number"),
    ("tensor_flops_per_s.int4=1e15", "no dtype"), ("hbm_efficiency=1.5", r"\(0, 1\]"),
    ("l2_bytes=-1", "> 0"), ("hbm_bandwidth_bytes_per_s=inf", "finite"),
    ("hbm_latency_s=nan", "finite"), ("sm_clock_hz=1e400", "finite"),
    ("tensor_flops_per_s.bf16=inf", "finite"),
    # What the model does not read is refused, not silently ignored.
    ("l2_line_bytes=100", "whole number of 32-byte sectors"),
    ("l2_sector_bytes=64", "32-byte sectors"),
    ("hbm_latency_s=1e-7", "below l2_latency_s"),
])
def test_what_if_overrides_are_checked(override, match):
    with pytest.raises(HardwareError, match=match):
        with_overrides(load_hardware("h200-sxm"), [override])


def test_set_reaches_the_simulation_and_its_json(capsys):
    argv = ["simulate", "--hardware", "h200-sxm", "--heads", "4", "--seq", "2048", "--json"]
    assert main(argv) == 0
    base = json.loads(capsys.readouterr().out)
    assert main([*argv, "--set", "tensor_flops_per_s.bf16=494.5e12"]) == 0
    slow = json.loads(capsys.readouterr().out)
    assert slow["hardware"] == "h200-sxm+tensor_flops_per_s.bf16=494.5e12"
    assert slow["bytes"] == base["bytes"]  # the same traffic
    assert slow["time_s"] > base["time_s"]  # half the tensor rate: tensor-bound, slower
    assert main(["count", "--set", "sm_count=x"]) == 2
    assert "not a number" in capsys.readouterr().err


def test_register_limit_caps_the_estimate():
    """``max_registers_per_thread`` is the cap of the register estimate (spills beyond)."""
    from simulator.occupancy import SMEM_RESERVED_PER_CTA_BYTES, residency
    from traces.problem import AttentionProblem
    from traces.schedules import build_schedule
    from traces.tiling import Tiling

    problem = AttentionProblem(batch=1, heads=1, seq_q=512, head_dim=128)
    tiling = Tiling(block_m=128, block_n=128, num_stages=2, num_warps=4)
    kernel = build_schedule(problem, tiling, "fa2").kernels[0]
    h100 = load_hardware("h100-sxm5")
    full = residency(kernel, tiling, 128, h100)
    assert full.registers_per_thread == 255  # 258 fp32 values per thread alone: capped
    capped = residency(kernel, tiling, 128, with_overrides(h100, ["max_registers_per_thread=128"]))
    assert capped.registers_per_thread == 128
    assert capped.ctas_per_sm == min(h100.registers_per_sm // (128 * 128),
                                     h100.smem_per_sm_bytes // (kernel.sram_bytes
                                                               + SMEM_RESERVED_PER_CTA_BYTES))


def test_a_toml_with_another_sector_size_is_refused(tmp_path):
    text = (PRESET_DIR / "h100-sxm5.toml").read_text()
    path = tmp_path / "odd.toml"
    path.write_text(text.replace("l2_sector_bytes = 32", "l2_sector_bytes = 64"))
    with pytest.raises(HardwareError, match="not modelled"):
        load_hardware(path)


def test_a_retired_key_is_refused_with_what_took_its_place(tmp_path):
    """``smem_overlap`` (shared memory's own overlap with the math pipes) was retired when
    ``unit_overlap`` came to cover all four units: a file that still gives it, or a --set of
    it, is refused with that reason, not read as if it meant what it did."""
    text = (PRESET_DIR / "h200-sxm.toml").read_text()
    path = tmp_path / "old.toml"
    path.write_text(text.replace("unit_overlap = 0.53", "unit_overlap = 0.19\nsmem_overlap = 0.63"))
    with pytest.raises(HardwareError, match="smem_overlap was retired on 2026-12-05: "
                                            "unit_overlap now covers .*; delete the key"):
        load_hardware(path)
    with pytest.raises(HardwareError, match="--set smem_overlap: smem_overlap was retired"):
        with_overrides(load_hardware("h200-sxm"), ["smem_overlap=0.5"])
    # the calibrated preset committed (fitted from h200-sxm since the retirement) loads
    calibrated = Path(__file__).parent.parent / "validation/records/h200-calibrated-2026-12-05.toml"
    assert load_hardware(calibrated).unit_overlap == pytest.approx(0.53, abs=0.005)
