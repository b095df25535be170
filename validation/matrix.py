"""The validation matrices: which problems and tilings are measured, in which order.

A matrix is a list of groups (schedule, pass, head dim, causal) and sequence lengths
(``validation.groups``). Per group, the tilings are chosen from a candidate pool by asking
the model: every candidate is predicted at every sequence length of the group, and four
are kept that the model rates differently at every length — the predicted best (by
geometric mean over the lengths), its runner-up, and two that spread the ratings — plus a
near tie of the best when the runner-up is far from it (``validation.choose``). One set
per group, not per shape: Triton compiles a kernel per (tiling, head dim, causal), not per
sequence length, so sharing the set keeps compile time — the largest cost of a device
run — small. Without the timing simulator the ratings are the exact global-memory bytes
(count-based distinctness), and the plan says so.

The result is a plan (``tilesim.plan/1``): configs in measurement order (shapes interleaved
across groups, so a run cut short by its time budget still covers every group), the
PyTorch peers of every problem, and every legal candidate's ratings per group
(``candidate_ratings``), so that a new selection rule can be applied without rating the
candidates again. Plans are frozen into ``validation/plans/<name>.json`` by ``python -m
validation.matrix write default quick``, so that the GPU machine needs no model
(``validation.plan_file`` reads and checks them; ``validation.plan_compiles`` checks that
their kernels compile). When the model changes, ``rerate --schedule S`` rates one
schedule's groups again and keeps the others' ratings (each group records when it was
rated, ``rated_utc``); ``reselect`` applies a new selection rule to the kept ratings.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass

from traces.problem import AttentionProblem, ProblemError
from traces.tiling import Tiling
from validation.choose import CLOSE_CALL, MIN_GAP, TILINGS_PER_SHAPE, choose, role_of
from validation.groups import PROBE, SEQ_PRIORITY, Group, groups_for, naive_fits
from validation.plan_compiles import aot_filter, check_plan_compiles, probe_compiles
from validation.plan_file import PLAN_DIR, PLAN_SCHEMA, load_plan, plan_hash
from validation.predict import Predictor, map_tasks


def kernel_names(schedule: str, problem: AttentionProblem, tiling: Tiling) -> list[str]:
    """The kernels a config's call launches, in launch order (from the schedule)."""
    from traces.schedules import build_schedule

    return [k.name for k in build_schedule(problem, tiling, schedule).kernels]


def rating(pred: dict, by: str) -> float | None:
    """The number tilings are told apart by: predicted time, or exact global bytes."""
    if not pred.get("legal", True):
        return None
    if by == "simulator":
        return pred.get("time_s")
    return float(pred["bytes"]["global_read"] + pred["bytes"]["global_write"])


def config_id(schedule: str, p: AttentionProblem, t: Tiling | None, impl: str = "triton") -> str:
    head = schedule if impl == "triton" else impl
    kv = f"-kv{p.kv_heads}" if p.kv_heads != p.heads else ""
    base = (f"{head}-{p.pass_}-b{p.batch}-h{p.heads}{kv}-q{p.seq_q}-k{p.seq_kv}-d{p.head_dim}"
            f"-{p.dtype}{'-causal' if p.causal else ''}")
    if t is None:
        return base
    split = f"-sp{t.split_kv}" if t.split_kv > 1 else ""
    return f"{base}-m{t.block_m}-n{t.block_n}-s{t.num_stages}-w{t.num_warps}{split}"


def compile_key(schedule: str, p: AttentionProblem, t: Tiling) -> str:
    """Configs with equal keys share compiled kernels (the sequence length is a runtime
    argument, except for naive softmax whose row length is a compile-time constant, and
    decode's split count is a runtime argument)."""
    seq = f"-k{p.seq_kv}" if schedule == "naive" else ""
    block_m = "" if schedule == "decode" else f"m{t.block_m}"
    return (f"{schedule}-{p.pass_}-d{p.head_dim}-{p.dtype}-c{int(p.causal)}-g{p.group_size}"
            f"-{block_m}n{t.block_n}-s{t.num_stages}-w{t.num_warps}{seq}")


@dataclass
class RatedGroup:
    """A group's legal candidates and their ratings and expected times (``[length][i]``),
    and when the model rated them (UTC)."""

    group: Group
    seqs: list[int]
    legal: list[Tiling]
    columns: list[list[float]]
    times: list[list[float]]
    rated_utc: str


def _transpose(table: list[list[float]]) -> list[list[float]]:
    """Per candidate <-> per length (plans keep ratings per candidate; ``choose`` takes them
    per length)."""
    return [list(row) for row in zip(*table, strict=True)]


