"""Two servers in one process (fleet replicas, tests) keep their own state: each ``ServerState``
owns its schema forms and its constraint runtime, and the request path reaches them only
through the state it is given (no server is started here: the states are built directly)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from corral.api.config import ServerConfig
from corral.api.protocol import ChatCompletionRequest
from corral.api.request_constraint import chat_constraint
from corral.api.request_params import with_budget_close
from corral.api.state import ServerState
from corral.api.tool_formats import GENERIC
from corral.engine import SamplingParams
from corral.grammar.core.runtime import ConstraintRuntime

SCHEMA = {"type": "object", "properties": {"two_servers": {"type": "integer"}}}


def request(schema) -> ChatCompletionRequest:
    rf = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "response_format": rf}
    return ChatCompletionRequest.model_validate(body)


@pytest.fixture
def servers(llama3_tokenizer):
    def server() -> ServerState:
        return ServerState(
            config=ServerConfig(),
            model_name="m",
            context_length=8192,
            kv_capacity=8192,
            tokenizer=llama3_tokenizer.hf_tokenizer,
            engine=SimpleNamespace(stats=dict),
            compile_fn=None,  # type: ignore[arg-type]
            compile_stats=dict,
            runtime=ConstraintRuntime(llama3_tokenizer),
        )

    return server(), server()


def derive(state: ServerState, schema=SCHEMA):
    _, constraint = chat_constraint(request(schema), state.config, GENERIC, state.forms)
    return constraint.spec


def test_each_server_remembers_its_own_schema_forms(servers):
    a, b = servers
    assert a.forms is not b.forms and a.runtime is not b.runtime
    first = derive(a)
    assert a.forms.snapshot() == {"derived": 1, "remembered": 0, "seeded": 0}
    assert derive(a) is first
    assert a.forms.snapshot() == {"derived": 1, "remembered": 1, "seeded": 0}
    other = derive(b)  # derived again: nothing of a's is seen by b
    assert other is not first and other.digest == first.digest
    assert b.forms.snapshot() == {"derived": 1, "remembered": 0, "seeded": 0}
    assert a.forms.snapshot()["derived"] == 1


def test_a_seeded_form_seeds_only_the_server_it_is_given_to(servers):
    a, b = servers
    spec = derive(a)
    published = json.loads(json.dumps(a.forms.describe(spec)))
    b.forms.seed(spec, published)
    assert b.forms.snapshot() == {"derived": 0, "remembered": 0, "seeded": 1}
    assert derive(b) is spec
    assert a.forms.snapshot() == {"derived": 1, "remembered": 0, "seeded": 0}


def test_each_server_builds_and_keeps_its_own_budget_closers(servers):
    a, b = servers
    req = request(SCHEMA)
    spec = derive(a)
    mine = with_budget_close(a, SamplingParams(), req, spec).budget_close
    assert mine is not None and mine.tokenizer is a.runtime.tokenizer
    assert with_budget_close(a, SamplingParams(), req, spec).budget_close is mine
    theirs = with_budget_close(b, SamplingParams(), req, spec).budget_close
    assert theirs is not mine and theirs.closer is not mine.closer
    assert a.runtime.stats() == b.runtime.stats() == {"budget_closers": 1}
    opted_out = request(SCHEMA).model_copy(update={"budget_close": False})
    assert with_budget_close(a, SamplingParams(), opted_out, spec).budget_close is None
