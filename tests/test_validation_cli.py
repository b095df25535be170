"""`tilesim validate` on a machine without a GPU, the matrices, and the device script."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import simulator.cli as cli
from simulator.hardware import load_hardware
from traces.problem import AttentionProblem, ProblemError
from traces.tiling import Tiling
from validation import campaign, matrix
from validation import estimate as est
from validation.choose import NEAR_TIE, TILINGS_PER_SHAPE, choose, role_of
from validation.estimate import estimate
from validation.groups import PROBE, PROBE_DECODE, PROBE_FA2, groups_for, naive_fits
from validation.plan_compiles import compile_check_configs
from validation.plan_file import PLAN_DIR, load_plan, plan_hash

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "validation" / "run_device.sh"


def run_cli(argv, monkeypatch):
    monkeypatch.setattr(cli, "COMMANDS", ["validate", "reconcile", "calibrate"])
    return cli.main(argv)


def _no_gpu():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")


def test_validate_without_gpu_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    _no_gpu()
    assert run_cli(["validate", "--matrix", "quick", "--out", str(tmp_path / "r.jsonl")],
                   monkeypatch) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tilesim: error:")
    assert "CUDA GPU" in lines[0] and "--dry-run" in lines[0]
    assert captured.out == ""
    assert not (tmp_path / "r.jsonl").exists()


def test_validate_needs_out_and_known_matrix(monkeypatch, capsys):
    assert run_cli(["validate"], monkeypatch) == 2
    assert run_cli(["validate", "--matrix", "huge", "--dry-run"], monkeypatch) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--out" in err[0] and "unknown matrix" in err[1]


def test_dry_run_prints_plan_and_estimate(monkeypatch, capsys):
    assert run_cli(["validate", "--matrix", "quick", "--dry-run", "--json"], monkeypatch) == 0
    out = json.loads(capsys.readouterr().out)
    plan, est = out["plan"], out["estimate"]
    assert plan["schema"] == "tilesim.plan/1" and plan["name"] == "quick"
    assert est["total_s"] > 0 and set(est["phases"]) >= {"compile", "timing", "ncu"}
    assert est["assumptions"]["workers"] == 15  # the GPU machine's, not this one's
    assert run_cli(["validate", "--matrix", "quick", "--dry-run"], monkeypatch) == 0
    text = capsys.readouterr().out
    assert "time estimate" in text and "fits" in text


def test_choose_keeps_the_best_its_runner_up_and_spreads_the_rest():
    # rows = lengths, columns = candidates
    table = [[1.0, 1.01, 1.05, 2.0, 3.0, 4.0, 8.0],
             [2.0, 2.02, 2.1, 4.0, 6.0, 8.0, 16.0]]
    chosen, gap = choose(table, k=4)
    # 1 is within 1% of the best (not "different"); 2 is the next best, 5% apart: a close
    # call, so 1 is not measured as a near tie either.
    assert chosen[:2] == [0, 2] and 1 not in chosen
    # The other two span the range: {1, 3, 8} has the widest smallest gap with the best
    # (2x and 2.67x) of all pairs from {2, 3, 4, 8}.
    assert chosen[2:] == [4, 6]
    assert gap == pytest.approx(0.05)
    with pytest.raises(ValueError):
        choose([[1.0, 2.0]], k=4)


def test_choose_adds_a_near_tie_when_the_runner_up_is_far():
    # 1 and 2 are within 2% of the best at the second length; the first candidate rated
    # apart at every length, 3, is 30% slower: no close call. The best-rated of those it
    # passed over (1, geometric mean 1.005 against 2's 1.015) is measured too, last, and
    # does not count in the chosen set's gap.
    table = [[1.0, 1.0, 1.03, 1.3, 2.0, 3.0, 4.0],
             [1.0, 1.01, 1.0, 1.3, 2.0, 3.0, 4.0]]
    chosen, gap = choose(table, k=4)
    # The spread: {2, 4} (indices 4, 6) keep every gap >= 30% and the widest with the best.
    assert chosen == [0, 3, 4, 6, 1]
    assert [role_of(j) for j in range(5)] == [
        "best", "runner-up", "spread", "spread", NEAR_TIE]
    assert gap == pytest.approx(0.3)
    # Runner-up 9% slower: a close call; nothing is added.
    close = [[1.0, 1.0, 1.09, 2.0, 3.0, 4.0], [1.0, 1.01, 1.09, 2.0, 3.0, 4.0]]
    assert len(choose(close, k=4)[0]) == 4


def test_choose_falls_back_to_the_second_best_when_nothing_is_apart():
    # At the first length every candidate is within 2% of the best.
    table = [[1.0, 1.005, 1.01, 1.015], [1.0, 1.5, 2.0, 3.0]]
    chosen, gap = choose(table, k=4)
    assert chosen == [0, 1, 2, 3] and gap == pytest.approx((1.015 - 1.01) / 1.01)


def test_choose_ranks_by_geometric_mean_over_lengths():
    # Candidate 1 wins at the first length, candidate 0 over both (1 x 2 < 0.9 x 4).
    table = [[1.0, 0.9, 5.0, 20.0, 40.0], [2.0, 4.0, 10.0, 40.0, 80.0]]
    chosen, _ = choose(table, k=4)
    assert chosen[:2] == [0, 1]


def _roofline_predictor(problem, tiling, schedule, hw, compiled=None, l2_start="cold"):
    """A fast stand-in for the simulator (this test checks the plan's structure, not the
    model): the count prediction timed by its roofline bound, global bytes as DRAM bytes."""
    from simulator.prediction import count_prediction

    pred = count_prediction(problem, tiling, schedule, hw)
    traffic = pred["bytes"]["global_read"] + pred["bytes"]["global_write"]
    pred["time_s"] = max(traffic / hw.hbm_effective_bytes_per_s,
                         pred["flops"]["tensor"] / hw.tensor_rate(problem.dtype))
    pred["bytes"]["dram_read"] = pred["bytes"]["global_read"]
    pred["bytes"]["dram_write"] = pred["bytes"]["global_write"]
    return pred


def _group_label(cfg: dict) -> str:
    p = cfg["problem"]
    return f"{cfg['schedule']} {p['pass']} d={p['head_dim']}{' causal' if p['causal'] else ''}"


def test_quick_plan_is_sound():
    hw = load_hardware("h200-sxm")
    plan = matrix.build_plan("quick", hw, _roofline_predictor, "roofline stand-in")
    assert plan["sha256"] == plan_hash(plan)
    by_shape: dict[str, list] = {}
    for cfg in plan["configs"]:
        by_shape.setdefault(cfg["shape"], []).append(cfg)
        p = AttentionProblem.from_dict(cfg["problem"])
        assert p.dtype == "bf16"
        assert cfg["kernels"] == matrix.kernel_names(
            cfg["schedule"], p, Tiling.from_dict(cfg["tiling"]))
    for cfgs in by_shape.values():
        assert len(cfgs) >= TILINGS_PER_SHAPE
        assert len({json.dumps(c["tiling"], sort_keys=True) for c in cfgs}) == len(cfgs)
    schedules = {(c["schedule"], c["problem"]["pass"]) for c in plan["configs"]}
    assert schedules == {("fa2", "fwd"), ("fa2", "bwd"), ("naive", "fwd"), ("decode", "fwd")}
    assert {p["implementation"] for p in plan["peers"]} == {"sdpa_math", "sdpa_flash"}
    # Every legal candidate's ratings are kept; the chosen ones are the configs' ratings.
    rated = {g["group"]: g for g in plan["candidate_ratings"]}
    assert len(rated) == len(groups_for("quick"))
    for cfg in plan["configs"]:
        p = cfg["problem"]
        group = rated[_group_label(cfg)]
        i = group["tilings"].index(cfg["tiling"])
        assert i in group["chosen"]
        assert cfg["rating"] == group["ratings"][i][group["seqs"].index(p["seq_kv"])]
    for g in rated.values():
        assert all(len(r) == len(g["seqs"]) for r in g["ratings"])
        assert len(g["tilings"]) >= TILINGS_PER_SHAPE
    e = estimate(plan, 10, 40, 15)
    assert e["counts"]["configs"] == len(plan["configs"])
    assert e["counts"]["profiled_launches"] + e["counts"]["near_tie_launches"] == sum(
        len(c["kernels"]) for c in plan["configs"])


def test_near_ties_are_profiled_if_time_is_left():
    """A near tie's ncu cost is not in the total that must fit: the same plan without its
    near ties has the same phases but for timing and compile."""
    plan = load_plan("default")
    ties = [c for c in plan["configs"] if c["role"] == NEAR_TIE]
    assert ties, "the frozen default plan has near ties (7 groups' runner-ups are far)"
    without = dict(plan, configs=[c for c in plan["configs"] if c["role"] != NEAR_TIE])
    e, e0 = estimate(plan, 10, 40, 15), estimate(without, 10, 40, 15)
    keys = {c["compile_key"] for c in plan["configs"]}
    keys0 = {c["compile_key"] for c in without["configs"]}
    # ncu differs only by the extra compiled kernels' cache loads in the profiled process.
    assert e["phases"]["ncu"] - e0["phases"]["ncu"] == pytest.approx(
        est.CACHE_LOAD_S * (len(keys) - len(keys0)))
    assert e["optional"]["ncu_near_ties"] == pytest.approx(
        sum(len(c["kernels"]) * est.NCU_LAUNCH_S + est.NCU_PASSES * c["est_time_s"] + 0.02
            for c in ties))
    assert e0["optional"]["ncu_near_ties"] == 0 and e["counts"]["near_ties"] == len(ties)


def _same_plan(a: dict, b: dict) -> bool:
    keys = ("configs", "peers", "candidate_ratings", "notes", "selected_by", "sha256")
    return all(a[k] == b[k] for k in keys)


def test_reselect_from_kept_ratings_needs_no_model():
    hw = load_hardware("h200-sxm")
    plan = matrix.build_plan("quick", hw, _roofline_predictor, "roofline stand-in")
    # The same rule on the kept ratings gives the same plan.
    assert _same_plan(matrix.reselect_plan(plan, hw), plan)
    # Make the slowest-rated tiling of one group the fastest at every length: it must come
    # first, with its kept time as the config's expected time.
    edited = json.loads(json.dumps(plan))
    group = edited["candidate_ratings"][0]
    slow = max(range(len(group["tilings"])), key=lambda i: group["ratings"][i][0])
    group["ratings"][slow] = [0.5 * min(r[j] for r in group["ratings"])
                              for j in range(len(group["seqs"]))]
    again = matrix.reselect_plan(edited, hw)
    assert again["candidate_ratings"][0]["chosen"][0] == slow
    assert again["sha256"] == plan_hash(again) != plan["sha256"]
    picked = [c for c in again["configs"] if c["tiling"] == group["tilings"][slow]
              and _group_label(c) == group["group"]]
    assert len(picked) == len(group["seqs"])
    for cfg in picked:
        at = group["seqs"].index(cfg["problem"]["seq_kv"])
        assert cfg["rating"] == group["ratings"][slow][at]
        assert cfg["est_time_s"] == group["times"][slow][at]
    # What a plan must keep for it, and groups that are not the matrix's any more.
    no_times = json.loads(json.dumps(plan))
    del no_times["candidate_ratings"][0]["times"]
    with pytest.raises(ProblemError, match="expected times"):
        matrix.reselect_plan(no_times, hw)
    with pytest.raises(ProblemError, match="no candidate ratings"):
        matrix.reselect_plan({k: v for k, v in plan.items() if k != "candidate_ratings"}, hw)
    moved = json.loads(json.dumps(plan))
    moved["candidate_ratings"][0]["seqs"] = [123]
    with pytest.raises(ProblemError, match="not the matrix's"):
        matrix.reselect_plan(moved, hw)


def _split_penalty_predictor(problem, tiling, schedule, hw, compiled=None, l2_start="cold"):
    """The stand-in, with decode's time growing with the split count: a model change that
    moves only decode's ratings."""
    pred = _roofline_predictor(problem, tiling, schedule, hw)
    if schedule == "decode":
        pred["time_s"] *= 1 + 0.1 * tiling.split_kv
    return pred


