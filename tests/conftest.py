"""Test set-up: run from the repository root; the Triton interpreter for kernel tests."""

import os

# Kernel tests run on the CPU through Triton's interpreter; set before triton is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")
