"""Test set-up: run from the repository root; the Triton interpreter for kernel tests."""

import os

# Kernel tests run on the CPU through Triton's interpreter; set before triton is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")

# Compile results are cached (kernels.resources.cache_path): keep the tests' cache out of the
# home directory, in a folder of this run, removed when the run ends.
if "TILESIM_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["TILESIM_CACHE_DIR"] = tempfile.mkdtemp(prefix="tilesim-test-cache-")
    atexit.register(shutil.rmtree, os.environ["TILESIM_CACHE_DIR"], ignore_errors=True)