def test_rerate_rates_only_the_named_schedules_again():
    hw = load_hardware("h200-sxm")
    plan = matrix.build_plan("quick", hw, _roofline_predictor, "simulator")
    again = matrix.rerate_plan(plan, hw, {"decode"}, _split_penalty_predictor, "simulator")
    fresh = matrix.build_plan("quick", hw, _split_penalty_predictor, "simulator")
    for old, new, want in zip(plan["candidate_ratings"], again["candidate_ratings"],
                              fresh["candidate_ratings"], strict=True):
        expected = want if old["group"].startswith("decode") else old
        for key in ("tilings", "ratings", "times", "chosen"):
            assert new[key] == expected[key], (old["group"], key)
    # Decode's ratings did move, and the configs are those of a plan rated from scratch.
    decode = [g for g in plan["candidate_ratings"] if g["group"].startswith("decode")]
    assert decode and all(g["ratings"] != w["ratings"] for g, w in zip(
        decode, [g for g in fresh["candidate_ratings"] if g["group"].startswith("decode")],
        strict=True))
    assert again["configs"] == fresh["configs"] and again["peers"] == fresh["peers"]
    # When each group was rated: rerate stamps the groups it rates, reselect keeps stamps.
    for group in plan["candidate_ratings"]:
        group["rated_utc"] = "2000-01-01T00:00:00Z"
    again = matrix.rerate_plan(plan, hw, {"decode"}, _split_penalty_predictor, "simulator")
    stamps = {g["group"]: g["rated_utc"] for g in again["candidate_ratings"]}
    assert all((stamp == "2000-01-01T00:00:00Z") != label.startswith("decode")
               for label, stamp in stamps.items())
    kept = matrix.reselect_plan(again, hw)["candidate_ratings"]
    assert {g["group"]: g["rated_utc"] for g in kept} == stamps
    with pytest.raises(ProblemError, match="rated by simulator"):
        matrix.rerate_plan(plan, hw, {"decode"}, _roofline_predictor, "counts")
    with pytest.raises(ProblemError, match="no groups of schedule fa1"):
        matrix.rerate_plan(plan, hw, {"fa1"}, _roofline_predictor, "simulator")
    assert matrix.main(["rerate", "quick"]) == 2  # rerate without --schedule


