"""Device sampling: the leading samplers of every row's chain run batched on torch tensors (needs torch)."""

from samplechain.device.batch import BatchSampler, plan_prefix

__all__ = ["BatchSampler", "plan_prefix"]
