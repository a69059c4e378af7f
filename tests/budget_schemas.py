"""Hypothesis-drawn JSON schemas for the budget-closing tests (grammar, engine).

Leaves with the keywords a closing must satisfy (minLength, bounds, enum, pattern), arrays with
`minItems`, objects with `required`, and the two unions that make a closing pick a branch: an
object whose `oneOf` branches differ only in `required` (Glaiveai2K's calculate_area shape) and
an `anyOf` of objects told apart by a `const` discriminator.
"""

from __future__ import annotations

from hypothesis import strategies as st

# A `oneOf` whose branches differ only in `required` (Glaiveai2K's calculate_area): the closing
# must follow the branch the instance has entered, and must not complete a second branch.
AREA = {
    "type": "object",
    "properties": {
        "shape": {"type": "string"},
        "dimensions": {
            "type": "object",
            "properties": {n: {"type": "number"} for n in ("base", "height", "length", "radius")},
            "oneOf": [
                {"required": ["radius"]},
                {"required": ["length", "base"]},
                {"required": ["base", "height"]},
            ],
        },
    },
    "required": ["shape", "dimensions"],
}
# An `anyOf` told apart by a `const` discriminator, each branch with its own required member.
TAGGED = {
    "type": "array",
    "items": {
        "anyOf": [
            {
                "type": "object",
                "properties": {"kind": {"const": "circle"}, "r": {"type": "integer"}},
                "required": ["kind", "r"],
            },
            {
                "type": "object",
                "properties": {"kind": {"const": "box"}, "w": {"type": "string", "minLength": 2}},
                "required": ["kind", "w"],
            },
        ]
    },
}


NAMES = st.sampled_from(["id", "name", "tags", "a", "b_c", "score", "note"])


def leaf() -> st.SearchStrategy[dict]:
    return st.one_of(
        st.builds(lambda n: {"type": "string", "minLength": n}, st.integers(0, 4)),
        st.builds(
            lambda lo: {"type": "integer", "minimum": lo, "maximum": lo + 1000},
            st.integers(-50, 50),
        ),
        st.just({"type": "boolean"}),
        st.just({"type": "null"}),
        st.just({"enum": ["red", "green", "blue"]}),
        st.just({"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}),
        st.just({"type": "number", "minimum": 1.5}),
        st.builds(  # checked at value boundaries: filled items must differ
            lambda n: {
                "type": "array",
                "items": {"type": "string"},
                "uniqueItems": True,
                "minItems": n,
            },
            st.integers(0, 3),
        ),
        st.builds(  # listed strings that must not repeat: more than arrangements could list
            lambda n: {
                "type": "array",
                "items": {"enum": ["red", "green", "blue", "cyan", "re", "ed"]},
                "uniqueItems": True,
                "minItems": n,
            },
            st.integers(0, 6),
        ),
        st.builds(  # open ranges, some without an integer (the shortest is a decimal)
            lambda lo: {
                "type": "number",
                "exclusiveMinimum": lo / 4,
                "exclusiveMaximum": lo / 4 + 0.5,
            },
            st.integers(-8, 8),
        ),
    )


def _one_of_required(props: dict) -> st.SearchStrategy[dict]:
    """`props` as an object whose `oneOf` branches each require a different set of names."""
    names = sorted(props)
    sets = st.lists(st.sets(st.sampled_from(names), min_size=1, max_size=2), min_size=2)
    return (
        sets.map(lambda s: sorted({tuple(sorted(x)) for x in s}))
        .filter(len)
        .map(
            lambda reqs: {
                "type": "object",
                "properties": props,
                "oneOf": [{"required": list(r)} for r in reqs],
            }
        )
    )


def _tagged(children: st.SearchStrategy[dict]) -> st.SearchStrategy[dict]:
    """An `anyOf` of objects, each with its own `kind` constant and one required member."""
    branch = st.tuples(NAMES, children)
    return st.lists(branch, min_size=2, max_size=3).map(
        lambda bs: {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"kind": {"const": f"k{i}"}, name: child},
                    "required": ["kind", name],
                }
                for i, (name, child) in enumerate(bs)
            ]
        }
    )


def container(children: st.SearchStrategy[dict]) -> st.SearchStrategy[dict]:
    arrays = st.builds(
        lambda items, n: {"type": "array", "items": items, "minItems": n},
        children,
        st.integers(0, 2),
    )
    props = st.dictionaries(NAMES, children, min_size=1, max_size=4)
    objects = props.flatmap(
        lambda p: st.lists(st.sampled_from(sorted(p)), unique=True).map(
            lambda req: {"type": "object", "properties": p, "required": req}
        )
    )
    return st.one_of(arrays, objects, props.flatmap(_one_of_required), _tagged(children))


SCHEMAS = st.recursive(leaf(), container, max_leaves=6).filter(
    lambda s: "type" in s or "anyOf" in s
)


#: found by hypothesis: after `{"a": true,` the branch needing `b_c` is closed, since `b_c` is
#: declared before `a` and the grammar writes declared properties in order
OUT_OF_ORDER = {
    "type": "object",
    "properties": {
        "b_c": {"type": "boolean"},
        "a": {"type": "boolean"},
        "id": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
    },
    "oneOf": [{"required": ["a", "b_c"]}, {"required": ["a", "id"]}],
}
