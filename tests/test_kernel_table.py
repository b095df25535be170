"""tilesim's table of compiles (``kernels.table``): current, complete, equal to the H200's
own compiles, and what the prediction commands take without ``--compiled-resources``."""

from __future__ import annotations

import dataclasses
import functools
import gzip
import itertools
import json
from pathlib import Path

import pytest

from kernels import resources, table, table_check
from simulator import cli
from simulator.hardware import load_hardware
from simulator.occupancy import estimated_registers_per_thread
from traces.problem import AttentionProblem
from traces.schedules import build_schedule
from traces.tiling import Tiling

RECORDS = Path(__file__).resolve().parents[1] / "validation" / "records"
H200 = load_hardware("h200-sxm")


def _cli(argv, capsys):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _simulate(capsys, *extra, **problem):
    flags = {"batch": 1, "heads": 16, "seq": 1024, "head-dim": 128, "block-m": 128,
             "block-n": 64, "stages": 2, "warps": 4} | problem
    argv = ["simulate", "--hardware", "h200-sxm", "--json", *extra]
    for name, value in flags.items():
        argv += [f"--{name}", str(value)]
    code, out, err = _cli(argv, capsys)
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("arch", sorted(table.TABLES))
def test_the_table_is_compiled_from_the_kernels_as_they_are(arch):
    """Rebuild it (``python -m kernels.table build [--arch 80]``) after editing a kernel or
    the way ``kernels.resources`` reads a compile: a stale table is not used, and this
    fails. sm_90's is the one a call that names no architecture takes."""
    head = table.header(arch)
    assert head["schema"] == table.SCHEMA and head["arch"] == arch
    assert head["sources"] == resources.sources_digest()
    assert head["triton"] == table.header(table.ARCH)["triton"]
    assert table.current(arch)
    assert table.ARCH == 90 and table.header() == table.header(90)


@pytest.mark.parametrize("arch", sorted(table.TABLES))
def test_the_table_covers_every_variant_over_the_sweep_space(arch):
    from simulator.cli.sweep_cmd import BLOCKS, STAGES, WARPS

    assert (table.BLOCKS, table.STAGES, table.WARPS) == (BLOCKS, STAGES, WARPS)
    tilings = table.sweep_space()
    assert len(tilings) == 250
    for v in table.VARIANTS_OF[arch]:
        launches = table.variant_launches(v)
        # decode's sweep has no block_m axis: its 50 block_n, stages and warps
        assert len(launches) == (50 if v["kernel"].startswith("decode") else 250)
        for shape, tiling in launches:
            key = resources.job_key(v["kernel"], arch, v["dtype"], v["head_dim"],
                                    tiling, **shape)
            found = table.lookup(key)
            assert found is not None, key
            # a compile's answer: registers and shared memory (none for naive_softmax's
            # shortest rows, which a warp reduces alone), or why it does not compile
            assert found["error"] is not None or (found["registers"]
                                                  and found["shared_bytes"] is not None)


