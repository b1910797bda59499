"""What one ``BatchSampler`` step costs: tensor operations, host synchronisations and CUDA kernels (torch.profiler).

The functions that read device values on the host during a step are named here (``HOST_READS``): the step's one
transfer (``samplechain::to_host``) and torch's data-dependent reads (``.item()``, ``nonzero``, ...). On CUDA the
runtime's synchronising calls are counted as well.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile

# torch operations whose result the host must wait for (each is a synchronisation on CUDA), and the step's transfer
HOST_READS = frozenset({"samplechain::to_host", "aten::item", "aten::_local_scalar_dense", "aten::nonzero",
                        "aten::is_nonzero", "aten::equal", "aten::masked_select", "aten::unique", "aten::_unique2"})
CUDA_SYNCS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"})


@dataclass(frozen=True)
class StepCounts:
    """Per step: aten operations dispatched from Python (``ops``; nested ones not counted), all aten operations
    (``ops_nested``), host synchronisations (``syncs``) and CUDA kernels launched (``kernels``; 0 on the CPU)."""

    ops: float
    ops_nested: float
    syncs: float
    kernels: float


def step_counts(sampler: object, logits: torch.Tensor, steps: int = 5) -> StepCounts:
    """Profile ``steps`` calls of ``sampler.sample(logits)`` (which accept their tokens) after one warm-up call."""
    sampler.sample(logits)
    cuda = logits.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            sampler.sample(logits)
        if cuda:
            torch.cuda.synchronize(logits.device)
    events = prof.events()
    aten = [e for e in events if e.name.startswith("aten::")]
    top = [e for e in aten if not _inside_aten(e)]
    reads = sum(e.name in HOST_READS and not _inside_aten(e) for e in events)
    syncs = sum(e.name in CUDA_SYNCS for e in events) if cuda else reads
    kernels = sum(e.device_type == torch.autograd.DeviceType.CUDA for e in events) if cuda else 0
    return StepCounts(len(top) / steps, len(aten) / steps, syncs / steps, kernels / steps)


def _inside_aten(e: object) -> bool:
    p = e.cpu_parent
    while p is not None:
        if p.name.startswith("aten::"):
            return True
        p = p.cpu_parent
    return False
