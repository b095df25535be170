"""Nsight Compute CSV parsing and matching, on SYNTHETIC output in ncu's documented long form.

The fixtures follow ``ncu --csv`` (details page): a header row, then one row per
(kernel launch, metric) with "ID", "Kernel Name", "Metric Name", "Metric Unit",
"Metric Value" among other columns, interleaved with ``==PROF==`` lines. The numbers are
made up.
"""

from __future__ import annotations

import pytest

from validation import ncu

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
          '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
          '"Metric Value"')


def _rows(launch_id: int, kernel: str, metrics: list[tuple[str, str, str]]) -> list[str]:
    return [f'"{launch_id}","4242","python3","synthetic-host","{kernel}","1","7",'
            f'"(128, 1, 1)","(64, 16, 1)","0","9.0","Command line profiler metrics",'
            f'"{name}","{unit}","{value}"' for name, unit, value in metrics]


def _metrics(dram_read="1,048,576", dram_unit="byte", time="12.5", time_unit="usecond",
             hit="75.5", rs="65,536", ws="1,024", clock="1,771,269,524.44", clock_unit="hz"):
    return [("dram__bytes_read.sum", dram_unit, dram_read),
            ("gpc__cycles_elapsed.avg.per_second", clock_unit, clock),
            ("dram__bytes_write.sum", "byte", "4096"),
            ("gpu__time_duration.sum", time_unit, time),
            ("lts__t_sector_hit_rate.pct", "%", hit),
            ("lts__t_sectors_srcunit_tex_op_read.sum", "sector", rs),
            ("lts__t_sectors_srcunit_tex_op_write.sum", "sector", ws),
            ("sm__sass_data_bytes_mem_shared.sum", "Kbyte", "2.5")]


CSV = "\n".join([
    "==PROF== Connected to process 4242 (/usr/bin/python3)",
    "==PROF== Profiling \"fa2_fwd\" - 0: 0%....50%....100% - 3 passes",
    HEADER,
    *_rows(0, "fa2_fwd", _metrics()),
    *_rows(1, "fa2_fwd", _metrics(dram_read="2.0", dram_unit="Mbyte", time="1.5",
                                  time_unit="msecond")),
    *_rows(2, "fa2_bwd_preprocess", _metrics(rs="100", ws="100", hit="50")),
    *_rows(3, "fa2_bwd_dkdv", _metrics(rs="300", ws="100", hit="100", time="50",
                                       clock="1.8", clock_unit="Ghz")),
    *_rows(4, "fa2_bwd_dq", _metrics(rs="0", ws="0", hit="n/a")),
    "==PROF== Disconnected from process 4242",
])


def test_parse_long_format_units_and_separators():
    launches = ncu.parse_csv(CSV)
    assert [launch.id for launch in launches] == [0, 1, 2, 3, 4]
    assert [launch.name for launch in launches] == ["fa2_fwd", "fa2_fwd", "fa2_bwd_preprocess",
                                                    "fa2_bwd_dkdv", "fa2_bwd_dq"]
    m0, m1 = launches[0].metrics, launches[1].metrics
    assert m0["dram__bytes_read.sum"] == 1_048_576
    assert m0["lts__t_sectors_srcunit_tex_op_read.sum"] == 65_536
    assert m0["gpu__time_duration.sum"] == pytest.approx(12.5e-6)
    assert m0["sm__sass_data_bytes_mem_shared.sum"] == pytest.approx(2500)
    assert m0["lts__t_sector_hit_rate.pct"] == pytest.approx(75.5)
    assert m1["dram__bytes_read.sum"] == pytest.approx(2e6)
    assert m1["gpu__time_duration.sum"] == pytest.approx(1.5e-3)
    assert m0["gpc__cycles_elapsed.avg.per_second"] == pytest.approx(1_771_269_524.44)
    assert launches[3].metrics["gpc__cycles_elapsed.avg.per_second"] == pytest.approx(1.8e9)
    assert launches[4].metrics["lts__t_sector_hit_rate.pct"] is None  # n/a


@pytest.mark.parametrize("text,unit,expected", [
    ("1,234,567", "byte", 1234567.0), ("1234567", "byte", 1234567.0),
    ("1.5", "Gbyte", 1.5e9), ("3", "KiB", 3072.0), ("2", "Msector", 2e6),
    ("250", "nsecond", 250e-9), ("7", "second", 7.0), ("12.5", "%", 12.5),
    ("n/a", "byte", None), ("1,5", "byte", None), ("1,980,000,000", "hz", 1.98e9),
    ("1.755", "Ghz", 1.755e9), ("1755", "Mhz", 1.755e9), ("1.8e9", "cycle/second", 1.8e9),
])
def test_parse_value(text, unit, expected):
    value, _ = ncu.parse_value(text, unit)
    assert value == (pytest.approx(expected) if expected is not None else None)


def test_kernel_base_name_and_missing_table():
    assert ncu.kernel_base_name("void fa2_fwd(float*, int)") == "fa2_fwd"
    assert ncu.kernel_base_name("decode_split") == "decode_split"
    with pytest.raises(ncu.NcuParseError):
        ncu.parse_csv("==PROF== nothing was profiled\n")


