"""Count the global-memory traffic kernels really request, in Triton's CPU interpreter.

Inside ``count_traffic()`` every kernel launch is recorded with its name and grid, and every
``tl.load``/``tl.store`` the interpreter executes is attributed to the kernel argument tensor
whose address range holds it. Masked-off elements are not counted: what is counted is
exactly what a GPU would request. The result has the shape of the schedules' per-kernel
traffic (``traces.schedules.kernel_traffic``), so that the two can be compared as twins.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import numpy as np
import triton


def interpreted() -> bool:
    """True when the kernel modules were defined for the interpreter (TRITON_INTERPRET=1)."""
    from triton.runtime.interpreter import InterpretedFunction

    from kernels import fa2

    return isinstance(fa2.fa2_fwd, InterpretedFunction)


def _tensor_ranges(arg_names: list[str], args: list, kwargs: dict) -> dict[str, tuple[int, int]]:
    """{tensor name: (first byte, end byte)} of the kernel's tensor arguments (Q -> "q")."""
    named = dict(zip(arg_names, args, strict=False)) | kwargs
    ranges = {}
    for name, value in named.items():
        if hasattr(value, "data_ptr") and hasattr(value, "element_size"):
            start = value.data_ptr()
            ranges[name.lower()] = (start, start + value.numel() * value.element_size())
    return ranges


class _Recorder:
    def __init__(self) -> None:
        self.launches: list[dict] = []
        self._ranges: dict[str, tuple[int, int]] = {}

    def launch(self, name: str, grid, ranges: dict[str, tuple[int, int]]) -> None:
        self._ranges = ranges
        self.launches.append({
            "name": name,
            "grid": math.prod(grid),
            "per_tensor": {t: {"global_read": 0, "global_write": 0} for t in ranges},
        })

    def access(self, ptrs, mask, kind: str) -> None:
        addrs = np.asarray(ptrs.data, dtype=np.uint64).ravel()
        active = np.broadcast_to(np.asarray(mask.data, dtype=bool), np.shape(ptrs.data)).ravel()
        addrs = addrs[active]
        if addrs.size == 0:
            return
        elem_bytes = ptrs.get_element_ty().primitive_bitwidth // 8
        per_tensor = self.launches[-1]["per_tensor"]
        matched = 0
        for tensor, (start, end) in self._ranges.items():
            n = int(np.count_nonzero((addrs >= start) & (addrs < end)))
            per_tensor[tensor][kind] += n * elem_bytes
            matched += n
        if matched != addrs.size:
            raise RuntimeError(f"kernel {self.launches[-1]['name']} accessed "
                               f"{addrs.size - matched} elements outside its tensor arguments")


@contextlib.contextmanager
def count_traffic() -> Iterator[list[dict]]:
    """Record kernel launches and their per-tensor traffic while the block runs.

    Yields a list that fills with ``{"name", "grid", "per_tensor": {tensor: {"global_read":
    bytes, "global_write": bytes}}}`` in launch order. Needs the interpreter.
    """
    from triton.runtime import interpreter

    if not triton.knobs.runtime.interpret:
        raise RuntimeError("count_traffic() needs Triton's interpreter: set TRITON_INTERPRET=1 "
                           "before the kernels are imported")
    recorder = _Recorder()
    builder = interpreter.interpreter_builder
    executor = interpreter.GridExecutor
    original_init_args = executor._init_args_hst
    original_load = builder.create_masked_load
    original_store = builder.create_masked_store

    def init_args(self, args_dev, kwargs):
        args_hst, kwargs_hst = original_init_args(self, args_dev, kwargs)
        grid = self.grid if isinstance(self.grid, tuple) else (0,)
        recorder.launch(self.fn.__name__, grid, _tensor_ranges(self.arg_names, args_hst,
                                                               kwargs_hst))
        return args_hst, kwargs_hst

    # The cache arguments after these differ between Triton versions (3.6 and 3.8 pass a
    # cache modifier and an eviction policy, 3.9 one cache policy): passed on as they come.
    def load(ptrs, mask, *args, **kwargs):
        recorder.access(ptrs, mask, "global_read")
        return original_load(ptrs, mask, *args, **kwargs)

    def store(ptrs, value, mask, *args, **kwargs):
        recorder.access(ptrs, mask, "global_write")
        return original_store(ptrs, value, mask, *args, **kwargs)

    patched = {"create_masked_load": load, "create_masked_store": store}
    shadowed = {name: builder.__dict__[name] for name in patched if name in builder.__dict__}
    executor._init_args_hst = init_args
    builder.__dict__.update(patched)
    try:
        yield recorder.launches
    finally:
        executor._init_args_hst = original_init_args
        for name in patched:
            del builder.__dict__[name]
        builder.__dict__.update(shadowed)
