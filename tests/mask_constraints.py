"""Constraints the mask tests of several packages share (imported by name; not a test module).

``PERSON``: a closed object with a bounded string, an integer and an array of listed strings.
``LOOKAHEAD_EBNF``: a GBNF grammar with a look-ahead ``(= ...)``, which llguidance's GBNF
converter refuses, so ``compile_constraint`` compiles it with xgrammar.
"""

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"enum": ["a", "bb", "ccc"]}},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}

LOOKAHEAD_EBNF = r"""
root ::= "{" pair ("," pair)* "}"
pair ::= "\"" name "\"" ":" value
name ::= [a-z]+ (= "\"")
value ::= [0-9]+ | "true" | "[" (value ("," value)*)? "]"
"""