def test_reselect_the_frozen_quick_plan():
    """The simulator's ratings are its predicted times: a frozen plan without kept times
    can still be chosen again, and the result follows ``choose`` on its ratings."""
    frozen = load_plan("quick")
    if "candidate_ratings" not in frozen:
        pytest.skip("the frozen quick plan keeps no candidate ratings")
    plan = matrix.reselect_plan(frozen, load_hardware(frozen["hardware"]))
    for group in plan["candidate_ratings"]:
        chosen, _ = choose([list(r) for r in zip(*group["ratings"], strict=True)])
        assert group["chosen"] == chosen
        assert group["times"] == group["ratings"]
    assert plan["sha256"] == plan_hash(plan)
    assert sum(len(g["chosen"]) * len(g["seqs"]) for g in plan["candidate_ratings"]) == len(
        plan["configs"])


def test_matrix_tool_errors_are_one_line(capsys):
    assert matrix.main(["reselect", "/nonexistent/plan.json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot read plan")


def test_default_matrix_groups_and_naive_memory_rule():
    groups = groups_for("default")
    labels = {(g.schedule, g.pass_) for g in groups}
    assert labels == {("fa2", "fwd"), ("fa2", "bwd"), ("naive", "fwd"), ("decode", "fwd")}
    assert {g.head_dim for g in groups} == {64, 128}
    assert all(g.seqs == (1024, 2048, 4096, 8192, 16384) for g in groups)
    assert {g.causal for g in groups if g.schedule == "fa2"} == {False, True}
    naive_16k = groups[-3].problem(16384)
    hbm = load_hardware("h200-sxm").hbm_bytes
    assert naive_fits(naive_16k, hbm)
    assert not naive_fits(naive_16k, hbm // 10)


def test_frozen_plans_if_present_are_valid():
    for name in ("default", "quick"):
        path = PLAN_DIR / f"{name}.json"
        if not path.exists():
            continue
        plan = load_plan(name)
        assert plan["sha256"] == plan_hash(plan)
        assert all(len(c["kernels"]) >= 1 for c in plan["configs"])
        # Each config's role is its place in its group's chosen list.
        rated = {g["group"]: g for g in plan["candidate_ratings"]}
        for cfg in plan["configs"]:
            group = rated[_group_label(cfg)]
            place = group["chosen"].index(group["tilings"].index(cfg["tiling"]))
            assert cfg["role"] == role_of(place)


def test_ncu_profiles_near_ties_last():
    configs = [{"id": "a", "role": "best"}, {"id": "b", "role": NEAR_TIE},
               {"id": "c", "role": "spread"}, {"id": "d", "role": NEAR_TIE},
               {"id": "e"}]
    assert campaign.profiling_order(configs) == ["a", "c", "e", "b", "d"]


def test_run_device_script_parses_and_rehearses_on_cpu(tmp_path):
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    env = dict(os.environ, OUT=str(tmp_path), DRY_RUN="1", MATRIX="quick")
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "env.txt").read_text().startswith("# date (UTC)")
    log = (tmp_path / "validate.log").read_text()
    assert "time estimate" in log
    assert len(list(tmp_path.iterdir())) <= 8  # the device tool returns at most 8 files


def test_plan_compile_check_names_what_does_not_fit(tmp_path):
    """``python -m validation.matrix compiles``: each compile key once (at its longest K/V),
    compiled for sm_90 with the Triton installed; a tiling whose shared memory exceeds the
    H200's 227 KiB per CTA is a failure line and exit code 1."""
    quick = load_plan("quick")
    fwd = [c for c in quick["configs"]
           if c["compile_key"] == "fa2-fwd-d128-bf16-c0-g1-m32n64-s2-w4"]
    assert {c["problem"]["seq_kv"] for c in fwd} == {2048, 8192}
    checked = compile_check_configs([{"configs": fwd}])
    assert len(checked) == 1 and checked[0]["problem"]["seq_kv"] == 8192
    # 256 x 256 tiles, 4 stages: Q 64 KiB + 4 x (K, V) 512 KiB of shared memory per CTA;
    # only with the JIT's alignment facts does Triton pipeline the loads (without them it
    # single-buffers: 128 KiB, which would pass).
    huge = dict(fwd[0], compile_key="fa2-fwd-huge", tiling=dict(
        fwd[0]["tiling"], block_m=256, block_n=256, num_stages=4, num_warps=8))
    plan = dict(quick, configs=[fwd[0], huge])
    plan["sha256"] = plan_hash(plan)  # frozen as it is (a plan's hash is checked)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    proc = subprocess.run(["python", "-m", "validation.matrix", "compiles", str(path),
                           "--jobs", "1"], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, TRITON_INTERPRET="0"), timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failed = [line for line in proc.stdout.splitlines() if "FAILED" in line]
    assert len(failed) == 1 and "fa2-fwd-huge" in failed[0]
    assert "shared memory" in failed[0]
    assert "1 of 2 compile and fit" in proc.stdout