def _lengths(groups: list[Group], hw) -> tuple[dict, list[str]]:
    """Each group's sequence lengths that run on ``hw``, and notes on those left out."""
    seqs_of, notes = {}, []
    for group in groups:
        seqs_of[group] = [n for n in group.seqs if group.schedule != "naive"
                          or naive_fits(group.problem(n), hw.hbm_bytes)]
        if len(seqs_of[group]) < len(group.seqs):
            notes.append(f"{group.label}: N={sorted(set(group.seqs) - set(seqs_of[group]))} "
                         "left out, N x N does not fit")
    return seqs_of, notes


def build_plan(name: str, hw, predictor: Predictor, model: str,
               aot=None, log=lambda *_: None, jobs: int = 1) -> dict:
    """Choose the tilings of every group and lay out the measurement order.

    ``model`` is ``simulator`` or ``counts`` (what ``predictor`` fills in); ``aot``, if
    given, is ``aot(schedule, problem, tiling) -> {"ok": bool, ...}`` and drops candidates
    that do not compile for the GPU. ``jobs > 1`` rates candidates in that many processes
    (``predictor`` must then be a module-level function).
    """
    by = "simulator" if model == "simulator" else "counts"
    groups = groups_for(name)
    seqs_of, notes = _lengths(groups, hw)
    rated_groups = _rate_groups(groups, seqs_of, predictor, hw, by, jobs)
    return _assemble(name, hw, by, rated_groups, notes, aot, log)


def _rate_groups(groups: list[Group], seqs_of: dict, predictor: Predictor, hw, by: str,
                 jobs: int) -> list[RatedGroup]:
    """Rate every candidate of ``groups`` at each of their lengths; keep the legal ones
    (rated at every length)."""
    tasks = [(predictor, group.schedule, group.problem(n), t, hw, by)
             for group in groups for t in group.candidates() for n in seqs_of[group]]
    rated = map_tasks(_rate, tasks, jobs, chunksize=4)
    results = dict(zip(((t[1], t[2], t[3]) for t in tasks), rated, strict=True))
    now = _utc_now()
    rated_groups = []
    for group in groups:
        seqs = seqs_of[group]
        table, times, legal = [], [], []
        for t in group.candidates():
            cells = [results[(group.schedule, group.problem(n), t)] for n in seqs]
            if all(c is not None and c[0] is not None and c[0] > 0 for c in cells):
                table.append([c[0] for c in cells])
                times.append([c[1] for c in cells])
                legal.append(t)
        rated_groups.append(RatedGroup(group, seqs, legal, _transpose(table),
                                       _transpose(times), now))
    return rated_groups


def reselect_plan(plan: dict, hw, aot=None, log=lambda *_: None) -> dict:
    """The plan with its tilings chosen again, by ``choose``, from the candidate ratings it
    keeps — no model runs (a plan frozen by the simulator costs an hour to rate again).

    The groups, lengths and candidates must still be the matrix's; a plan whose candidates
    were rated by counts needs its expected times, which plans keep from 2026-11-30 on.
    """
    groups = {g.label: g for g in groups_for(plan["name"])}
    seqs_of, notes = _lengths(list(groups.values()), hw)
    rated_groups = _kept_groups(plan, groups, seqs_of)
    return _assemble(plan["name"], hw, plan["selected_by"], rated_groups, notes, aot, log)


def rerate_plan(plan: dict, hw, schedules: set[str], predictor: Predictor, model: str,
                aot=None, log=lambda *_: None, jobs: int = 1) -> dict:
    """The plan with the groups of ``schedules`` rated again by the model and every
    group's tilings chosen again; the other groups keep the ratings the plan has.

    For a model change that can only move the ratings of some schedules (the caller's
    claim; each group's ``rated_utc`` says when it was rated): an hour of rating is then
    minutes.
    """
    by = "simulator" if model == "simulator" else "counts"
    if by != plan["selected_by"]:
        raise ProblemError(f'plan "{plan["name"]}" was rated by {plan["selected_by"]}, the '
                           f"model here is {by}; write it again")
    groups = {g.label: g for g in groups_for(plan["name"])}
    unknown = schedules - {g.schedule for g in groups.values()}
    if unknown:
        raise ProblemError(f'plan "{plan["name"]}" has no groups of schedule '
                           f"{', '.join(sorted(unknown))}")
    seqs_of, notes = _lengths(list(groups.values()), hw)
    kept = _kept_groups(plan, groups, seqs_of)
    again = [rg.group for rg in kept if rg.group.schedule in schedules]
    fresh = {rg.group.label: rg for rg in
             _rate_groups(again, seqs_of, predictor, hw, by, jobs)}
    rated_groups = [fresh.get(rg.group.label, rg) for rg in kept]
    return _assemble(plan["name"], hw, by, rated_groups, notes, aot, log)


