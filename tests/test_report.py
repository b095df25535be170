"""``tilesim report``: one self-contained page whose numbers are the commands' own JSON."""

from __future__ import annotations

import contextlib
import io
import json
import re
import time
from html.parser import HTMLParser

import pytest

import simulator.cli as cli
from simulator.explain import model
from simulator.explain.report_sections import lookup
from simulator.hardware import load_hardware
from traces.problem import AttentionProblem
from traces.tiling import Tiling

# A small problem keeps the page fast (every number is a simulation, naive attention the
# slow one); the tiling and blocks are spelled out so that the commands run below see exactly
# what the report saw. Sixteen heads: with eight, FlashAttention-2's 64 CTAs leave half
# the SMs idle, each going through its 16 iterations at its warps' pace (the table of
# compiles' instruction counts), and naive attention's three kernels, which fill them and
# keep S and P (16 MiB each) in L2 from one kernel to the next, are ahead of it.
H, N, D = 16, 1024, 64
PROBLEM = ["--hardware", "h100-sxm5", "--batch", "1", "--heads", str(H), "--seq", str(N),
           "--head-dim", str(D), "--dtype", "bf16"]
TILING = ["--block-m", "128", "--block-n", "64"]
CHART_IDS = ["chart-roofline", "chart-time", "chart-bytes", "chart-heatmap", "chart-timeline",
             "chart-bill", "chart-ledger", "chart-fit-time", "chart-fit-dram"]
SECTIONS = ["overview", "roofline", "compare", "sweep", "timeline", "bill", "ledger", "records"]


def commands() -> list[str]:
    """Our subcommands and the ones we compare with."""
    return ["report", "roofline", "bill", "ledger", "count", "simulate", "reconcile"]


def tilesim(argv: list[str]) -> tuple[int, str]:
    """Run ``tilesim ARGV`` in-process; (exit code, stdout)."""
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.setattr(cli, "COMMANDS", commands())
        try:
            code = cli.main(argv)
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue()


def tilesim_json(argv: list[str]) -> dict:
    code, out = tilesim([*argv, "--json"])
    assert code == 0, argv
    return json.loads(out)


def synthetic_record(i: int, schedule: str, block_m: int, block_n: int, time_s: float,
                     dram_bytes: float) -> dict:
    """A clearly labelled synthetic record (``tilesim.record/1``): not a measurement."""
    return {
        "schema": "tilesim.record/1", "record_id": f"synthetic-{i}", "synthetic": True,
        "kernel": f"{schedule}_fwd", "implementation": "triton", "schedule": schedule,
        "environment": {"gpu_name": "NVIDIA H100 80GB HBM3"},
        "problem": {"batch": 1, "heads": H, "seq_q": N, "head_dim": D, "dtype": "bf16"},
        "tiling": {"block_m": block_m, "block_n": block_n, "num_stages": 2, "num_warps": 4,
                   "split_kv": 1},
        "timing": {"median_s": time_s, "p20_s": time_s * 0.98, "p80_s": time_s * 1.03},
        "counters": {"dram_read_bytes": dram_bytes, "dram_write_bytes": dram_bytes / 8},
        "correctness": {"max_abs_err": 1e-3},
    }


def write_records(path) -> None:
    recs = [synthetic_record(0, "fa2", 128, 64, 9.0e-5, 3.0e7),
            synthetic_record(1, "fa2", 64, 64, 1.2e-4, 4.0e7),
            synthetic_record(2, "naive", 128, 64, 4.0e-4, 6.0e8),
            {**synthetic_record(3, "fa2", 128, 64, 1e-4, 1e7), "implementation": "sdpa_flash",
             "schedule": None, "tiling": None, "kernel": "sdpa_flash"}]
    lines = [json.dumps(r) for r in recs] + ["{not json"]
    path.write_text("\n".join(lines) + "\n")


def make_report(directory) -> tuple:
    records = directory / "synthetic.jsonl"
    write_records(records)
    out = directory / "report.html"
    code, stdout = tilesim(["report", *PROBLEM, *TILING, "--sweep-blocks", "32,64,128",
                            "--records", str(records), "--out", str(out)])
    assert code == 0
    return out, out.read_text(encoding="utf-8")


