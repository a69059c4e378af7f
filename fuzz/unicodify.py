"""``--unicode``: the same schemas, with hard Unicode strings put where a schema holds text.

Each case gets strings drawn (seeded by the case) from :mod:`corral.fuzz.unicode`'s strategies
(multi-byte, astral, combining marks, right-to-left, escapes), and they go into every place a
schema names text the output must contain:

- ``enum``: one drawn string joins the values;
- ``const`` of a string: replaced by a drawn string;
- ``properties``: one property is renamed to a drawn string without JSON escapes (``required``
  follows);
- ``pattern``: replaced by a drawn string as an anchored literal (``regex_literal``);

and the prompt URL targets send carries one as well. The case is new (id ``…+unicode``, no
corpus instances: they belonged to the old schema), and the judge decides as always.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from corral.fuzz.case import Case
from corral.fuzz.judge import iter_nodes
from corral.fuzz.strategies import draw_examples
from corral.fuzz.unicode import regex_literal, unicode_schemas, unicode_text

DRAWN = 6  # strings of each kind drawn per case


def unicode_case(case: Case) -> Case:
    """``case`` with drawn Unicode strings in its enums, consts, keys and patterns, and in
    the text URL targets add to the prompt."""
    # Hypothesis draws small examples first: the later, larger ones are the ones used
    texts = draw_examples(unicode_text(1, 6), 2 * DRAWN, case.seed)[-DRAWN:]
    names = draw_examples(unicode_text(1, 5, escaped=False), 2 * DRAWN, case.seed + 1)[-DRAWN:]
    values, keys = _cycle(texts), _cycle(names)
    schema = case.schema
    rng = random.Random(case.seed)
    for _, node in list(iter_nodes(schema)):
        _fill(node, values, keys, rng)
    note = f"A note from the user: {next(values)}"
    return Case.from_schema(f"{case.id}+unicode", schema, [], case.source, case.seed, note)


def _cycle(items: list[str]) -> Iterator[str]:
    while True:
        yield from items


def _fill(node: dict, values: Iterator[str], keys: Iterator[str], rng: random.Random) -> None:
    if isinstance(node.get("enum"), list) and (value := next(values)) not in node["enum"]:
        node["enum"] = [*node["enum"], value]
    if isinstance(node.get("const"), str):
        node["const"] = next(values)
    if isinstance(node.get("pattern"), str):
        node["pattern"] = f"^{regex_literal(next(values))}$"
    props = node.get("properties")
    if isinstance(props, dict) and props:
        old, new = rng.choice(sorted(props)), next(keys)
        if new not in props:
            node["properties"] = {(new if k == old else k): v for k, v in props.items()}
            if isinstance(node.get("required"), list):
                node["required"] = [new if r == old else r for r in node["required"]]


def iter_unicode_schemas(seed: int, batch: int = 25) -> Iterator[Case]:
    """Endless schemas from :func:`corral.fuzz.unicode.unicode_schemas` (Unicode keys, enum
    members, const and pattern, each with an instance), deterministic per seed."""
    for b in range(1_000_000):
        drawn = draw_examples(unicode_schemas(), batch, _seed(seed, f"batch{b}"))
        for i, schema in enumerate(drawn):
            name = f"unicode/{b * batch + i}"
            note = f"A note from the user: {schema['required'][0]}"
            yield Case.from_schema(name, schema, [], "hypothesis", _seed(seed, name), note)


def _seed(root: int, name: str) -> int:
    return random.Random(f"{root}:unicode:{name}").randrange(2**31)
