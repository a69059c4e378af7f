"""LangChain's ChatOpenAI (langchain-openai, from PyPI) against a real `corral serve`.

Tools bound with ``bind_tools`` and structured output (``function_calling`` and ``json_schema``)
go through LangChain's own request building and response parsing, over both OpenAI APIs: chat
completions and (``use_responses_api=True``) /v1/responses. Every argument set and structured
result is judged by `jsonschema` against the schema LangChain sent.
"""

from __future__ import annotations

import jsonschema
import pytest
from pydantic import BaseModel, Field

langchain_openai = pytest.importorskip("langchain_openai")


class GetWeather(BaseModel):
    """Current weather in a city."""

    city: str = Field(description="the city's name")
    unit: str = Field(description="c or f", pattern="^[cf]$")


class Person(BaseModel):
    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=120)


def _schema(model: type[BaseModel]) -> dict:
    return model.model_json_schema()


@pytest.fixture(scope="module", params=[False, True], ids=["chat", "responses"])
def llm(request, server):
    return langchain_openai.ChatOpenAI(
        model=server.model,
        base_url=server.url + "/v1",
        api_key=server.api_key,
        temperature=0,
        max_tokens=60,
        max_retries=0,
        use_responses_api=request.param,
    )


def test_bind_tools_forced_call(llm):
    bound = llm.bind_tools([GetWeather], tool_choice="GetWeather")
    message = bound.invoke("What is the weather in Paris, in celsius?")
    assert message.tool_calls, message
    for call in message.tool_calls:
        assert call["name"] == "GetWeather" and call["id"]
        jsonschema.validate(call["args"], _schema(GetWeather))


def test_streamed_tool_call_chunks(llm):
    bound = llm.bind_tools([GetWeather], tool_choice="GetWeather")
    chunks = list(bound.stream("Weather in Oslo?"))
    message = chunks[0]
    for chunk in chunks[1:]:
        message = message + chunk
    (call,) = message.tool_calls
    assert call["name"] == "GetWeather"
    jsonschema.validate(call["args"], _schema(GetWeather))


@pytest.mark.parametrize("method", ["function_calling", "json_schema"])
def test_structured_output(llm, method):
    structured = llm.with_structured_output(Person, method=method, include_raw=True)
    out = structured.invoke("Invent a person with a name and an age.")
    assert out["parsing_error"] is None, out["raw"]
    person = out["parsed"]
    assert isinstance(person, Person)
    jsonschema.validate(person.model_dump(), _schema(Person))