class Spans(HTMLParser):
    """Collects ``data-key`` spans, element ids and the embedded data block."""

    def __init__(self):
        super().__init__()
        self.spans, self.ids, self.data_text, self._in_data = [], set(), "", False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        if "data-key" in a:
            self.spans.append((a["data-key"], a["data-value"]))
        self._in_data = tag == "script" and a.get("id") == "tilesim-data"

    def handle_data(self, data):
        if self._in_data:
            self.data_text += data

    def handle_endtag(self, tag):
        self._in_data = False


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    path, text = make_report(tmp_path_factory.mktemp("report"))
    parser = Spans()
    parser.feed(text)
    return {"path": path, "text": text, "parser": parser,
            "data": json.loads(parser.data_text)}


def test_self_contained(page):
    text = page["text"]
    assert text.startswith("<!DOCTYPE html>")
    assert "http://" not in text and "https://" not in text  # nothing to fetch, no CDN
    assert not re.search(r'<(script|img|iframe|link)[^>]+(src|href)="(?!data:|#)', text)
    assert "@import" not in text and "@font-face" not in text
    assert re.findall(r"url\((.)", text) == ["#"] * text.count("url(")  # local clip paths only
    assert "@media print" in text
    for anchor in SECTIONS + CHART_IDS:
        assert anchor in page["parser"].ids, anchor


def test_every_number_on_the_page_is_its_data(page):
    spans = page["parser"].spans
    assert len(spans) > 80
    for key, raw in spans:
        assert json.loads(raw) == lookup(page["data"], key), key


def test_sections_equal_the_commands_json(page):
    data = page["data"]
    assert data["roofline"] == tilesim_json(["roofline", *PROBLEM, *TILING])
    b = data["bill"]
    seqs = ",".join(str(r["seq"]) for r in b["rows"])
    assert b == tilesim_json(["bill", "--seq", seqs, "--head-dim", str(D), "--dtype", "bf16"])
    assert N in [r["seq"] for r in b["rows"]]
    assert data["ledger"] == tilesim_json(["ledger", "--seq", "64", "--tile", "16", "--seed",
                                           "0"])
    for schedule in ("naive", "fa2"):
        counted = tilesim_json(["count", *PROBLEM, *TILING, "--schedule", schedule])
        shown = data["predictions"][schedule]
        for key in ("global_read", "global_write"):
            assert shown["bytes"][key] == counted["bytes"][key]
            assert data["compare"][schedule]["bytes"][key] == counted["bytes"][key]
        # The counted FLOPs, and beside them the work the simulation issued (whole tiles).
        assert {k: v for k, v in shown["flops"].items() if k != "issued"} == counted["flops"]
        # One model throughout: the page's times and DRAM bytes are the simulator's.
        simulated = tilesim_json(["simulate", *PROBLEM, *TILING, "--schedule", schedule])
        assert data["compare"][schedule]["time_s"] == shown["time_s"] == simulated["time_s"]
        assert shown["bytes"] == simulated["bytes"]
        assert shown["flops"] == simulated["flops"]
        assert shown["kernels"] == simulated["kernels"]
        assert shown["model"] == {"source": "simulator",
                                  "note": "SimPy timing simulator with L2 model"}


def test_compare_and_sweep_numbers(page):
    data = page["data"]
    cmp = data["compare"]
    assert cmp["speedup"] == cmp["naive"]["time_s"] / cmp["fa2"]["time_s"] > 1
    # Naive holds S and P (N x N each, per head) in HBM; FA2 only Q, K, V, O and the LSE.
    n, h, d, s = N, H, D, 2
    assert cmp["naive"]["hbm_footprint_bytes"] >= 2 * h * n * n * s
    assert cmp["fa2"]["hbm_footprint_bytes"] == 4 * h * n * d * s + h * n * 4
    sweep = data["sweep"]
    assert [c["block_m"] for c in sweep["cells"]] == [32] * 3 + [64] * 3 + [128] * 3
    legal = [c for c in sweep["cells"] if c["legal"]]
    assert sweep["best"] == min(legal, key=lambda c: c["time_s"])
    tl = data["timeline"]
    assert (tl["tiling"]["block_m"], tl["tiling"]["block_n"]) == (
        sweep["best"]["block_m"], sweep["best"]["block_n"])
    n_ctas = sum(len(s["sm"]) for s in tl["slices"])
    assert n_ctas == sum(k["grid"] for k in tl["kernels"])
    # The timeline is the simulation of the best tiling: the same run the sweep timed.
    assert tl["time_s"] == sweep["best"]["time_s"]
    assert tl["time_s"] == pytest.approx(sum(k["time_s"] for k in tl["kernels"]), rel=1e-12)
    assert all(0 <= sm < tl["sm_count"] for s in tl["slices"] for sm in s["sm"])
    for s in tl["slices"]:  # no CTA before its kernel starts or after the run ends
        k = tl["kernels"][s["kernel"]]
        assert min(s["start_s"]) >= k["start_s"]
        ends = [a + b for a, b in zip(s["start_s"], s["dur_s"], strict=True)]
        assert max(ends) <= k["start_s"] + k["time_s"] * (1 + 1e-9)


