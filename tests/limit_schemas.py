"""A schema that compiles under a lowered llguidance limit and trips it only mid-generation.

With the Earley row limit lowered to 40 (``CORRAL_LLG_LIMITS``) the compile-time probe passes:
it walks only the first few positions, and "name" (at least 12 characters) keeps it inside the
string. The row after the key "inner" holds about 4 items per optional property (~240), so a
matcher enters llguidance's error state there, and rebuilding it and replaying the tokens trips
the same limit. Grammar, engine and API tests drive the real failure path with it.
"""

MID_GENERATION = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 12, "maxLength": 20},
        "inner": {
            "type": "object",
            "properties": {f"p{i}": {"type": "integer"} for i in range(60)},
            "additionalProperties": False,
        },
    },
    "required": ["name", "inner"],
    "additionalProperties": False,
}
MID_GENERATION_LIMITS = '{"max_items_in_row": 40}'