def test_the_mlp_probe_measures_every_tiling_it_names():
    """A probe chooses nothing: both decode groups keep all of PROBE_DECODE (the same tiles
    at 2, 3 and 4 stages, larger tiles at 2) and FA2's forward and backward all of
    PROBE_FA2 (the same tiles at 2 and 3 stages), as role "probe", rated like the others."""
    hw = load_hardware("h200-sxm")
    groups = groups_for("mlp")
    assert [(g.schedule, g.pass_, g.head_dim, g.seqs) for g in groups] == [
        ("decode", "fwd", 64, (16384,)), ("decode", "fwd", 128, (16384,)),
        ("fa2", "fwd", 64, (4096,)), ("fa2", "bwd", 64, (4096,))]
    plan = matrix.build_plan("mlp", hw, _roofline_predictor, "roofline stand-in")
    assert plan["sha256"] == plan_hash(plan)
    fa2 = len(PROBE_FA2["fwd"]) + len(PROBE_FA2["bwd"])
    assert len(plan["configs"]) == 2 * len(PROBE_DECODE) + fa2
    assert {c["role"] for c in plan["configs"]} == {PROBE}

    def tilings(schedule, pass_, d, fields):
        return {tuple(c["tiling"][f] for f in fields) for c in plan["configs"]
                if c["schedule"] == schedule and c["problem"]["pass"] == pass_
                and c["problem"]["head_dim"] == d}

    for d in (64, 128):
        assert tilings("decode", "fwd", d, ("block_n", "split_kv", "num_stages",
                                            "num_warps")) == set(PROBE_DECODE)
    for pass_ in ("fwd", "bwd"):
        assert tilings("fa2", pass_, 64, ("block_m", "block_n", "num_stages",
                                          "num_warps")) == set(PROBE_FA2[pass_])
    dropped = matrix.build_plan(
        "mlp", hw, _roofline_predictor, "roofline stand-in",
        aot=lambda schedule, problem, tiling: {"ok": tiling.num_stages != 4})
    assert len(dropped["configs"]) == 2 * (len(PROBE_DECODE) - 1) + fa2
    assert sum("does not compile" in note for note in dropped["notes"]) == 2
