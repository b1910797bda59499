"""JSON Schema -> GBNF with the output shape of llama.cpp's common/json-schema-to-grammar.cpp, two of its bugs
fixed (an ``allOf`` of string constraints became an empty object; integer minimums lost inner zeros).

The output lists rules sorted by name, one ``name ::= body`` per line, exactly as llama.cpp prints them, so
grammars from both are interchangeable. Structural schema errors and invalid regular expressions raise
:class:`GrammarError`; unsupported regex features fall back to a plain string with a warning (as llama.cpp).
"""

from samplechain.grammar.json_schema.converter import (
    MAX_INT_DIGITS,
    GrammarBuilder,
    json_schema_to_gbnf,
    server_response_schema,
)
from samplechain.grammar.json_schema.pattern import DOT, DOT_ALL, MAX_PATTERN_NESTING
from samplechain.grammar.json_schema.rules import FORMATS, PRIMITIVES, RESERVED, SPACE_RULE

__all__ = ["DOT", "DOT_ALL", "FORMATS", "MAX_INT_DIGITS", "MAX_PATTERN_NESTING", "PRIMITIVES", "RESERVED", "SPACE_RULE",
           "GrammarBuilder", "json_schema_to_gbnf", "server_response_schema"]
