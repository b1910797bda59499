"""Every llama.cpp sampler, one module per family."""

from samplechain.samplers.adaptive_p import AdaptiveP
from samplechain.samplers.base import Sampler
from samplechain.samplers.dry import DRY
from samplechain.samplers.infill import Infill
from samplechain.samplers.logit_bias import LogitBias
from samplechain.samplers.mirostat import Mirostat, MirostatV2
from samplechain.samplers.penalties import Penalties
from samplechain.samplers.probability_filters import MinP, TopP, Typical
from samplechain.samplers.reasoning_budget import ReasoningBudget, ReasoningBudgetState
from samplechain.samplers.selectors import Dist, Greedy
from samplechain.samplers.temperature import DynamicTemperature, Temperature
from samplechain.samplers.truncation import XTC, TopK, TopNSigma

__all__ = [
    "DRY", "XTC", "AdaptiveP", "Dist", "DynamicTemperature", "Greedy", "Infill", "LogitBias", "MinP",
    "Mirostat", "MirostatV2", "Penalties", "ReasoningBudget", "ReasoningBudgetState", "Sampler", "Temperature",
    "TopK", "TopNSigma", "TopP", "Typical",
]
