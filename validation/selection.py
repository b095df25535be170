"""Which records a reconciliation looks at: ``tilesim reconcile --match/--max-seq``.

A full reconcile of the H200 records predicts 305 configs (about 18 minutes on two cores,
most of it naive attention at N = 16k). While the model changes, one group is often enough:
the records whose id a regular expression finds, up to a sequence length. The report keeps
what was asked (``selection``) and says it is a subset wherever it prints its numbers.
"""

from __future__ import annotations

import re

from traces.problem import ProblemError


def compile_match(pattern: str | None):
    """``--match``'s regular expression, compiled; ``ProblemError`` (one line) if it is not
    one. None: no pattern."""
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ProblemError(f'"--match" is not a regular expression ({exc}): {pattern!r}') from None


def select_records(records: list[dict], match=None, max_seq: int | None = None
                   ) -> tuple[list[dict], dict | None]:
    """The records whose ``record_id`` ``match`` finds (a compiled pattern, searched) and
    whose query and key lengths are at most ``max_seq``; with what was asked and how many of
    how many were kept (None when nothing was asked: every record). ``ProblemError`` (one
    line) if none is left: a report of nothing would only mislead."""
    if match is None and max_seq is None:
        return records, None

    def kept(rec: dict) -> bool:
        problem = rec.get("problem") or {}
        longest = max(problem.get("seq_q") or 0, problem.get("seq_kv") or 0)
        return ((match is None or match.search(str(rec.get("record_id", ""))) is not None)
                and (max_seq is None or longest <= max_seq))

    chosen = [rec for rec in records if kept(rec)]
    asked = {"match": None if match is None else match.pattern, "max_seq": max_seq}
    if not chosen:
        raise ProblemError(f"no record of the {len(records)} read is selected by "
                           f"{selection_flags(asked)}")
    return chosen, {**asked, "selected": len(chosen), "of": len(records)}


def selection_flags(selection: dict) -> str:
    """The options a selection (``select_records``) was asked with, as they were given."""
    return ", ".join(f"--{key.replace('_', '-')} {selection[key]!r}"
                     for key in ("match", "max_seq") if selection.get(key) is not None)
