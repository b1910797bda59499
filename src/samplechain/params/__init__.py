"""Sampling parameters and the common sampler: llama.cpp's ``common_params_sampling`` and ``common/sampling.cpp``.

- ``sampling_params``: ``SamplingParams``, each field declared once (``samplechain.param_specs``);
- ``sampler_names``: the names, aliases and one-letter codes of the ``samplers`` list;
- ``checks``: how the Python API validates each field, and the parsers of structured values (logit biases, grammar
  triggers, reasoning tags);
- ``server_json``: llama-server's rules of their own for some request fields;
- ``cli_args``: the fields the command-line flags make by rules of their own;
- ``common_sampler``: ``CommonSampler``, the chain built from the parameters and the order a step applies it in.
"""

from samplechain.params.checks import (
    TRIGGER_PATTERN,
    TRIGGER_PATTERN_FULL,
    TRIGGER_TOKEN,
    TRIGGER_WORD,
    parse_logit_bias,
)
from samplechain.params.common_sampler import CommonSampler, Observer, tokenize_logit_bias
from samplechain.params.sampler_names import (
    DEFAULT_SAMPLERS,
    SAMPLER_TYPES,
    parse_sampler_chars,
    parse_sampler_names,
    sampler_chars,
)
from samplechain.params.sampling_params import SamplingParams

__all__ = [
    "DEFAULT_SAMPLERS", "SAMPLER_TYPES", "TRIGGER_PATTERN", "TRIGGER_PATTERN_FULL", "TRIGGER_TOKEN", "TRIGGER_WORD",
    "CommonSampler", "Observer", "SamplingParams", "parse_logit_bias", "parse_sampler_chars", "parse_sampler_names",
    "sampler_chars", "tokenize_logit_bias",
]