def test_records_against_the_model(page):
    rec = page["data"]["records"]
    assert len(rec["rows"]) == 3
    assert [x["reason"] for x in rec["skipped"]] == ["PyTorch peer (sdpa_flash), measured only"]
    assert rec["synthetic"] is True and rec["hardware"] == ["h100-sxm5"]
    assert len(rec["line_errors"]) == 1 and ":5:" in rec["line_errors"][0]
    hw = load_hardware("h100-sxm5")
    problem = AttentionProblem(batch=1, heads=H, seq_q=N, head_dim=D)
    measured = [(9.0e-5, 3.0e7 * 9 / 8), (1.2e-4, 4.0e7 * 9 / 8), (4.0e-4, 6.0e8 * 9 / 8)]
    tilings = [("fa2", 128, 64), ("fa2", 64, 64), ("naive", 128, 64)]
    errs = []
    for row, (t, dram), (sched, bm, bn) in zip(rec["rows"], measured, tilings, strict=True):
        pred = model.predict_profiled(problem, Tiling(block_m=bm, block_n=bn), sched, hw)
        assert row["measured_time_s"] == t and row["measured_dram_bytes"] == dram
        assert row["time_err"] == (pred["time_s"] - t) / t
        # ncu's DRAM bytes: a kernel that re-reads what an earlier one stored (naive's
        # softmax and P·V here: S and P fit L2) counted as profiled alone, from DRAM
        predicted_dram = model.dram_bytes(pred["bytes"]) + sum(
            model.dram_bytes(k["profiled"]) - model.dram_bytes(k["bytes"])
            for k in pred["kernels"] if "profiled" in k)
        assert ("profiled" in pred["kernels"][-1]) == (sched == "naive")
        assert row["dram_err"] == (predicted_dram - dram) / dram
        errs.append(abs(row["time_err"]))
    assert rec["summary"]["time"]["mape"] == pytest.approx(sum(errs) / 3, rel=1e-12)
    assert rec["summary"]["time"]["max_abs"] == max(errs)
    assert "Synthetic records" in page["text"]


def test_records_match_tilesim_reconcile(page):
    rec = page["data"]["records"]
    reconciled = tilesim_json(["reconcile", str(page["path"].parent / "synthetic.jsonl")])
    by_id = {r["record_id"]: r for r in reconciled["rows"]}
    assert sorted(by_id) == sorted(r["record_id"] for r in rec["rows"])
    for row in rec["rows"]:
        theirs = by_id[row["record_id"]]
        assert row["measured_time_s"] == theirs["measured"]["time"]
        assert row["measured_dram_bytes"] == theirs["measured"]["dram"]
        # One model on both sides: the simulator.
        assert row["predicted_time_s"] == theirs["predicted"]["time"]
        assert row["predicted_dram_bytes"] == theirs["predicted"]["dram"]


def test_default_problem_is_fast_and_atomic(tmp_path):
    start = time.perf_counter()
    code, out = tilesim(["report", "--out", str(tmp_path / "r.html")])
    assert code == 0 and out.strip() == f"wrote {tmp_path / 'r.html'}"
    # The default problem (B=1 H=32 N=4096 d=128) is simulated, naive included: ~10 s here.
    assert time.perf_counter() - start < 60
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]  # no temporary file left


def test_no_records_section_says_how(tmp_path):
    code, out = tilesim(["report", "--heads", "2", "--seq", "1024", "--head-dim", "64",
                         "--sweep-blocks", "64,128",
                         "--out", str(tmp_path / "r.html"), "--json"])
    assert code == 0
    data = json.loads(out)
    assert data["records"] is None and data["schema"] == "tilesim.report/1"
    text = (tmp_path / "r.html").read_text()
    assert "--records" in text and "chart-fit-time" not in text