def test_the_table_has_the_h200_records_own_compile_facts():
    """The device compiled the kernels of each compile key of its plan once, as the first
    config with that key launches them (Triton 3.6.0 on the H200, that launch's own
    specialization), and recorded their registers and shared memory for every config with
    the key: the table, compiled here for sm_90 under the same Triton, has the same numbers
    for every kernel of every FA2, naive and decode record, forward and backward. (Their
    spill sizes were read as 0 until 2026-12-02, from the wrong column: not compared.)

    The plan's compile key left out how Triton specializes decode's split count and chunk
    (``validation.compile.launch_key`` adds it since 2026-12-07): one decode record, a
    chunk of one K/V block (a constexpr), carries its sibling's 72 registers where its own
    launch compiles to 80."""
    plan = json.loads((RECORDS.parent / "plans" / "default.json").read_text())
    warmed = {}
    for cfg in plan["configs"]:  # precompile's order: the first config of each key
        warmed.setdefault(cfg["compile_key"], cfg)
    first_of = {cfg["id"]: warmed[cfg["compile_key"]] for cfg in plan["configs"]}

    def row(name, cfg):
        p, t = AttentionProblem.from_dict(cfg["problem"]), Tiling.from_dict(cfg["tiling"])
        found = table.problem_rows(p, t, [name]).get(name)
        assert found is not None, (cfg["id"], name)
        return found["registers"], found["shared_bytes"]

    checked, own_launch_differs = {"fa2": 0, "naive": 0, "decode": 0}, []
    for line in (RECORDS / "h200-default-2026-11-30.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("schedule") not in checked or rec.get("implementation") != "triton":
            continue
        for facts in rec["kernel_facts"]:
            device = (facts["registers"], facts["shared_bytes"])
            assert row(facts["name"], first_of[rec["record_id"]]) == device, rec["record_id"]
            if row(facts["name"], rec) != device:
                own_launch_differs.append((rec["record_id"], facts["name"], row(
                    facts["name"], rec)[0], device[0]))
            checked[rec["schedule"]] += 1
    # FA2: the forwards, and the backwards' three kernels; naive: its forwards' three;
    # decode: its split and its reduce
    assert checked == {"fa2": 90 + 95 * 3, "naive": 80 * 3, "decode": 40 * 2}
    assert own_launch_differs == [
        ("decode-fwd-b16-h32-kv8-q1-k1024-d128-bf16-m16-n32-s2-w4-sp32", "decode_split", 80, 72)]


def test_the_table_is_what_its_triton_compiles(monkeypatch):
    """Jobs of both tables compiled here, the cache off, equal their rows, under the Triton
    the tables were made with (others compile differently: skipped)."""
    triton = pytest.importorskip("triton")

    if triton.__version__ != table.header()["triton"]:
        pytest.skip(f"the table is Triton {table.header()['triton']}'s, "
                    f"this is {triton.__version__}")
    monkeypatch.setenv(resources.CACHE_ENV, "")
    shape = dict(table.LAUNCH, causal=True)
    tilings = [Tiling(128, 64, 2, 4), Tiling(64, 32, 3, 4)]
    compiled = resources.measure(["fa2_fwd"], dtype="bf16", head_dim=128, tilings=tilings,
                                 workers=1, **shape)
    for tiling, result in zip(tilings, compiled, strict=True):
        key = resources.job_key("fa2_fwd", 90, "bf16", 128, tiling, **shape)
        assert table.lookup(key) == result.to_dict()
    # naive attention's softmax, compiled for its row width; its row stands for every
    # block size (labelled with the first the build asked for)
    shape, tiling = table.variant_shape({"causal": True, "seq": 2048}), Tiling(64, 64, 2, 8)
    (result,) = resources.measure(["naive_softmax"], dtype="bf16", head_dim=128,
                                  tilings=[tiling], workers=1, **shape)
    row = table.lookup(resources.job_key("naive_softmax", 90, "bf16", 128, tiling, **shape))
    assert resources.KernelResources.of_job(row, tiling, 128) == result
    # FA2's forward with GQA, compiled at a group of 8: the group-4 row stands for it
    tiling, gqa = Tiling(128, 64, 2, 4), resources.launch_shape(4096, 32, 8)
    (result,) = resources.measure(["fa2_fwd"], dtype="bf16", head_dim=64, tilings=[tiling],
                                  workers=1, causal=False, seq_kv=4096, **gqa)
    problem = AttentionProblem(batch=1, heads=32, kv_heads=4, seq_q=4096, head_dim=64)
    assert table.problem_rows(problem, tiling, ["fa2_fwd"])["fa2_fwd"] == result.to_dict()
    # sm_80's table: FA2's forward and dK/dV, and FA1's forward, compiled for the A100
    shape = dict(table.LAUNCH, causal=True)
    for kernel in ("fa2_fwd", "fa2_bwd_dkdv", "fa1_fwd"):
        (result,) = resources.measure([kernel], archs=(80,), dtype="bf16", head_dim=128,
                                      tilings=[Tiling(64, 64, 3, 4)], workers=1, **shape)
        key = resources.job_key(kernel, 80, "bf16", 128, Tiling(64, 64, 3, 4), **shape)
        assert table.lookup(key) == result.to_dict()
    # and FA2's dQ there at lengths off the multiples of 16
    shape = table.variant_shape({"causal": True, "seq": table.OFF_16_SEQ})
    tiling = Tiling(64, 32, 2, 4)
    (result,) = resources.measure(["fa2_bwd_dq"], archs=(80,), dtype="bf16", head_dim=64,
                                  tilings=[tiling], workers=1, **shape)
    key = resources.job_key("fa2_bwd_dq", 80, "bf16", 64, tiling, **shape)
    assert table.lookup(key) == result.to_dict()
    # and naive attention's: a backward kernel, and the softmax of a row width
    shape, tiling = table.variant_shape({"causal": False}), Tiling(64, 128, 2, 4)
    (result,) = resources.measure(["naive_bwd_dk"], archs=(80,), dtype="bf16", head_dim=128,
                                  tilings=[tiling], workers=1, **shape)
    key = resources.job_key("naive_bwd_dk", 80, "bf16", 128, tiling, **shape)
    assert table.lookup(key) == result.to_dict()
    shape, tiling = table.variant_shape({"causal": True, "seq": 2048}), Tiling(64, 64, 2, 8)
    (result,) = resources.measure(["naive_softmax"], archs=(80,), dtype="fp16",
                                  head_dim=128, tilings=[tiling], workers=1, **shape)
    row = table.lookup(resources.job_key("naive_softmax", 80, "fp16", 128, tiling, **shape))
    assert resources.KernelResources.of_job(row, tiling, 128) == result
    # decode's split at a launch of its own (keys off the multiples of 16, split in 8
    # chunks of 47 blocks, a group of 8): the row of its classes, compiled elsewhere
    problem = AttentionProblem(batch=2, heads=32, kv_heads=4, seq_q=1, seq_kv=12001,
                               head_dim=64)
    tiling = Tiling(128, 32, 3, 4, 8)
    (result,) = resources.measure(["decode_split"], dtype="bf16", head_dim=64,
                                  tilings=[tiling], workers=1,
                                  **resources.problem_shape(problem))
    assert table.problem_rows(problem, tiling, ["decode_split"])["decode_split"] == \
        result.to_dict()


def test_simulate_takes_the_table_without_a_compiler(capsys):
    """FA2's forward at d = 128, 128 x 64, 4 warps (the default tiling) spills: the table
    says so where the estimate cannot, and the spills cost it time."""
    shipped = _simulate(capsys)
    estimated = _simulate(capsys, "--estimated-resources")
    (k,), (e,) = shipped["kernels"], estimated["kernels"]
    assert k["resources"] == "table" and e["resources"] == "estimated"
    key = resources.job_key("fa2_fwd", 90, "bf16", 128, Tiling(128, 64, 2, 4),
                            **dict(table.LAUNCH, causal=False))
    row = table.lookup(key)
    assert k["registers_per_thread"] == row["registers"] == 255
    assert k["spill_bytes_per_iteration"] == (row["spill_load_bytes_per_iteration"]
                                              + row["spill_store_bytes_per_iteration"]) > 0
    assert k["loop_instructions"] == row["loop_instructions"]
    problem = AttentionProblem(batch=1, heads=16, seq_q=1024, head_dim=128)
    kernel = build_schedule(problem, Tiling(128, 64, 2, 4), "fa2").kernels[0]
    assert e["registers_per_thread"] == estimated_registers_per_thread(
        kernel, Tiling(128, 64, 2, 4), 128)
    assert e["spill_bytes_per_iteration"] is None
    assert shipped["time_s"] > estimated["time_s"]


def test_decode_is_compiled_at_every_class_of_its_integers():
    """Triton specializes decode's integers (key length, group, split count, chunk) on
    being 1 or a multiple of 16, so its variants are those classes, each launched at a key
    length and split counts that have them at every block_n, no chunk left empty."""
    variants = [v for v in table.VARIANTS if v["kernel"] in table.DECODE_KERNELS]
    classes = {(v["kernel"], v["keys"], v["split"], v["chunk"]) for v in variants}
    assert len(classes) == 2 * 3 * 3 + 3  # the split's; the reduce's, which knows no keys
    for v in variants:
        for shape, tiling in table.variant_launches(v):
            ints = resources.launch_ints(v["kernel"], tiling, shape["seq_q"],
                                         shape["seq_kv"], shape["heads"], shape["group"])
            assert table.int_class(ints["n_q"]) == table.ONE
            assert table.int_class(ints["group"]) == (table.ONE if v["group"] == 1
                                                      else table.OFF_16)
            assert table.int_class(ints["n_split"]) == v["split"]
            if v["kernel"] == "decode_split":
                assert table.int_class(ints["n_kv"]) == v["keys"]
                assert table.int_class(ints["chunk"]) == v["chunk"]
                blocks = -(-shape["seq_kv"] // tiling.block_n)
                assert (ints["n_split"] - 1) * ints["chunk"] < blocks  # none empty
    # by hand: splits and chunks both off the multiples at every block_n need 3 blocks of
    # 256 keys (2 blocks split in 2 leave chunks of 1), so 33 of 16 split 17 ways
    assert table.decode_launch(table.ON_16, table.OFF_16, table.OFF_16) == (
        528, {16: 17, 32: 9, 64: 5, 128: 3, 256: 2})
    assert table.decode_launch(table.OFF_16, table.ONE, table.ONE) == (
        15, {bn: 1 for bn in table.BLOCKS})


def _decode_sweep(capsys, *flags, hardware="h200-sxm"):
    code, out, err = _cli(["sweep", "--hardware", hardware, "--schedule", "decode",
                           "--batch", "4", "--heads", "32", "--seq", "1", "--head-dim", "128",
                           "--block-n", "32,128", "--stages", "2", "--warps", "4",
                           "--jobs", "1", "--json", *flags], capsys)
    assert code == 0, err
    return json.loads(out)["results"]


@pytest.mark.parametrize("kv_heads, seq_kv, causal, dtype", [
    (8, 4096, False, "bf16"),  # the records' GQA (group 4)
    (4, 3001, True, "bf16"),  # group 8, keys off the multiples of 16, a mask
    (32, 16000, False, "fp16")])  # group 1; fp16 takes bf16's compile
def test_a_decode_sweep_rates_every_tiling_from_the_table(capsys, kv_heads, seq_kv, causal,
                                                          dtype):
    """Every split count a sweep tries (1, a few, multiples of 16) finds its compile."""
    flags = ["--kv-heads", str(kv_heads), "--kv-seq", str(seq_kv), "--dtype", dtype]
    results = _decode_sweep(capsys, *flags, *(["--causal"] if causal else []))
    assert len({r["tiling"]["split_kv"] for r in results}) >= 5
    problem = AttentionProblem(batch=4, heads=32, kv_heads=kv_heads, seq_q=1, seq_kv=seq_kv,
                               head_dim=128, dtype=dtype, causal=causal)
    for r in results:
        assert [k["resources"] for k in r["kernels"]] == ["table", "table"], r["tiling"]
        rows = table.problem_rows(problem, Tiling.from_dict(r["tiling"]), table.DECODE_KERNELS)
        assert [k["registers_per_thread"] for k in r["kernels"]] == [
            rows[name]["registers"] for name in table.DECODE_KERNELS]


def test_a100_decode_takes_the_sm80_rows(capsys):
    """Decode on an A100 (mma.sync, never wgmma) takes the sm_80 table's rows at every
    split count a sweep tries, which are not sm_90's."""
    problem = AttentionProblem(batch=4, heads=32, kv_heads=8, seq_q=1, seq_kv=3001,
                               head_dim=128, causal=True)
    results = _decode_sweep(capsys, "--kv-heads", "8", "--kv-seq", "3001", "--causal",
                            hardware="a100-sxm4-80gb")
    assert len({r["tiling"]["split_kv"] for r in results}) >= 5
    differ = 0
    for r in results:
        tiling = Tiling.from_dict(r["tiling"])
        own, sm90 = (table.problem_rows(problem, tiling, table.DECODE_KERNELS, arch)
                     for arch in (80, 90))
        assert [k["resources"] for k in r["kernels"]] == ["table", "table"], r["tiling"]
        assert [k["registers_per_thread"] for k in r["kernels"]] == [
            own[name]["registers"] for name in table.DECODE_KERNELS]
        differ += any(dict(own[name], arch=90) != sm90[name] for name in own)
    assert differ == len(results)


def test_decode_with_several_queries_is_estimated(capsys):
    """Four queries a head (speculative decoding) are another compile (``n_q`` no longer a
    constexpr), which the table does not hold."""
    results = _decode_sweep(capsys, "--kv-heads", "8", "--kv-seq", "4096", "--seq", "4")
    assert {k["resources"] for r in results for k in r["kernels"]} == {"estimated"}


def test_fa1_takes_the_table_as_fa2_does(capsys):
    """FA1's forward has rows of its own, so that FA1 and FA2 compare compile against
    compile; each row is its own kernel's (FA1 is not FA2's loop order under another
    name), and its dtype's: fp16 compiles FA1 otherwise than bf16 (a few percent fewer
    loop instructions, other spills), so both are in the table."""
    for causal, dtype in itertools.product(((), ("--causal",)), ("bf16", "fp16")):
        fa1 = _simulate(capsys, *causal, schedule="fa1", dtype=dtype, **{"block-m": 64})
        (k,) = fa1["kernels"]
        assert k["resources"] == "table"
        shape = dict(table.LAUNCH, causal=bool(causal))
        row = table.lookup(resources.job_key("fa1_fwd", 90, dtype, 128,
                                             Tiling(64, 64, 2, 4), **shape))
        assert k["registers_per_thread"] == row["registers"]
        assert k["loop_instructions"] == row["loop_instructions"]
        fa2 = table.lookup(resources.job_key("fa2_fwd", 90, dtype, 128,
                                             Tiling(64, 64, 2, 4), **shape))
        assert row["loop_instructions"] != fa2["loop_instructions"]

    def fa1_row(dtype, tiling):
        return table.lookup(resources.job_key("fa1_fwd", 90, dtype, 128, tiling,
                                              **dict(table.LAUNCH, causal=False)))

    assert any(dict(fa1_row("fp16", tiling), dtype="bf16") != fa1_row("bf16", tiling)
               for tiling in table.sweep_space())


def test_fa2_forward_at_head_dim_256_takes_its_own_rows(capsys):
    """At d = 256 (Gemma) the forward's accumulator alone is 256 fp32 registers a thread
    of a 128-row tile over 4 warps: the default tiling compiles to 255 registers and
    spills every iteration, which the estimate cannot see; with 8 warps it does not.
    GQA has rows of its own there too; the backward at d = 256 has its rows without GQA,
    and stays estimated with it."""
    def row(tiling, group=1, causal=True):
        return table.lookup(resources.job_key("fa2_fwd", 90, "bf16", 256, tiling,
                                              **dict(table.LAUNCH, causal=causal,
                                                     group=group)))

    default, eight_warps = Tiling(128, 64, 2, 4), Tiling(128, 64, 2, 8)
    assert row(default)["registers"] == 255
    assert row(default)["spill_load_bytes_per_iteration"] > 0
    assert row(eight_warps)["spill_load_bytes_per_iteration"] == 0
    assert row(default, group=table.GQA_GROUP) != row(default)
    assert row(default, causal=False) != row(default)
    shipped = _simulate(capsys, "--causal", **{"head-dim": 256})
    estimated = _simulate(capsys, "--causal", "--estimated-resources", **{"head-dim": 256})
    (k,), (e,) = shipped["kernels"], estimated["kernels"]
    assert k["resources"] == "table" and e["resources"] == "estimated"
    assert k["spill_bytes_per_iteration"] == (row(default)["spill_load_bytes_per_iteration"]
                                              + row(default)["spill_store_bytes_per_iteration"])
    assert e["spill_bytes_per_iteration"] is None
    assert shipped["time_s"] > estimated["time_s"]
    for extra, kv_heads in ((("--causal",), 8), ((), 32)):
        other = _simulate(capsys, *extra, "--pass", "fwd+bwd", "--mode", "aggregated",
                          heads=32, **{"kv-heads": kv_heads, "head-dim": 256, "block-m": 64})
        backward = "table" if kv_heads == 32 else "estimated"
        assert {k["name"]: k["resources"] for k in other["kernels"]} == {
            "fa2_fwd": "table", "fa2_bwd_preprocess": "table",  # it knows no group
            "fa2_bwd_dq": backward, "fa2_bwd_dkdv": backward}, extra
        group = 32 // kv_heads
        assert other["kernels"][0]["registers_per_thread"] == row(
            Tiling(64, 64, 2, 4), group=group, causal=bool(extra))["registers"]


def test_naive_attention_takes_the_table_for_its_row_width(capsys):
    """Naive attention's three forward kernels come from the table; its softmax from the
    compile of the row width the launch rounds its key length up to (1536 -> 2048), whose
    registers grow with it. (Lengths not a multiple of 16 are another specialization: the
    next test.)"""
    def naive(seq, *extra):
        return _simulate(capsys, *extra, schedule="naive", seq=seq, **{"block-m": 64,
                                                                      "block-n": 64})
    def softmax_row(row, warps=4):
        return table.lookup(resources.job_key(
            "naive_softmax", 90, "bf16", 128, Tiling(64, 64, 2, warps),
            **table.variant_shape({"causal": False, "seq": row})))

    short, longer = naive(1024), naive(1536)
    for run in (short, longer):
        assert [k["resources"] for k in run["kernels"]] == ["table"] * 3
    (qk, sm, pv) = short["kernels"]
    assert qk["registers_per_thread"] == table.lookup(resources.job_key(
        "naive_qk", 90, "bf16", 128, Tiling(64, 64, 2, 4),
        **table.variant_shape({"causal": False})))["registers"]
    assert sm["registers_per_thread"] == softmax_row(1024)["registers"]
    assert longer["kernels"][1]["registers_per_thread"] == softmax_row(2048)["registers"]
    assert softmax_row(2048)["registers"] > softmax_row(1024)["registers"]
    assert [k["resources"] for k in naive(1024, "--estimated-resources")["kernels"]] == [
        "estimated"] * 3


def test_naive_attention_off_the_multiples_of_16_takes_its_own_rows(capsys):
    """Naive attention at N = 1000 compiles otherwise than at 1024 (Triton specializes a
    length on its divisibility by 16): its matmuls take the rows compiled at ``OFF_16_SEQ``,
    its softmax the row width's own compiled one key short of it, and any other such
    length with the same row width takes the same rows, forward and backward."""
    tiling = Tiling(block_m=64, block_n=64, num_stages=2, num_warps=4)
    forward = ["naive_qk", "naive_softmax", "naive_pv"]
    backward = ["naive_bwd_dv", "naive_bwd_dp", "naive_bwd_ds", "naive_bwd_dq",
                "naive_bwd_dk"]

    def rows(seq, **extra):
        problem = AttentionProblem(batch=1, heads=16, seq_q=seq, head_dim=128,
                                   pass_="fwd+bwd", **extra)
        return table.problem_rows(problem, tiling, forward + backward)

    assert rows(1000).keys() == set(forward + backward)
    assert rows(1000) == rows(1001) and rows(1000) != rows(1024)
    assert rows(1000)["naive_softmax"] == table.lookup(resources.job_key(
        "naive_softmax", 90, "bf16", 128, tiling,
        **table.variant_shape({"causal": False, "seq": 1023})))
    # another row width: 1500 keys hold a row of 2048, as 2047 does
    assert rows(1500)["naive_softmax"] == rows(2047)["naive_softmax"] != rows(
        1000)["naive_softmax"]
    assert rows(1500)["naive_softmax"] != rows(2048)["naive_softmax"]
    assert rows(1000, dtype="fp16")["naive_qk"]["dtype"] == "fp16"
    both = _simulate(capsys, "--pass", "fwd+bwd", "--mode", "aggregated", schedule="naive",
                     seq=1000, **{"block-m": 64, "block-n": 64})
    assert {k["resources"] for k in both["kernels"]} == {"table"}
    registers = {k["name"]: k["registers_per_thread"] for k in both["kernels"]}
    assert registers == {name: row["registers"] for name, row in rows(1000).items()}


def test_launches_and_gpus_the_table_does_not_cover_are_estimated(capsys):
    """A group of 16 and queries off the multiples of 16 with keys on them change the
    compile; sm_80 is another compile; fp8 has no compile in the table and none stands in
    for it."""
    for launch in ({"heads": 32, "kv-heads": 2}, {"seq": 1000, "kv-seq": 1024}):
        other = _simulate(capsys, **launch)
        assert [k["resources"] for k in other["kernels"]] == ["estimated"], launch
    gqa = _simulate(capsys, "--pass", "fwd+bwd", "--mode", "aggregated", heads=32,
                    **{"kv-heads": 8})
    assert {k["name"]: k["resources"] for k in gqa["kernels"]} == {
        "fa2_fwd": "table", "fa2_bwd_preprocess": "table",  # it takes no head count
        "fa2_bwd_dq": "table", "fa2_bwd_dkdv": "table"}
    code, out, err = _cli(["simulate", "--hardware", "rtx-4090", "--json", "--seq",
                           "1024", "--heads", "16"], capsys)
    assert code == 0, err
    assert [k["resources"] for k in json.loads(out)["kernels"]] == ["estimated"]  # sm_89
    fp8 = _simulate(capsys, "--pass", "fwd+bwd", "--mode", "aggregated", "--dtype", "fp8",
                    **{"head-dim": 64})
    assert {k["resources"] for k in fp8["kernels"]} == {"estimated"}


def test_fp16_compiles_as_bf16_wherever_the_table_has_both():
    """The evidence ``table.STAND_IN`` rests on, in the shipped tables: FA2's forward and
    naive attention's matmul kernels, at every tiling, head dim and mask, have the same
    facts in fp16 as in bf16 but for the dtype (naive softmax and FA1 do not: they stay
    apart, ``test_fa1_takes_the_table_as_fa2_does``); on sm_80, whose FA2 forward is
    compiled in bf16 alone, naive attention's matmuls."""
    compared = {}
    for arch, variants in table.VARIANTS_OF.items():
        compared[arch] = 0
        for variant in variants:
            if variant["dtype"] != "fp16" or variant["kernel"] in ("naive_softmax",
                                                                   "fa1_fwd"):
                continue
            shape = table.variant_shape(variant)
            for tiling in table.sweep_space():
                rows = [table.lookup(resources.job_key(variant["kernel"], arch, dtype,
                                                       variant["head_dim"], tiling, **shape))
                        for dtype in ("fp16", "bf16")]
                assert rows[0] is not None and rows[1] is not None
                assert dict(rows[0], dtype="bf16") == rows[1], (arch, variant, tiling)
                compared[arch] += 1
    # sm_90: FA2's forward, d x causal; naive QK, PV: kernel x d; each at lengths on and
    # off the multiples of 16. sm_80: naive QK, PV, at lengths on and off them
    assert compared == {90: 250 * (4 + 4 + 4 + 4), 80: 250 * (4 + 4)}


def test_fp16_backward_takes_its_bf16_compile(capsys):
    """The backward's kernels are in the table in bf16 only; an fp16 call takes those rows
    (the forward's fp16 row is its own), as a simulation's resources show."""
    both = _simulate(capsys, "--pass", "fwd+bwd", "--mode", "aggregated", "--dtype", "fp16",
                     **{"head-dim": 64})
    assert {k["name"]: k["resources"] for k in both["kernels"]} == {
        "fa2_fwd": "table", "fa2_bwd_preprocess": "table", "fa2_bwd_dq": "table",
        "fa2_bwd_dkdv": "table"}
    tiling = Tiling(block_m=128, block_n=64, num_stages=2, num_warps=4)
    problem = AttentionProblem(batch=1, heads=16, seq_q=1024, head_dim=64, dtype="fp16",
                               pass_="fwd+bwd")
    rows = table.problem_rows(problem, tiling, ["fa2_fwd", "fa2_bwd_dkdv"])
    assert rows["fa2_fwd"]["dtype"] == "fp16" and rows["fa2_bwd_dkdv"]["dtype"] == "bf16"
    registers = {k["name"]: k["registers_per_thread"] for k in both["kernels"]}
    assert registers["fa2_bwd_dkdv"] == rows["fa2_bwd_dkdv"]["registers"]


def test_the_a100_takes_the_sm80_table(capsys):
    """sm_80 compiles otherwise than sm_90 (mma.sync, not wgmma; 164 KB of shared memory):
    the A100 presets take the sm_80 table's own rows, which differ from sm_90's in most
    jobs; at d = 64 with 128 x 256 tiles and 4 warps ptxas keeps 32 registers and spills
    the rest, every iteration, which the estimate cannot see. GQA takes its own rows there
    as on sm_90, and so do FA2's forward at lengths off the multiples of 16 (both, or the
    keys' alone), its backward at lengths off them (with GQA too), FA1, FA2's forward at
    d = 256, and naive attention (on and off them). What the sm_80 table lacks (FA2's backward at
    d = 256) stays estimated there."""
    def row(arch, tiling, kernel="fa2_fwd", head_dim=128, causal=False, group=1, seq=4096,
            kv_seq=None, dtype="bf16"):
        launch = dict(table.LAUNCH, causal=causal, group=group, seq_q=seq,
                      seq_kv=seq if kv_seq is None else kv_seq)
        return table.lookup(resources.job_key(kernel, arch, dtype, head_dim, tiling, **launch))

    tilings = table.sweep_space()
    differ = [t for t in tilings if dict(row(80, t), arch=90) != row(90, t)]
    assert len(differ) > len(tilings) // 2

    def a100(*extra, seq=2048, **flags):
        argv = ["simulate", "--hardware", "a100-sxm4-80gb", "--json", "--batch", "1",
                "--heads", "16", "--seq", str(seq), *extra]
        for name, value in flags.items():
            argv += [f"--{name}", str(value)]
        code, out, err = _cli(argv, capsys)
        assert code == 0, err
        return json.loads(out)

    def tiling_flags(tiling):
        return {"block-m": tiling.block_m, "block-n": tiling.block_n,
                "stages": tiling.num_stages, "warps": tiling.num_warps}

    both = a100("--pass", "fwd+bwd", "--mode", "aggregated", "--causal",
                **{"head-dim": 128, "block-m": 64, "block-n": 64, "stages": 3})
    assert {k["resources"] for k in both["kernels"]} == {"table"}
    registers = {k["name"]: k["registers_per_thread"] for k in both["kernels"]}
    assert registers == {name: row(80, Tiling(64, 64, 3, 4), name, causal=True)["registers"]
                         for name in registers}
    # GQA (K/V heads shared by 4 query heads) takes the group-4 rows, not group 1's
    gqa = a100("--pass", "fwd+bwd", "--mode", "aggregated", "--causal",
               **{"kv-heads": 4, "head-dim": 128, "block-m": 32, "block-n": 32, "stages": 3,
                  "warps": 8})
    assert {k["resources"] for k in gqa["kernels"]} == {"table"}
    taken = {k["name"]: k["registers_per_thread"] for k in gqa["kernels"]}
    for name in ("fa2_fwd", "fa2_bwd_dq", "fa2_bwd_dkdv"):
        grouped, single = (row(80, Tiling(32, 32, 3, 8), name, causal=True, group=group)
                           for group in (table.GQA_GROUP, 1))
        assert taken[name] == grouped["registers"] != single["registers"], name
    # a prompt as it comes (lengths off the multiples of 16), and a chunk of it after a
    # cached prefix (the keys' length alone off them), with GQA too, take the rows at
    # such lengths: a tiling whose registers differ from those at 4096
    for (seq, kv_seq), group in itertools.product(((3000, None), (512, 3000)),
                                                  (1, table.GQA_GROUP)):
        own = functools.partial(row, 80, causal=True, group=group,
                                seq=1000 if kv_seq is None else 512,
                                kv_seq=None if kv_seq is None else 1000)
        tiling = next(t for t in tilings if t.block_m <= 64 and t.block_n <= 64
                      and own(t)["error"] is None
                      and own(t)["registers"] != row(80, t, causal=True,
                                                     group=group)["registers"])
        off = a100("--causal", seq=seq, **{"kv-heads": 16 // group, "head-dim": 128},
                   **tiling_flags(tiling), **({} if kv_seq is None else {"kv-seq": kv_seq}))
        (k,) = off["kernels"]
        assert k["resources"] == "table", (seq, kv_seq, group)
        assert k["registers_per_thread"] == own(tiling)["registers"], (seq, kv_seq, group)
    # training on samples as they come (lengths off the multiples of 16), with GQA too:
    # the backward's kernels take their rows at such lengths, at a tiling whose dK/dV
    # registers differ from those at 4096
    for group in (1, table.GQA_GROUP):
        own = functools.partial(row, 80, causal=True, seq=1000, group=group)
        tiling = next(t for t in tilings if t.block_m <= 64 and t.block_n <= 64
                      and all(own(t, name)["error"] is None for name in
                              ("fa2_fwd", *table.FA2_BACKWARD))
                      and own(t, "fa2_bwd_dkdv")["registers"]
                      != row(80, t, "fa2_bwd_dkdv", causal=True, group=group)["registers"])
        trained = a100("--pass", "fwd+bwd", "--mode", "aggregated", "--causal", seq=3000,
                       **{"head-dim": 128, "kv-heads": 16 // group}, **tiling_flags(tiling))
        assert {k["resources"] for k in trained["kernels"]} == {"table"}, group
        assert {k["name"]: k["registers_per_thread"] for k in trained["kernels"]} == {
            name: own(tiling, name)["registers"]
            for name in ("fa2_fwd", *table.FA2_BACKWARD)}, group
    # FA1's forward, in bf16 and in fp16, which compiles otherwise (its own rows)
    for dtype in ("bf16", "fp16"):
        fa1 = a100("--dtype", dtype, schedule="fa1",
                   **{"head-dim": 64, "block-m": 64, "block-n": 64})
        (k,) = fa1["kernels"]
        own = row(80, Tiling(64, 64, 2, 4), "fa1_fwd", head_dim=64, dtype=dtype)
        assert k["resources"] == "table" and own["dtype"] == dtype
        assert k["registers_per_thread"] == own["registers"]
    # Gemma's d = 256: the forward takes its rows (the backward stays estimated)
    gemma = a100("--causal", "--pass", "fwd+bwd", "--mode", "aggregated",
                 **{"head-dim": 256, "block-m": 64, "block-n": 32, "stages": 1})
    assert {k["name"]: k["resources"] for k in gemma["kernels"]} == {
        "fa2_fwd": "table", "fa2_bwd_preprocess": "estimated", "fa2_bwd_dq": "estimated",
        "fa2_bwd_dkdv": "estimated"}
    assert gemma["kernels"][0]["registers_per_thread"] == row(
        80, Tiling(64, 32, 1, 4), head_dim=256, causal=True)["registers"]
    # with no tile flag, the default tiling: its compile (unlike the estimate's 192 KiB)
    # fits the A100's 163 KiB, so the commands run it, as they would the user's same
    # tiling, and take its row (which keeps 32 registers and spills)
    default = a100("--causal", **{"head-dim": 256})
    t = default["tiling"]
    assert Tiling(t["block_m"], t["block_n"], t["num_stages"], t["num_warps"]) == Tiling()
    (k,) = default["kernels"]
    own = row(80, Tiling(), head_dim=256, causal=True)
    assert own["shared_bytes"] <= 163 * 1024 < 192 * 1024
    assert k["resources"] == "table" and k["registers_per_thread"] == own["registers"]
    assert k["spill_bytes_per_iteration"] == (own["spill_load_bytes_per_iteration"]
                                              + own["spill_store_bytes_per_iteration"]) > 0
    # fp16 takes the bf16 compile there too (``STAND_IN``)
    fp16 = a100("--dtype", "fp16", **{"head-dim": 64, "block-m": 64, "block-n": 64})
    (k,) = fp16["kernels"]
    assert k["resources"] == "table"
    assert k["registers_per_thread"] == row(80, Tiling(64, 64, 2, 4), head_dim=64)["registers"]
    big = {"head-dim": 64, "block-m": 128, "block-n": 256, "stages": 1, "warps": 4}
    shipped, estimated = a100(**big), a100("--estimated-resources", **big)
    (k,), (e,) = shipped["kernels"], estimated["kernels"]
    spilled = row(80, Tiling(128, 256, 1, 4), head_dim=64)
    assert k["registers_per_thread"] == spilled["registers"] < e["registers_per_thread"]
    assert k["spill_bytes_per_iteration"] == (spilled["spill_load_bytes_per_iteration"]
                                              + spilled["spill_store_bytes_per_iteration"]) > 0
    assert e["spill_bytes_per_iteration"] is None
    assert shipped["time_s"] > estimated["time_s"]
    # naive attention, forward and backward: its own sm_80 rows (its softmax the row
    # width's, 2048), which differ from sm_90's; off the multiples of 16 too, its own there
    naive_tiles = {"block-m": 64, "block-n": 64}
    naive = a100("--pass", "fwd+bwd", "--mode", "aggregated", schedule="naive", **naive_tiles)
    names = [k["name"] for k in naive["kernels"]]
    problem = AttentionProblem(batch=1, heads=16, seq_q=2048, head_dim=128, pass_="fwd+bwd")
    own = table.problem_rows(problem, Tiling(64, 64, 2, 4), names, 80)
    assert len(names) == 8 and own.keys() == set(names)
    assert {k["name"]: (k["resources"], k["registers_per_thread"]) for k in naive["kernels"]
            } == {name: ("table", r["registers"]) for name, r in own.items()}
    sm90 = table.problem_rows(problem, Tiling(64, 64, 2, 4), names, 90)
    assert all(dict(own[name], arch=90) != sm90[name] for name in names)
    off = a100("--pass", "fwd+bwd", "--mode", "aggregated", schedule="naive", seq=1000,
               **naive_tiles)
    problem = AttentionProblem(batch=1, heads=16, seq_q=1000, head_dim=128, pass_="fwd+bwd")
    own_off = table.problem_rows(problem, Tiling(64, 64, 2, 4), names, 80)
    assert {k["name"]: (k["resources"], k["registers_per_thread"]) for k in off["kernels"]
            } == {name: ("table", r["registers"]) for name, r in own_off.items()}
    assert own_off["naive_bwd_dk"] != own["naive_bwd_dk"]
    # so `compare` on the A100 predicts both schedules from compiles
    code, out, err = _cli(["compare", "--hardware", "a100-sxm4-80gb", "--json", "--batch", "1",
                           "--heads", "16", "--seq", "2048"], capsys)
    assert code == 0, err
    assert {name: {k["resources"] for k in pred["kernels"]}
            for name, pred in json.loads(out).items() if name in ("naive", "fa2")} == {
        "naive": {"table"}, "fa2": {"table"}}
    code, out, err = _cli(["sweep", "--hardware", "a100-sxm4-80gb", "--seq", "1024",
                           "--head-dim", "64", "--block-m", "64,128", "--block-n", "64",
                           "--stages", "2", "--warps", "4", "--jobs", "1"], capsys)
    assert code == 0, err
    assert "compiles for sm_80" in " ".join(out.split())


def test_a_stale_table_is_not_used(monkeypatch, capsys):
    head = dict(table.header(), sources="0" * 16)
    monkeypatch.setattr(table, "header", lambda arch=90: head)
    assert not table.current()
    assert [k["resources"] for k in _simulate(capsys)["kernels"]] == ["estimated"]


def test_a_sweep_rates_every_tiling_from_the_table(capsys):
    code, out, err = _cli(["sweep", "--hardware", "h200-sxm", "--seq", "1024", "--heads",
                           "16", "--head-dim", "64", "--block-m", "64,128", "--block-n",
                           "64,128", "--stages", "2", "--warps", "4,8", "--jobs", "1",
                           "--json"], capsys)
    assert code == 0, err
    results = json.loads(out)["results"]
    assert results and all(k["resources"] == "table" for r in results for k in r["kernels"])
    for r in results:
        t = Tiling.from_dict(r["tiling"])
        row = table.lookup(resources.job_key("fa2_fwd", 90, "bf16", 64, t,
                                             **dict(table.LAUNCH, causal=False)))
        assert r["kernels"][0]["registers_per_thread"] == row["registers"]


@pytest.mark.parametrize("arch", sorted(table.TABLES))
def test_the_table_file_is_one_header_and_one_row_per_job(arch):
    """Every job of every variant of its architecture once (tilings that compile alike
    are one job: the backward's preprocess has no block_n), nothing else."""
    lines = gzip.decompress(table.TABLES[arch].read_bytes()).decode().splitlines()
    assert json.loads(lines[0])["variants"] == table.VARIANTS_OF[arch]
    rows = [json.loads(line) for line in lines[1:]]
    jobs = {resources.job_key(v["kernel"], arch, v["dtype"], v["head_dim"], t, **shape)
            for v in table.VARIANTS_OF[arch] for shape, t in table.variant_launches(v)}
    assert len(rows) == len({r["key"] for r in rows}) == len(jobs)
    assert {r["key"] for r in rows} == jobs


def test_a_lookup_imports_neither_torch_nor_triton():
    """The table is for machines without the kernels extra: looking it up must not need it."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from simulator.cli.resources_args import table_resources\n"
            "from simulator.hardware import load_hardware\n"
            "from traces.problem import AttentionProblem\n"
            "from traces.tiling import Tiling\n"
            "(found,) = table_resources(AttentionProblem(batch=1, heads=16, seq_q=1024,\n"
            "    head_dim=128), [Tiling()], 'fa2', load_hardware('h200-sxm'))\n"
            "assert found['fa2_fwd'].registers_per_thread == 255\n"
            "assert not {'torch', 'triton'} & set(sys.modules), sorted(sys.modules)\n")
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_damaged_table_is_no_table(monkeypatch, tmp_path, capsys):
    """A truncated file (a broken install) leaves the estimate, not a traceback."""
    damaged = tmp_path / "sm90.jsonl.gz"
    damaged.write_bytes(table.TABLES[90].read_bytes()[:5000])
    monkeypatch.setitem(table.TABLES, 90, damaged)
    assert table.header() == {} and not table.current()
    assert [k["resources"] for k in _simulate(capsys)["kernels"]] == ["estimated"]


def test_a_damaged_row_is_no_row(monkeypatch, tmp_path):
    """Rows are parsed when looked up: one whose result is damaged is not found (the
    estimate stands for that kernel), and the others still are."""
    lines = gzip.decompress(table.TABLES[90].read_bytes()).decode().splitlines()
    broken, kept = json.loads(lines[1])["key"], json.loads(lines[2])["key"]
    lines[1] = lines[1][:-20]  # cut inside its result
    damaged = tmp_path / "sm90.jsonl.gz"
    damaged.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    monkeypatch.setitem(table.TABLES, 90, damaged)
    assert table.current()
    assert table.lookup(broken) is None
    assert table.lookup(kept) == json.loads(lines[2])["result"]
    # a build keeps every row but the damaged one, which it compiles again
    rows = table._all_rows()
    assert broken not in rows and rows[kept] == json.loads(lines[2])["result"]
    assert len(rows) == len(lines) - 2


def test_the_table_command_line_refuses_an_architecture_it_has_no_table_for(capsys):
    with pytest.raises(SystemExit) as stop:
        table.main(["build", "--arch", "70"])
    assert stop.value.code == 2
    assert "invalid choice: 70" in capsys.readouterr().err


def test_check_stand_in_compares_each_stood_in_compile_with_its_row(monkeypatch):
    """``check_stand_in`` with SYNTHETIC compiles (no compiler): it compiles in fp16 only the
    kernels the table lacks in fp16, at 12 heads every kernel that takes the head count,
    compares every fact of each with the row that stands in (the tiling's own fields
    aside), and reports the jobs and the ratios per kernel and launch; a variant whose rows
    the table lacks is counted as such, not as equal."""
    asked = []

    def measure(kernels, archs, dtype, head_dim, tilings, workers=None, **shape):
        (kernel,) = kernels
        asked.append((kernel, dtype, head_dim, shape["causal"], shape["heads"]))
        out = []
        for tiling in tilings:
            row = table.lookup(resources.job_key(kernel, table.ARCH, "bf16", head_dim,
                                                 tiling, **dict(shape, heads=16)))
            if row is None:  # the unbuilt variant below: any compile will do
                row = table.lookup(resources.job_key(kernel, table.ARCH, "bf16", head_dim,
                                                     tiling, **dict(table.LAUNCH,
                                                                    causal=False)))
            if kernel == "fa2_bwd_dkdv" and dtype == "fp16":  # differs from its stand-in
                row = dict(row, registers=row["registers"] // 2)
            out.append(resources.KernelResources.of_job(dict(row, dtype=dtype), tiling,
                                                        head_dim))
        return out

    monkeypatch.setattr(resources, "measure", measure)
    unbuilt = {"kernel": "fa2_bwd_dq", "head_dim": 64, "dtype": "bf16", "causal": False,
               "group": 16}  # a group of 16: another compile, not in the table
    monkeypatch.setitem(table.VARIANTS_OF, 90, [*table.VARIANTS, unbuilt])
    report = table_check.check_stand_in(samples=3)
    assert set(report) == {"fp16", "heads 12"}
    fp16, heads12 = report["fp16"], report["heads 12"]
    assert {(k, dtype) for k, dtype, *_ in asked if dtype == "fp16"} == {
        (k, "fp16") for k in ("fa2_bwd_preprocess", "fa2_bwd_dq", "fa2_bwd_dkdv",
                              "naive_bwd_dv", "naive_bwd_dp", "naive_bwd_ds",
                              "naive_bwd_dq", "naive_bwd_dk",
                              "fa2_fwd",  # none the table has in fp16 (GQA's forward)
                              "decode_split", "decode_reduce")}
    # per kernel and launch, each over d x causal: FA2's forward in fp16 with GQA, with
    # keys alone off the multiples of 16, and at d = 256 (those the table holds in bf16
    # alone; d = 256, its one head dim, labelled as such)
    assert {k for k in fp16 if k.startswith("fa2_fwd")} == {
        "fa2_fwd d 256", "fa2_fwd group 4", "fa2_fwd group 4 seq 1000",
        "fa2_fwd kv_seq 1000", "fa2_fwd group 4 kv_seq 1000", "fa2_fwd group 4 d 256"}
    assert fp16["fa2_fwd d 256"]["jobs"] == fp16["fa2_fwd group 4 d 256"]["jobs"] == 3 * 2
    assert fp16["fa2_fwd group 4"]["jobs"] == 3 * 4
    for launch in (" group 4 seq 1000", " kv_seq 1000", " group 4 kv_seq 1000"):
        assert fp16["fa2_fwd" + launch]["jobs"] == 3 * 4
    assert heads12["fa1_fwd"] == {"jobs": 3 * 4, "differ": {}} and "fa1_fwd" not in fp16
    for launch, jobs in (("", 4), (" group 4", 4), (" seq 1000", 4), (" group 4 seq 1000", 4),
                         (" d 256", 2), (" group 4 d 256", 2)):
        assert heads12["fa2_fwd" + launch]["jobs"] == 3 * jobs
    for launch in ("", " group 4", " seq 1000", " group 4 seq 1000"):
        assert fp16["fa2_bwd_dq" + launch] == {"jobs": 3 * 4, "differ": {}}
        assert heads12["fa2_bwd_dkdv" + launch] == {"jobs": 3 * 4, "differ": {}}
        halved = fp16["fa2_bwd_dkdv" + launch]["differ"]
        assert list(halved) == ["registers"] and halved["registers"]["jobs"] == 3 * 4
        lo, hi = halved["registers"]["ratio"]
        assert 0.49 <= lo <= hi <= 0.5
    assert {k for k, dtype, _, _, heads in asked if heads == 12} == {
        "fa1_fwd", "fa2_fwd", "fa2_bwd_dq", "fa2_bwd_dkdv", "naive_qk", "naive_pv",
        "naive_bwd_dv", "naive_bwd_dp", "naive_bwd_dq",
        "naive_bwd_dk", "decode_reduce"}  # those that take the head count
    # decode, per class of its integers, over d x causal; its split takes no head count
    split = "decode_split group 4 seq_q 1 keys off 16 split on 16 chunk off 16"
    assert fp16[split] == {"jobs": 3 * 4, "differ": {}} and split not in heads12
    reduce = "decode_reduce group 1 seq_q 1 keys on 16 split off 16 chunk 1"
    assert fp16[reduce] == heads12[reduce] == {"jobs": 3 * 4, "differ": {}}
    assert sum(1 for k in fp16 if k.startswith("decode_split")) == 2 * 2 * 3 * 3
    assert fp16["naive_bwd_dv"] == fp16["naive_bwd_dv seq 1000"] == {"jobs": 3 * 2,
                                                                     "differ": {}}
    assert heads12["naive_qk seq 1000"] == {"jobs": 3 * 2, "differ": {}}  # d, bf16
    assert fp16["fa2_bwd_dq group 16"] == {"jobs": 0, "differ": {}, "no_row": 3}
    assert heads12["fa2_bwd_dq group 16"] == {"jobs": 0, "differ": {}, "no_row": 3}


def test_lengths_off_the_multiples_of_16_take_their_own_rows(capsys):
    """Triton specializes a length on its divisibility by 16: FA2 at N = 1000 compiles
    otherwise than at 1024 (its own rows, ``OFF_16_SEQ``), and that compile serves every
    length off the multiples (4095 takes the same rows), forward and backward."""
    tiling = Tiling(block_m=128, block_n=64, num_stages=2, num_warps=4)
    names = ["fa2_fwd", "fa2_bwd_preprocess", "fa2_bwd_dq", "fa2_bwd_dkdv"]

    def rows(seq, **extra):
        problem = AttentionProblem(batch=1, heads=16, seq_q=seq, head_dim=128,
                                   pass_="fwd+bwd", **extra)
        return table.problem_rows(problem, tiling, names)

    assert rows(1000).keys() == set(names)
    assert rows(1000) == rows(4095)
    assert rows(1000)["fa2_fwd"] != rows(1024)["fa2_fwd"]
    assert rows(1000, dtype="fp16")["fa2_fwd"]["dtype"] == "fp16"
    both = _simulate(capsys, "--pass", "fwd+bwd", "--mode", "aggregated", seq=1000)
    assert {k["resources"] for k in both["kernels"]} == {"table"}
    registers = {k["name"]: k["registers_per_thread"] for k in both["kernels"]}
    assert registers == {name: row["registers"] for name, row in rows(1000).items()}
    # with GQA: its forward, dQ and dK/dV have rows of their own there, other than those
    # of GQA at 1024 and of one query head per K/V head at 1000 (the preprocess takes
    # no head count: its row is the one above)
    gqa = AttentionProblem(batch=1, heads=32, kv_heads=8, seq_q=1000, head_dim=128,
                           pass_="fwd+bwd")
    own = table.problem_rows(gqa, tiling, names)
    assert own.keys() == set(names)
    assert own["fa2_bwd_preprocess"] == rows(1000)["fa2_bwd_preprocess"]
    at_1024 = table.problem_rows(dataclasses.replace(gqa, seq_q=1024, seq_kv=1024), tiling,
                                 names)
    for name in ("fa2_fwd", "fa2_bwd_dq", "fa2_bwd_dkdv"):
        assert own[name] != at_1024[name] and own[name] != rows(1000)[name], name
    assert own == table.problem_rows(dataclasses.replace(gqa, seq_q=4095, seq_kv=4095),
                                     tiling, names)
    sources = _simulate(capsys, "--pass", "fwd+bwd", "--mode", "aggregated", seq=1000,
                        heads=32, **{"kv-heads": 8})["kernels"]
    assert {k["resources"] for k in sources} == {"table"}
    registers = {k["name"]: k["registers_per_thread"] for k in sources}
    assert registers == {name: row["registers"] for name, row in own.items()}


def test_keys_off_the_multiples_of_16_after_queries_on_them_take_their_own_rows(capsys):
    """A chunk of queries (a multiple of 16) after a cached prefix of any length, causal,
    and cross-attention from a decoder's positions (448 in Whisper) to an encoder's
    output (1500 frames), not: the keys' length alone is off the multiples, which FA2's
    forward compiles otherwise than where both or neither are; one compile serves every
    such pair, with and without GQA. The backward there, and the reverse (queries off the
    multiples, keys on them: ``test_launches_and_gpus_the_table_does_not_cover_are_estimated``)
    stay estimated."""
    tiling = Tiling(block_m=64, block_n=64, num_stages=3, num_warps=4)

    def row(seq_q, seq_kv, heads=16, kv_heads=16, causal=True):
        problem = AttentionProblem(batch=1, heads=heads, kv_heads=kv_heads, seq_q=seq_q,
                                   seq_kv=seq_kv, head_dim=128, causal=causal)
        return table.problem_rows(problem, tiling, ["fa2_fwd"]).get("fa2_fwd")

    for (heads, kv_heads), causal in itertools.product(((16, 16), (32, 8)), (True, False)):
        chunk = row(512, 1000, heads, kv_heads, causal)
        assert chunk is not None and chunk == row(2048, 4095, heads, kv_heads, causal)
        assert chunk != row(1000, 1000, heads, kv_heads, causal)
        assert chunk != row(512, 1024, heads, kv_heads, causal)
    assert row(512, 1000) != row(512, 1000, 32, 8)
    assert row(448, 1500, causal=False) != row(448, 1500)
    sources = _simulate(capsys, "--causal", seq=512, heads=32,
                        **{"kv-seq": 1000, "kv-heads": 8, "block-m": 64, "stages": 3})
    (kernel,) = sources["kernels"]
    assert kernel["resources"] == "table"
    assert kernel["registers_per_thread"] == row(512, 1000, 32, 8)["registers"]
    cross = _simulate(capsys, "--pass", "fwd+bwd", "--mode", "aggregated", seq=448,
                      heads=20, **{"kv-seq": 1500, "block-m": 64, "stages": 3})
    assert {k["name"]: k["resources"] for k in cross["kernels"]} == {
        "fa2_fwd": "table", "fa2_bwd_preprocess": "table",  # it knows the queries alone
        "fa2_bwd_dq": "estimated", "fa2_bwd_dkdv": "estimated"}
    assert cross["kernels"][0]["registers_per_thread"] == row(448, 1500,
                                                              causal=False)["registers"]


def test_query_heads_off_the_multiples_of_16_take_the_16_head_rows(capsys):
    """``HEADS_STAND_IN``: 12 and 40 query heads take the table's 16-head rows; one head (a
    constexpr) compiles otherwise and stays estimated; GQA (a group of query heads per K/V
    head) compiles otherwise and has rows of its own."""
    tiling = Tiling(block_m=128, block_n=64, num_stages=2, num_warps=4)

    def rows(heads, kv_heads):
        problem = AttentionProblem(batch=1, heads=heads, kv_heads=kv_heads, seq_q=1024,
                                   head_dim=128, pass_="fwd+bwd")
        return table.problem_rows(problem, tiling, ["fa2_fwd", "fa2_bwd_dq", "fa2_bwd_dkdv"])

    assert rows(12, 12) == rows(40, 40) == rows(16, 16) and len(rows(16, 16)) == 3
    assert rows(1, 1) == {}
    # GQA: rows of its own (any group but 1 and the multiples of 16)
    assert rows(32, 8).keys() == {"fa2_fwd", "fa2_bwd_dq", "fa2_bwd_dkdv"}
    assert rows(32, 8) == rows(20, 5) == rows(24, 12)
    assert rows(32, 8) != rows(32, 32)
    sources = {k["name"]: k["resources"] for k in _simulate(capsys, heads=12)["kernels"]}
    assert sources == {"fa2_fwd": "table"}
