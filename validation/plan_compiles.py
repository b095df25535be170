"""Whether a plan's kernels compile for sm_90 and fit its shared memory.

While a plan is chosen, a tiling that does not compile (or does not fit) is dropped:
a probe's simply, a chosen tiling replaced by ``choose``'s next pick among the rest
(``aot_filter``). Before a device run whose Triton is not the one that froze the plans,
``check_plan_compiles`` compiles one config of each distinct launch (a tiling that fits
one compiler's shared memory may not fit another's).
"""

from __future__ import annotations

from traces.problem import AttentionProblem
from traces.tiling import Tiling
from validation.choose import TILINGS_PER_SHAPE, choose, min_gap
from validation.predict import map_tasks


def probe_compiles(group, seqs, legal, aot, notes, log) -> list[int]:
    """The indices of a probe's tilings that compile for sm_90 (all, without ``aot``)."""
    kept = []
    for i, tiling in enumerate(legal):
        if aot is None or aot(group.schedule, group.problem(seqs[-1]), tiling)["ok"]:
            kept.append(i)
        else:
            notes.append(f"{group.label}: {tiling.describe()} does not compile for sm_90")
            log(notes[-1])
    return kept


def aot_filter(group, seqs, legal, columns, chosen, aot, notes, log):
    """Replace chosen tilings that do not compile for sm_90 (checked at the largest N)."""
    failed: set[int] = set()
    while True:
        bad = [i for i in chosen if i not in failed
               and not aot(group.schedule, group.problem(seqs[-1]), legal[i])["ok"]]
        if not bad:
            return chosen, min_gap(tuple(chosen[:TILINGS_PER_SHAPE]), columns)
        failed.update(bad)
        for i in bad:
            notes.append(f"{group.label}: {legal[i].describe()} does not compile for sm_90")
            log(notes[-1])
        keep = [i for i in range(len(legal)) if i not in failed]
        sub = [[row[i] for i in keep] for row in columns]
        picked, _ = choose(sub)
        chosen = [keep[i] for i in picked]


def compile_check_configs(plans: list[dict]) -> list[dict]:
    """One config per distinct launch key of ``plans`` (``validation.compile.launch_key``:
    the compile key and Triton's specialization of the integers), the one with the longest
    K/V (as ``_aot_filter`` checks: the largest N of a group)."""
    from validation.compile import launch_key

    chosen: dict[str, dict] = {}
    for plan in plans:
        for cfg in plan["configs"]:
            key = launch_key(cfg)
            if key not in chosen or cfg["problem"]["seq_kv"] > chosen[key]["problem"]["seq_kv"]:
                chosen[key] = cfg
    return list(chosen.values())


def _aot_task(cfg: dict) -> tuple[str, dict]:
    from validation.compile import aot_check

    return cfg["compile_key"], aot_check(cfg["schedule"],
                                         AttentionProblem.from_dict(cfg["problem"]),
                                         Tiling.from_dict(cfg["tiling"]))


def check_plan_compiles(plans: list[dict], jobs: int = 1, log=print) -> list[str]:
    """Compile every kernel of the frozen plans for sm_90 with the Triton installed here;
    the failures, one line each. Run it when the GPU image's Triton is not the one that
    froze the plans (a tiling that fits one compiler's shared memory may not fit another's)."""
    import triton

    configs = compile_check_configs(plans)
    log(f"compiling {len(configs)} kernel sets for sm_90 with triton {triton.__version__}")
    failures = []
    for key, result in map_tasks(_aot_task, configs, jobs=jobs):
        if not result["ok"]:
            failures.append(f"{key}: {result['error']}")
            log(f"  FAILED {failures[-1]}")
    log(f"{len(configs) - len(failures)} of {len(configs)} compile and fit")
    return failures