def _kept_groups(plan: dict, groups: dict, seqs_of: dict) -> list[RatedGroup]:
    """The plan's kept candidate ratings, checked against the matrix's groups."""
    if "candidate_ratings" not in plan:
        raise ProblemError(f'plan "{plan["name"]}" keeps no candidate ratings; write it again')
    rated_groups = []
    for entry in plan["candidate_ratings"]:
        group = groups.get(entry["group"])
        if group is None or entry["seqs"] != seqs_of[group]:
            raise ProblemError(f'plan "{plan["name"]}": group {entry["group"]} is not the '
                               "matrix's any more; write the plan again")
        legal = [Tiling.from_dict(t) for t in entry["tilings"]]
        candidates = group.candidates()
        if any(t not in candidates for t in legal):
            raise ProblemError(f'plan "{plan["name"]}": {entry["group"]} has tilings that are '
                               "no longer candidates; write the plan again")
        times = entry.get("times")
        if times is None:
            if plan["selected_by"] != "simulator":
                raise ProblemError(f'plan "{plan["name"]}" keeps no expected times; write it '
                                   "again")
            times = entry["ratings"]  # the simulator's ratings are its predicted times
        rated_groups.append(RatedGroup(group, entry["seqs"], legal,
                                       _transpose(entry["ratings"]), _transpose(times),
                                       entry.get("rated_utc", plan["created_utc"])))
    if len(rated_groups) != len(groups):
        raise ProblemError(f'plan "{plan["name"]}" does not rate every group of the matrix; '
                           "write it again")
    return rated_groups


def _assemble(name: str, hw, by: str, rated_groups: list[RatedGroup], notes: list[str], aot,
              log) -> dict:
    """Choose each group's tilings and lay out the plan (configs, peers, ratings)."""
    per_group, candidate_ratings = [], []
    for rg in rated_groups:
        group, seqs, legal, columns = rg.group, rg.seqs, rg.legal, rg.columns
        if group.probe:  # every legal tiling is measured; one that does not compile is dropped
            chosen, gap = probe_compiles(group, seqs, legal, aot, notes, log), 1.0
        else:
            chosen, gap = choose(columns)
            if aot is not None:
                chosen, gap = aot_filter(group, seqs, legal, columns, chosen, aot, notes, log)
        if gap < MIN_GAP:
            notes.append(f"{group.label}: the chosen tilings differ by only {100 * gap:.1f}% "
                         f"at some N (wanted {100 * MIN_GAP:.0f}%)")
        log(f"{group.label}: " + ", ".join(legal[i].describe() for i in chosen))
        candidate_ratings.append({
            "group": group.label, "seqs": seqs, "tilings": [t.to_dict() for t in legal],
            "ratings": _transpose(columns), "times": _transpose(rg.times),
            "chosen": chosen, "rated_utc": rg.rated_utc})
        per_group.append((group, seqs, [(legal[i], [row[i] for row in columns],
                                         [row[i] for row in rg.times],
                                         PROBE if group.probe else role_of(j))
                                        for j, i in enumerate(chosen)]))
    configs, peers, seen_problems = [], [], set()
    for n in SEQ_PRIORITY:
        for group, seqs, chosen in per_group:
            if n not in seqs:
                continue
            p = group.problem(n)
            for t, ratings, est, role in chosen:
                configs.append({
                    "id": config_id(group.schedule, p, t), "schedule": group.schedule,
                    "role": role,
                    "problem": p.to_dict(), "tiling": t.to_dict(),
                    "shape": config_id(group.schedule, p, None),
                    "kernels": kernel_names(group.schedule, p, t),
                    "compile_key": compile_key(group.schedule, p, t),
                    "rating": ratings[seqs.index(n)], "est_time_s": est[seqs.index(n)]})
            key = json.dumps(p.to_dict(), sort_keys=True)
            if key not in seen_problems:
                seen_problems.add(key)
                fastest = min(est[seqs.index(n)] for _, _, est, _ in chosen)
                peers += [{"id": config_id("", p, None, impl), "implementation": impl,
                           "problem": p.to_dict(), "shape": config_id(group.schedule, p, None),
                           "est_time_s": _peer_time_s(impl, p, fastest, hw)}
                          for impl in ("sdpa_math", "sdpa_flash")]
    plan = {"schema": PLAN_SCHEMA, "name": name, "hardware": hw.name, "selected_by": by,
            "rating": "predicted time_s" if by == "simulator" else "global bytes (exact counts)",
            "tilings_per_shape": TILINGS_PER_SHAPE, "min_gap": MIN_GAP,
            "close_call": CLOSE_CALL, "notes": notes,
            "created_utc": _utc_now(),
            "configs": configs, "peers": peers,
            # Every legal candidate's rating and expected time at every length, so that a
            # new selection rule can be applied to a frozen plan without rating the
            # candidates again (``reselect_plan``).
            "candidate_ratings": candidate_ratings}
    plan["sha256"] = plan_hash(plan)
    return plan


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _rate(task) -> tuple[float | None, float] | None:
    """(rating, expected time) of one candidate at one length; None if the model refuses it."""
    predictor, schedule, problem, tiling, hw, by = task
    try:
        pred = predictor(problem, tiling, schedule, hw)
    except ProblemError:
        return None
    return rating(pred, by), _time_s(pred, hw)


