"""Frozen plans on disk (``tilesim.plan/1``): where they live, how they are read and checked.

A plan is frozen into ``validation/plans/<name>.json`` by ``python -m validation.matrix
write`` so that the GPU machine needs no model; its ``sha256`` covers what it measures
(name, selection, configs, peers), so an edited plan is refused rather than run under the
name of another.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from traces.problem import AttentionProblem, ProblemError
from traces.schedules import SCHEDULE_NAMES
from traces.tiling import Tiling
from validation.groups import groups_for

PLAN_SCHEMA = "tilesim.plan/1"
PLAN_DIR = Path(__file__).parent / "plans"


def plan_hash(plan: dict) -> str:
    body = {k: plan[k] for k in ("name", "selected_by", "configs", "peers")}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def load_plan(name_or_path: str) -> dict:
    """A frozen plan by matrix name (``validation/plans/<name>.json``) or by path."""
    path = Path(name_or_path)
    if path.suffix != ".json":
        path = PLAN_DIR / f"{name_or_path}.json"
        if not path.is_file():
            groups_for(name_or_path)  # unknown names fail here with the list of known ones
            raise ProblemError(f"no frozen plan {path}; write it with `python -m "
                               f"validation.matrix write {name_or_path}`")
    try:
        plan = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ProblemError(f"cannot read plan {path}: {exc}") from None
    check_plan(plan, path)
    return plan


_PLAN_FIELDS = {"name": str, "hardware": str, "selected_by": str, "rating": str,
                "notes": list, "configs": list, "peers": list, "sha256": str}


def check_plan(plan: object, path) -> None:
    """``ProblemError`` (one line) unless ``plan`` is a plan as ``write`` freezes it: its
    fields of the right types, every config and peer a valid problem (and tiling) with a
    finite positive time estimate, and its ``sha256`` that of its content (an edited plan
    would run, and its records claim, another plan than the one named)."""
    if not isinstance(plan, dict) or plan.get("schema") != PLAN_SCHEMA:
        raise ProblemError(f'{path} is not a plan (schema "{PLAN_SCHEMA}")')
    for key, kind in _PLAN_FIELDS.items():
        if not isinstance(plan.get(key), kind):
            raise ProblemError(f'plan {path}: "{key}" is missing or not a {kind.__name__}')
    for part in ("configs", "peers"):
        for i, item in enumerate(plan[part]):
            where = f"plan {path}: {part}[{i}]"
            if not isinstance(item, dict) or not all(
                    isinstance(item.get(k), str) for k in ("id", "shape")):
                raise ProblemError(f'{where} is not an object with an "id" and a "shape"')
            try:
                AttentionProblem.from_dict(item.get("problem"))
                if part == "configs":
                    Tiling.from_dict(item.get("tiling"))
            except (ProblemError, TypeError) as exc:
                raise ProblemError(f"{where} ({item['id']}): {exc}") from None
            if part == "configs" and item.get("schedule") not in SCHEDULE_NAMES:
                raise ProblemError(f'{where}: schedule {item.get("schedule")!r} is not one '
                                   f'of {", ".join(SCHEDULE_NAMES)}')
            est = item.get("est_time_s")
            if (not isinstance(est, (int, float)) or isinstance(est, bool)
                    or not math.isfinite(est) or est <= 0):
                raise ProblemError(f'{where}: "est_time_s" must be a finite number > 0, '
                                   f"got {est!r}")
    if plan["sha256"] != plan_hash(plan):
        raise ProblemError(f"plan {path} was edited after it was frozen: its sha256 "
                           f"{plan['sha256']} is not its content's {plan_hash(plan)}; "
                           "freeze it again (python -m validation.matrix reselect or write)")
