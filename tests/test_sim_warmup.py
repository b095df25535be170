"""The simulator's compiled-code cache is dropped when any compiled module changes."""

from __future__ import annotations

import re
from pathlib import Path

from simulator.sim import warmup

SIM = Path(warmup.__file__).parent


def test_every_compiled_module_of_the_engines_is_hashed():
    """A module of ``simulator/sim`` with ``@njit`` functions that ``COMPILED`` leaves out
    would keep its callers' cached copies of it stale after an edit."""
    compiled = sorted(p.name for p in SIM.glob("*.py")
                      if re.search(r"^@njit", p.read_text(), re.MULTILINE))
    assert compiled == sorted(warmup.COMPILED)


def test_the_cache_is_dropped_once_when_the_sources_change(tmp_path):
    ours = tmp_path / "fluid_kernel._step-160.py311.1.nbc"
    index = tmp_path / "l2.touch_tiles-361.py311.nbi"
    other = tmp_path / "expand._emit-59.py311.1.nbc"  # not a module of COMPILED
    for path in (ours, index, other):
        path.write_bytes(b"x")
    assert warmup.refresh_cache(tmp_path)  # no stamp yet: dropped
    assert not ours.exists() and not index.exists() and other.exists()
    ours.write_bytes(b"x")
    assert not warmup.refresh_cache(tmp_path)  # the stamp matches the sources: kept
    assert ours.exists()
    (tmp_path / warmup._STAMP).write_text("an older hash")
    assert warmup.refresh_cache(tmp_path)
    assert not ours.exists() and other.exists()
