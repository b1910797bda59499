"""Device sampling: the leading samplers of every row's chain run batched on torch tensors (needs torch)."""

from samplechain.device.batch import BatchSampler
from samplechain.device.group import plan_prefix
from samplechain.device.profile import StepCounts, step_counts
from samplechain.device.protocol import ChainRow, RowSampler

__all__ = ["BatchSampler", "ChainRow", "RowSampler", "StepCounts", "plan_prefix", "step_counts"]