def test_match_by_name_and_order_with_setup_failures_and_stops():
    launches = ncu.parse_csv(CSV)
    manifest = [
        {"config": "fwd-a", "role": "measure", "kernels": ["fa2_fwd"], "ok": True},
        {"config": None, "role": "setup", "kernels": ["fa2_fwd"]},
        {"config": "bwd-a", "role": "measure",
         "kernels": ["fa2_bwd_preprocess", "fa2_bwd_dkdv", "fa2_bwd_dq"], "ok": True},
        {"config": "bwd-b", "role": "measure", "kernels": [], "ok": False,
         "error": "OutOfResources: shared memory"},
        {"config": "bwd-c", "role": "measure",
         "kernels": ["fa2_bwd_preprocess", "fa2_bwd_dkdv", "fa2_bwd_dq"], "ok": True},
        {"role": "stopped", "remaining": ["bwd-d"]},
    ]
    matched, missing = ncu.match(launches, manifest)
    assert list(matched) == ["fwd-a", "bwd-a"]
    assert [k.id for k in matched["bwd-a"]] == [2, 3, 4]
    assert "OutOfResources" in missing["bwd-b"]
    assert "no result" in missing["bwd-c"]
    assert "time budget" in missing["bwd-d"]


def test_match_skips_an_unexpected_launch():
    launches = ncu.parse_csv(CSV)
    manifest = [{"config": "x", "role": "measure", "kernels": ["fa2_bwd_preprocess"],
                 "ok": True}]
    matched, _ = ncu.match(launches, manifest)
    assert [k.id for k in matched["x"]] == [2]  # two fa2_fwd launches skipped


def test_counters_totals_and_weighted_hit_rate():
    launches = ncu.parse_csv(CSV)[2:5]
    c = ncu.counters(launches)
    assert c["dram_read_bytes"] == 3 * 1_048_576
    assert c["dram_write_bytes"] == 3 * 4096
    assert c["l2_read_sectors"] == 400 and c["l2_write_sectors"] == 200
    assert c["l2_read_bytes"] == 400 * 32 and c["l2_write_bytes"] == 200 * 32
    assert c["duration_s"] == pytest.approx(2 * 12.5e-6 + 50e-6)
    assert c["l2_hit_rate_pct"] is None  # one kernel reported n/a
    # the clock weighted by each kernel's time: two at 1.77 GHz for 12.5 us, one at 1.8 for 50
    assert c["sm_clock_hz"] == pytest.approx((2 * 12.5 * 1_771_269_524.44 + 50 * 1.8e9) / 75)
    assert [k["sm_clock_hz"] for k in c["kernels"]] == pytest.approx(
        [1_771_269_524.44, 1.8e9, 1_771_269_524.44])
    c2 = ncu.counters(ncu.parse_csv(CSV)[2:4])
    # weighted by L2 sectors: (50 * 200 + 100 * 400) / 600
    assert c2["l2_hit_rate_pct"] == pytest.approx((50 * 200 + 100 * 400) / 600)
    assert [k["name"] for k in c2["kernels"]] == ["fa2_bwd_preprocess", "fa2_bwd_dkdv"]
    assert ncu.counters(ncu.parse_csv(CSV)[3:4])["sm_clock_hz"] == pytest.approx(1.8e9)


def test_usable_metrics_and_command():
    listing = ("Device GH100\nMetric Name   Metric Description\n"
               "dram__bytes_read   # of bytes read from DRAM\n"
               "dram__bytes_write  # of bytes written to DRAM\n"
               "gpu__time_duration total duration in nanoseconds\n")
    kept, dropped = ncu.usable_metrics(listing)
    assert kept == ["dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum"]
    assert "sm__sass_data_bytes_mem_shared.sum" in dropped
    assert ncu.usable_metrics(None) == (list(ncu.METRICS), [])
    argv = ncu.command("ncu", kept, ["python3", "-m", "x"])
    assert argv[:4] == ["ncu", "--csv", "--print-units", "base"]
    for flag, value in (("--clock-control", "none"), ("--cache-control", "all"),
                        ("-k", ncu.KERNEL_FILTER)):
        assert argv[argv.index(flag) + 1] == value
    assert argv[-3:] == ["python3", "-m", "x"]
    assert "--print-units" not in ncu.command("ncu", kept, [], base_units=False)


def test_attach_fills_triton_records_and_explains_the_rest():
    launches = ncu.parse_csv(CSV)
    recs = [{"implementation": "triton", "record_id": "a"},
            {"implementation": "triton", "record_id": "b"},
            {"implementation": "triton", "record_id": "c"},
            {"implementation": "sdpa_math", "record_id": "p"}]
    n = ncu.attach(recs, {"a": launches[:1]}, {"b": "the profiled call failed: x"},
                   "not profiled: ncu not found")
    assert n == 1
    assert recs[0]["counters"]["dram_read_bytes"] == 1_048_576
    assert recs[1]["counters"] is None and "failed" in recs[1]["counters_reason"]
    assert recs[2]["counters_reason"] == "not profiled: ncu not found"
    assert recs[3]["counters"] is None and "peer" in recs[3]["counters_reason"]


def test_first_error_line_of_ncu():
    text = ("==PROF== Connected to process 7\n==WARNING== something minor\n"
            "==ERROR== Failed to initialize the profiler: LibraryNotLoaded\n"
            "==ERROR== a second one\n")
    assert ncu.first_error(text) == "Failed to initialize the profiler: LibraryNotLoaded"
    assert ncu.first_error("==PROF== fine\n\"ID\",\"Kernel Name\"\n") is None
    assert ncu.first_error("==ERROR==\n") is None
