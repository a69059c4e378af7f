"""Schema forms (``api.schema_forms``): a schema sent again, here or to another replica, is not
measured, closed and canonicalised again, and what is remembered is exactly what the derivation
gives. Real MaskBench schemas through the request path (``chat_constraint``); the limits still
apply to a remembered form; published forms survive JSON and malformed ones are ignored."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from corral.api.config import ServerConfig
from corral.api.errors import ApiError
from corral.api.protocol import ChatCompletionRequest
from corral.api.request_constraint import chat_constraint
from corral.api.schema_forms import SchemaForms, form_of
from corral.api.tool_formats import GENERIC
from corral.grammar import ConstraintSpec

CORPUS = Path(__file__).resolve().parents[3] / "shared" / "corpora" / "maskbench"
#: The schema forms of the server these requests are derived for (a server's ``state.forms``).
FORMS = SchemaForms()


def request(schema, **fields) -> ChatCompletionRequest:
    rf = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, **fields}}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "response_format": rf}
    return ChatCompletionRequest.model_validate(body)


def derived(schema, config: ServerConfig, **fields):
    """The constraint, and its rewrites, of a request for ``schema`` (a fresh parse each time)."""
    _, constraint = chat_constraint(request(schema, **fields), config, GENERIC, FORMS)
    return constraint.spec, constraint.rewrites


def corpus_schemas(n: int) -> list[dict]:
    files = sorted(CORPUS.glob("*.json"))
    return [json.loads(p.read_text())["schema"] for p in random.Random(7).sample(files, n)]


@pytest.mark.parametrize("open_objects", [False, True])
def test_a_remembered_form_is_exactly_the_derived_constraint(open_objects) -> None:
    """Every schema twice: the second request is a remembered form whose spec is the first's
    (same object, same digest) with the same rewrites; a fresh derivation, bypassing the memo
    with a copy in another key order, gives the same digest."""
    config = ServerConfig(open_objects=open_objects)
    checked = 0
    for schema in corpus_schemas(40):
        try:
            first, rewrites = derived(schema, config)
        except ApiError:
            continue  # refused (a limit or a bad schema): nothing is remembered
        before = dict(FORMS.counts)
        again, rewrites_again = derived(schema, config)
        assert FORMS.counts["remembered"] == before["remembered"] + 1
        assert FORMS.counts["derived"] == before["derived"]
        assert again is first and rewrites_again == rewrites
        checked += 1
        if isinstance(schema, dict) and len(schema) > 1:
            reordered = dict(reversed(list(schema.items())))
            assert form_of(reordered) != form_of(schema)
            fresh, _ = derived(reordered, config)
            assert FORMS.counts["derived"] == before["derived"] + 1
            assert fresh.digest == first.digest
    assert checked >= 30  # most of the sample is served, not refused


def test_flags_that_shape_the_spec_are_part_of_the_form() -> None:
    """strict / lenient, closed / open objects and the whitespace layout are separate forms of
    the same schema: each gets its own spec."""
    schema = {"type": "object", "properties": {"flag_form_a": {"type": "integer"}}}
    closed, _ = derived(schema, ServerConfig())
    lenient, _ = derived(schema, ServerConfig(), strict=False)
    opened, _ = derived(schema, ServerConfig(open_objects=True))
    assert len({closed.digest, lenient.digest, opened.digest}) == 3
    assert closed.schema()["additionalProperties"] is False
    assert "additionalProperties" not in opened.schema()
    assert derived(schema, ServerConfig())[0] is closed


def test_the_limits_still_apply_to_a_remembered_form() -> None:
    """The stats are remembered, not the verdict: a server with a lower limit refuses the
    schema another configuration served."""
    schema = {
        "type": "object",
        "properties": {f"limit_p{i}": {"type": "string"} for i in range(50)},
    }
    derived(schema, ServerConfig())
    with pytest.raises(ApiError) as refused:
        derived(schema, ServerConfig(max_schema_properties=10))
    assert refused.value.status == 400 and "max_schema_properties" in refused.value.message


def test_a_schema_too_deep_to_serialise_is_refused_by_its_depth_limit() -> None:
    """``json.dumps`` recurses: a schema 5,000 levels deep has no form, is measured without one
    (iteratively) and gets the depth limit's 400, never a RecursionError."""
    deep: dict = {}
    node = deep
    for _ in range(5000):
        node["items"] = {}
        node = node["items"]
    assert form_of(deep) is None
    with pytest.raises(ApiError) as refused:
        derived(deep, ServerConfig())
    assert refused.value.status == 400 and "max_schema_depth" in refused.value.message


def test_a_schema_with_a_nan_const_has_a_form() -> None:
    """Python's JSON parser takes NaN; the form is still computed (the analysis decides)."""
    assert len(form_of({"const": float("nan")})) == 64


def test_published_forms_survive_json_and_seed_another_replica() -> None:
    """What ``describe`` publishes, through JSON, seeds a fresh process's forms: the same key
    gives the spec it was announced with; a spec derived here is described, one not is not."""
    here, there = SchemaForms(), SchemaForms()
    schema = {"type": "object", "properties": {"seeded": {"type": "boolean"}}}
    spec = ConstraintSpec.json_schema(schema)
    key = (form_of(schema), True, True, False)
    here.stats(key[0], schema)
    here.remember(key, spec, True)
    published = json.loads(json.dumps(here.describe(spec)))
    assert published and here.describe(ConstraintSpec.json_schema({"type": "string"})) == {}
    there.seed(spec, published)
    assert there.spec(key) == (spec, True)
    assert there.stats(key[0], {"not": "measured again"}) == here.stats(key[0], schema)
    assert there.counts == {"derived": 0, "remembered": 1, "seeded": 1}


@pytest.mark.parametrize(
    "item",
    [
        "not a list",
        ["short", True, True, False, False, [1, 1, [], 0, 0]],  # not a sha256
        ["a" * 64, "yes", True, False, False, [1, 1, [], 0, 0]],  # a flag that is not a bool
        ["a" * 64, True, True, False, False, [-1, 1, [], 0, 0]],  # a negative size
        ["a" * 64, True, True, False, False, [1, 1, [{"x": 1}], 0, 0]],  # a bad path
        ["a" * 64, True, True, False, False, [1, 1, []]],  # stats cut short
    ],
)
def test_malformed_published_forms_are_ignored(item) -> None:
    forms = SchemaForms()
    spec = ConstraintSpec.json_schema({"type": "string"})
    forms.seed(spec, {"forms": [item]})
    forms.seed(spec, {"forms": "not a list of forms"})
    assert forms.counts["seeded"] == 0 and forms.spec(("a" * 64, True, True, False)) is None


def test_forms_are_bounded_by_the_spec_text_they_hold() -> None:
    forms = SchemaForms(max_bytes=4000)
    keys = []
    for i in range(20):
        schema = {"type": "object", "properties": {f"bounded_{i}_{'x' * 200}": {"type": "null"}}}
        key = (form_of(schema), True, True, False)
        forms.remember(key, ConstraintSpec.json_schema(schema), False)
        keys.append(key)
    assert forms.spec(keys[-1]) is not None and forms.spec(keys[0]) is None
    assert sum(len(forms.spec(k)[0].source) for k in keys if forms.spec(k)) <= 4000
