"""GBNF grammars, JSON Schema -> GBNF, and grammar-constrained sampling (llama.cpp's
src/llama-grammar.cpp and common/json-schema-to-grammar.cpp)."""

from samplechain.grammar.engine import Grammar, GrammarMatcher
from samplechain.grammar.json_schema import json_schema_to_gbnf, server_response_schema
from samplechain.grammar.masks import MaskEngine
from samplechain.grammar.parser import GrammarError, parse_gbnf
from samplechain.grammar.sampler import GrammarSampler
from samplechain.grammar.tokens import TokenTable

__all__ = ["Grammar", "GrammarError", "GrammarMatcher", "GrammarSampler", "MaskEngine", "TokenTable",
           "json_schema_to_gbnf", "parse_gbnf", "server_response_schema"]