@pytest.mark.parametrize("argv", [
    ["report", "--out", "{tmp}/r.html", "--sweep-blocks", "48"],
    ["report", "--out", "{tmp}/r.html", "--sweep-blocks", "a,b"],
    ["report", "--out", "{tmp}/r.html", "--heads", "0"],
    ["report", "--out", "{tmp}/r.html", "--hardware", "no-such-gpu"],
    ["report", "--out", "{tmp}/r.html", "--records", "{tmp}/missing.jsonl"],
    ["report", "--out", "{tmp}/no/such/dir/r.html"],
    ["report"],  # --out is required (argparse)
])
def test_bad_input_exit_2_one_line(argv, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli, "COMMANDS", ["report"])
        try:
            code = cli.main(argv)
        except SystemExit as exc:
            code = exc.code
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("tilesim: error: ") and err.count("\n") == 1, err
    assert not (tmp_path / "r.html").exists()


def test_timeline_from_kernel_runs():
    """The simulator's per-launch records (slot s on SM s % sm_count) become SM lanes."""
    from types import SimpleNamespace

    run = SimpleNamespace(name="fa2_fwd", launch_s=0.0, end_s=9e-6, ctas_per_sm=2,
                          cta_start=[3e-6, 3e-6, 3e-6, 6e-6], cta_end=[6e-6, 7e-6, 8e-6, 9e-6],
                          cta_slot=[0, 1, 4, 0])
    kernels, slices = model.slices_from_kernel_runs([run], sm_count=4)
    assert kernels == [{"name": "fa2_fwd", "start_s": 0.0, "time_s": 9e-6, "grid": 4,
                        "ctas_per_sm": 2}]
    assert slices[0]["sm"] == [0, 1, 0, 0] and slices[0]["lane"] == [0, 0, 1, 0]
    assert slices[0]["dur_s"] == pytest.approx([3e-6, 4e-6, 5e-6, 3e-6])


def test_data_is_strict_json():
    import numpy as np

    from simulator.explain.report import jsonable

    raw = {"a": np.float64(1.5), "b": np.arange(3), "c": [float("nan"), float("inf"), 2],
           "d": (np.int64(7), None), 3: True}
    clean = jsonable(raw)
    assert clean == {"a": 1.5, "b": [0, 1, 2], "c": [None, None, 2], "d": [7, None], "3": True}
    json.dumps(clean, allow_nan=False)


def test_records_that_are_all_malformed_say_why(tmp_path, capsys):
    """A timed record refused by the checks is reported with its reason, not as 'no
    timed records' alone."""
    rec = {**synthetic_record(0, "fa2", 128, 64, 9.0e-5, 3.0e7), "counters": None}
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli, "COMMANDS", ["report"])
        code = cli.main(["report", "--out", str(tmp_path / "r.html"), "--records", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "1 lines skipped" in err and "counters_reason" in err


def test_records_the_model_refuses_are_listed_not_dropped():
    """A record the model cannot predict is named under 'Not compared', with the reason."""
    from simulator.explain.records import from_reconcile
    from traces.problem import ProblemError
    from validation.reconcile import reconcile

    def picky(problem, tiling, schedule, hw, compiled=None, l2_start="cold"):
        if tiling.block_m == 128:
            raise ProblemError("tile larger than SRAM")
        return model.predict(problem, tiling, schedule, hw)

    recs = [synthetic_record(0, "fa2", 128, 64, 9.0e-5, 3.0e7),
            synthetic_record(1, "fa2", 64, 64, 1.2e-4, 4.0e7)]
    section = from_reconcile(reconcile(recs, predictor=picky, model="picky"))
    assert [r["record_id"] for r in section["rows"]] == ["synthetic-1"]
    assert [s["label"] for s in section["skipped"]] == ["record synthetic-0"]
    assert "not predicted" in section["skipped"][0]["reason"]
    assert "SRAM" in section["skipped"][0]["reason"]


def test_small_throughputs_keep_their_digits():
    from simulator.explain.report_sections import tflops

    assert tflops(352.34) == "352" and tflops(42.345) == "42.3"
    assert tflops(0.0123456) == "0.0123" and tflops(1234.5) == "1,234"
