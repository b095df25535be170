"""Getting the simulator's compiled code ready: quickly, and never stale.

``fast_numba_start``: on its first compilation (or cache load) numba imports
``numba.np.arraymath``, which probes for BLAS by importing ``scipy.linalg`` — about 0.5 s
on a small machine, a quarter of the 2 s ``tilesim simulate`` budget. The simulator's
compiled loops use no linear algebra, so the module is imported with SciPy hidden for the
duration of the import and the probe fails fast. The only effect is that
``np.correlate``/``np.convolve`` inside numba code of this process fall back to numba's
own inner product (``np.dot`` and ``np.linalg`` probe BLAS again when first compiled, and
find it). If the module is already imported, nothing happens.

``refresh_cache``: numba's on-disk cache (``cache=True``) is keyed on the file that defines
a function, so a cached caller in one module keeps running an old copy of a callee from
another module after that module changes (``fluid_kernel._step`` calls ``fairshare.fair_rates``,
``stream._replay`` calls ``l2.touch_tiles``). The sources of the compiled modules are
hashed together; when the hash differs from the one stamped in the cache directory, their
cache files are removed before anything is loaded, and compiled afresh once.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import sys
from pathlib import Path

COMPILED = ("l2.py", "stream.py", "fairshare.py", "fluid_kernel.py")
_HERE = Path(__file__).parent
_STAMP = "tilesim-numba.stamp"


class _HideScipy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "scipy" or name.startswith("scipy."):
            raise ModuleNotFoundError(f"{name} hidden while numba starts")
        return None


def fast_numba_start() -> None:
    refresh_cache()
    if "numba.np.arraymath" in sys.modules or "scipy.linalg" in sys.modules:
        return
    finder = _HideScipy()
    sys.meta_path.insert(0, finder)
    try:
        import numba.np.arraymath  # noqa: F401
    finally:
        sys.meta_path.remove(finder)


def refresh_cache(directory: Path = _HERE / "__pycache__") -> bool:
    """Drop the compiled-code cache of ``COMPILED`` if any of them changed; True if dropped."""
    digest = hashlib.sha256()
    for name in COMPILED:
        digest.update((_HERE / name).read_bytes())
    stamp = directory / _STAMP
    try:
        if stamp.read_text() == digest.hexdigest():
            return False
    except OSError:
        pass
    stems = tuple(name[:-3] + "." for name in COMPILED)
    if directory.is_dir():
        for path in directory.iterdir():
            if path.suffix in (".nbi", ".nbc") and path.name.startswith(stems):
                path.unlink(missing_ok=True)
    try:
        directory.mkdir(exist_ok=True)
        stamp.write_text(digest.hexdigest())
    except OSError:  # a read-only install: numba then caches elsewhere or not at all
        pass
    return True
