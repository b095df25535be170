"""Triton kernels that are the schedules' twins (docs/schedules.md).

One module per algorithm: ``naive``, ``fa1``, ``fa2`` (forward and backward), ``decode``;
``attention`` is the public autograd entry point, ``reference`` the float64 truth,
``footprint`` counts what kernels move in Triton's interpreter, ``resources`` compiles them
ahead of time. Importing this package imports neither torch nor triton.
"""

# tl.arange needs a power of two, and tl.dot a dimension of at least 16.
SUPPORTED_HEAD_DIMS = (16, 32, 64, 128, 256)
