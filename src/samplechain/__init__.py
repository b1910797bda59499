"""samplechain: llama.cpp's token sampling, rebuilt in Python — exact, composable, fast."""

from samplechain.candidates import Candidates
from samplechain.chain import Chain
from samplechain.grammar import GrammarError, GrammarSampler
from samplechain.params import CommonSampler, SamplingParams
from samplechain.rng import DEFAULT_SEED
from samplechain.samplers import (
    DRY,
    XTC,
    AdaptiveP,
    Dist,
    DynamicTemperature,
    Greedy,
    Infill,
    LogitBias,
    MinP,
    Mirostat,
    MirostatV2,
    Penalties,
    ReasoningBudget,
    ReasoningBudgetState,
    Sampler,
    Temperature,
    TopK,
    TopNSigma,
    TopP,
    Typical,
)
from samplechain.vocab import Vocab

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_SEED", "DRY", "XTC", "AdaptiveP", "Candidates", "Chain", "CommonSampler", "Dist",
    "DynamicTemperature", "GrammarError", "GrammarSampler", "Greedy", "Infill", "LogitBias", "MinP", "Mirostat",
    "MirostatV2", "Penalties", "ReasoningBudget", "ReasoningBudgetState", "Sampler", "SamplingParams", "Temperature",
    "TopK", "TopNSigma", "TopP", "Typical", "Vocab",
]
