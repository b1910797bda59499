"""Grammar-constrained generation with the default model: the output of realistic schemas validates."""

import json

import jsonschema
import pytest

from samplechain import SamplingParams
from samplechain.cli import main

SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "email": {"type": "string", "pattern": "^[a-z]{1,10}@[a-z]{1,10}\\.(com|org)$"},
            "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3},
        },
        "required": ["name", "age", "hobbies"],
    },
    "order": {
        "type": "object",
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "status": {"enum": ["pending", "shipped", "delivered"]},
            "items": {"type": "array", "minItems": 1, "maxItems": 2, "items": {
                "type": "object",
                "properties": {"sku": {"type": "string", "maxLength": 8}, "qty": {"type": "integer", "minimum": 1,
                                                                                  "maximum": 99}},
                "required": ["sku", "qty"]}},
            "date": {"type": "string", "format": "date"},
        },
        "required": ["id", "status", "items", "date"],
    },
    "tool-call": {
        "oneOf": [
            {"type": "object", "properties": {"tool": {"const": "search"}, "query": {"type": "string",
                                                                                   "maxLength": 30}},
             "required": ["tool", "query"]},
            {"type": "object", "properties": {"tool": {"const": "calculator"},
                                              "a": {"type": "number"}, "b": {"type": "number"}},
             "required": ["tool", "a", "b"]},
        ]
    },
}


@pytest.mark.parametrize("name", list(SCHEMAS))
@pytest.mark.parametrize("grammar_first", [False, True])
def test_generated_json_validates(smol, name, grammar_first, monkeypatch):
    schema = SCHEMAS[name]
    params = SamplingParams(seed=1234, json_schema=schema, temperature=0.7)
    if grammar_first:  # route CommonSampler.sample through the grammar-first strategy
        from samplechain.params import CommonSampler

        sample = CommonSampler.sample
        monkeypatch.setattr(CommonSampler, "sample", lambda self, logits, grammar_first=False:
                            sample(self, logits, grammar_first=True))
    text = "".join(smol.generate(f"Write one {name} record as JSON:\n", params, n_predict=300))
    jsonschema.validate(json.loads(text), schema)
    assert smol.timings.n_eval < 300  # it stopped because the document was complete


def test_cli_json_schema_gives_valid_json(capsys):
    schema = SCHEMAS["person"]
    assert main(["generate", "-p", "A person as JSON:", "-n", "200", "--seed", "7", "--json-schema",
                 json.dumps(schema), "--no-perf", "--no-display-prompt"]) == 0
    jsonschema.validate(json.loads(capsys.readouterr().out), schema)


def test_cli_grammar_file_and_bad_grammar(tmp_path, capsys):
    path = tmp_path / "yes.gbnf"
    path.write_text('root ::= ("yes" | "no") "."\n', encoding="utf-8")
    assert main(["generate", "-p", "Is water wet? Answer:", "-n", "8", "--grammar-file", str(path), "--no-perf",
                 "--no-display-prompt"]) == 0
    assert capsys.readouterr().out.strip() in ("yes.", "no.")
    with pytest.raises(SystemExit) as e:
        main(["generate", "-p", "x", "--grammar", 'root ::= "a"{3,2}'])
    assert e.value.code == 2 and "maximum below its minimum" in capsys.readouterr().err
