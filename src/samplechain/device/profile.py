"""What one ``BatchSampler`` step costs: tensor operations, host synchronisations and CUDA kernels (torch.profiler).

The functions that read device values on the host during a step are named here (``HOST_READS``): the step's one
transfer (``samplechain::to_host``) and torch's data-dependent reads (``.item()``, ``nonzero``, ...). On CUDA the
runtime's synchronising calls are counted as well.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile, record_function

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
    sync_calls: tuple[tuple[str, float], ...] = ()  # on CUDA: each synchronising call's count per step


def step_counts(sampler: object, logits: torch.Tensor, steps: int = 5) -> StepCounts:
    """Profile ``steps`` calls of ``sampler.sample(logits)`` (which accept their tokens) after two warm-up calls (on
    CUDA the second captures the step's graph). Synchronising calls are counted inside the steps only (the
    profiler's own, at its end, are not the step's)."""
    for _ in range(2):
        sampler.sample(logits)
    cuda = logits.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        with record_function("samplechain::steps"):
            for _ in range(steps):
                sampler.sample(logits)
        if cuda:  # every kernel done before the profile stops
            torch.cuda.synchronize(logits.device)
    events = prof.events()
    window = next(e.time_range for e in events if e.name == "samplechain::steps")
    aten = [e for e in events if e.name.startswith("aten::")]
    top = [e for e in aten if not _inside_aten(e)]
    reads = sum(e.name in HOST_READS and not _inside_aten(e) for e in events)
    calls: dict[str, int] = {}
    for e in events:
        if cuda and e.name in CUDA_SYNCS and window.start <= e.time_range.start <= window.end:
            calls[e.name] = calls.get(e.name, 0) + 1
    syncs = sum(calls.values()) if cuda else reads
    kernels = sum(e.device_type == torch.autograd.DeviceType.CUDA for e in events) if cuda else 0
    return StepCounts(len(top) / steps, len(aten) / steps, syncs / steps, kernels / steps,
                      tuple((name, n / steps) for name, n in sorted(calls.items())))


def kernel_table(events: list, steps: int = 1, top: int = 15) -> str:
    """The CUDA kernels among profiler ``events``, the ``top`` by GPU time: per step, how many launches, their mean
    time (us) and the kernel's name (cut at 90 characters)."""
    by_name: dict[str, list[float]] = {}
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by_name.setdefault(e.name[:90], []).append(e.device_time)
    rows = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    return "\n".join(f"  {len(ts) / steps:5.1f} x {sum(ts) / len(ts):7.2f} us  {name}" for name, ts in rows)


def _inside_aten(e: object) -> bool:
    p = e.cpu_parent
    while p is not None:
        if p.name.startswith("aten::"):
            return True
        p = p.cpu_parent
    return False