def _time_s(pred: dict, hw) -> float:
    """Expected kernel time for sizing the run: the simulator's, else a count roofline."""
    from validation.estimate import roofline_time

    return pred.get("time_s") or roofline_time(pred, hw)


def _peer_time_s(impl: str, p: AttentionProblem, fastest_s: float, hw) -> float:
    """MATH is a naive attention (its N x N tensors dominate); FLASH is about our best."""
    if impl != "sdpa_math":
        return fastest_s
    from simulator.prediction import count_prediction

    return 1.5 * _time_s(count_prediction(p, Tiling(block_m=64, block_n=64), "naive", hw), hw)


def main(argv: list[str] | None = None) -> int:
    from simulator.cli.common import cores, write_atomically
    from simulator.hardware import load_hardware
    from validation import predict

    parser = argparse.ArgumentParser(prog="python -m validation.matrix",
                                     description="choose the tilings and freeze plans")
    parser.add_argument("action", choices=["write", "show", "reselect", "rerate", "compiles"],
                        help="write: rate the candidates and freeze; show: the same without "
                             "writing; reselect: choose again from a frozen plan's ratings; "
                             "rerate: rate the groups of --schedule again, keep the others' "
                             "ratings, choose again; compiles: check that every kernel of "
                             "the frozen plans compiles for sm_90 with this Triton")
    parser.add_argument("names", nargs="+", help="matrix names: default, quick, mlp")
    parser.add_argument("--hardware", default="h200-sxm")
    parser.add_argument("--jobs", type=int, default=cores(),
                        help="processes rating candidates (default: the cores this process "
                             "may use)")
    parser.add_argument("--schedule", action="append", default=[],
                        help="rerate: a schedule whose groups are rated again (repeatable)")
    parser.add_argument("--no-aot", action="store_true",
                        help="skip the sm_90 compile check of the chosen tilings")
    args = parser.parse_args(argv)
    if (args.action == "rerate") != bool(args.schedule):
        print("error: --schedule goes with rerate, and rerate needs at least one",
              file=sys.stderr)
        return 2
    if args.action == "compiles":
        if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
            print("error: compiles needs the compiler: unset TRITON_INTERPRET", file=sys.stderr)
            return 2
        try:
            plans = [load_plan(name) for name in args.names]
        except ProblemError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 1 if check_plan_compiles(plans, jobs=args.jobs) else 0
    hw = load_hardware(args.hardware)
    aot = None
    if not args.no_aot and args.action != "show":
        from validation.compile import aot_check
        aot = aot_check
    for name in args.names:
        try:
            if args.action == "reselect":
                frozen = load_plan(name)
                plan = reselect_plan(frozen, load_hardware(frozen["hardware"]), aot=aot,
                                     log=print)
            elif args.action == "rerate":
                frozen = load_plan(name)
                plan = rerate_plan(frozen, load_hardware(frozen["hardware"]),
                                   set(args.schedule), predict.predict, predict.model_name(),
                                   aot=aot, log=print, jobs=args.jobs)
            else:
                plan = build_plan(name, hw, predict.predict, predict.model_name(), aot=aot,
                                  log=print, jobs=args.jobs)
        except ProblemError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"{name}: {len(plan['configs'])} configs, {len(plan['peers'])} peers, "
              f"tilings selected by {plan['selected_by']}")
        for note in plan["notes"]:
            print(f"  note: {note}")
        if args.action != "show":
            PLAN_DIR.mkdir(exist_ok=True)
            text = json.dumps(plan, indent=1) + "\n"
            write_atomically(PLAN_DIR / f"{name}.json", lambda p, t=text: p.write_text(t))
            print(f"  wrote {PLAN_DIR / f'{name}.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
