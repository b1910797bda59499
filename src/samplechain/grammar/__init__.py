"""GBNF grammars, JSON Schema -> GBNF, and grammar-constrained sampling (spec/grammar)."""

from samplechain.grammar.engine import Grammar, GrammarMatcher, MaskEngine, TokenTable
from samplechain.grammar.parser import GrammarError, parse_gbnf

__all__ = ["Grammar", "GrammarError", "GrammarMatcher", "MaskEngine", "TokenTable", "parse_gbnf"]
