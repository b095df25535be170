"""Whether a schedule's tensors fit in the GPU's device memory (HBM).

The footprint is the schedule's address space: every tensor its kernels read or write
(inputs, outputs, intermediates such as naive attention's S and P, the backward's
gradients), allocated at once as ``traces.schedules.base.allocate`` lays them out. Real
frameworks may free an intermediate early or reuse a buffer; the schedules keep each live
for the whole pass, as their Triton twins do. The capacity is the preset's ``hbm_bytes``
(the datasheet's); the driver and CUDA context keep a few hundred MB of it, which the check
does not subtract, so a problem right at the limit may still fail on the GPU.

The check needs only the tensors (``schedule_tensors``), not the kernels, whose per-CTA
coordinates alone can outgrow the host's memory for a problem this large.
"""

from __future__ import annotations

from simulator.cli.render import fmt_bytes
from simulator.hardware import Hardware
from traces.problem import AttentionProblem, ProblemError
from traces.schedules import device_bytes, schedule_tensors
from traces.tiling import Tiling

LISTED_TENSORS = 3  # the largest tensors named in the message


class DeviceMemoryError(ProblemError):
    """The schedule's tensors need more device memory than the GPU has."""


def fits(nbytes: int, hw: Hardware) -> bool:
    """Whether ``nbytes`` of tensors fit in ``hw``'s HBM (the driver's share not counted)."""
    return nbytes <= hw.hbm_bytes


def check_device_memory(problem: AttentionProblem, tiling: Tiling, schedule: str,
                        hw: Hardware) -> None:
    """Raise ``DeviceMemoryError`` (one line) if the tensors do not fit in ``hw``'s HBM."""
    tensors = schedule_tensors(problem, tiling, schedule)
    need = device_bytes(tensors)
    if fits(need, hw):
        return
    largest = sorted(tensors.values(), key=lambda t: -t.nbytes)[:LISTED_TENSORS]
    listed = ", ".join(f"{t.name} {fmt_bytes(t.nbytes)}" for t in largest)
    if len(tensors) > len(largest):
        listed += ", ..."
    raise DeviceMemoryError(
        f"{schedule} does not fit in device memory: its tensors need {fmt_bytes(need)} ({listed}), "
        f"{hw.name} has {fmt_bytes(hw.hbm_bytes)} of device memory (try a smaller batch, fewer "
        f"heads or a shorter sequence)")
