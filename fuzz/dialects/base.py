"""What a dialect is: how one kind of server is asked for JSON under a schema, how its answer is
read back, and how it says no.

A dialect builds the request body (:meth:`Dialect.body`) and reads the reply
(:meth:`Dialect.read`) into a :class:`Reply` whose ``kind`` is one of:

- ``ok``: the output to judge (``text``);
- ``length``: cut by the token limit, not judged;
- ``refused``: the server declined the schema or the request form (``text`` says why); a
  refusal is honest, it is neither a finding nor an error;
- ``error``: anything else that is not an answer (a 5xx the dialect does not know as a refusal,
  a body of the wrong shape);
- ``wrong-call``: the ``tools`` dialect only: the answer did not call the named function once;
- ``hang``: no answer in time (the transport's verdict, never a dialect's).

Transport (the HTTP client, concurrency, rate, timeouts) is not a dialect's business; see
:mod:`corral.fuzz.http_target`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

OK, LENGTH, REFUSED, ERROR, WRONG_CALL = "ok", "length", "refused", "error", "wrong-call"
HANG = "hang"
REASON_CHARS = 300
#: How a schema that was not judged for want of time or tokens is reasoned (the exit hint
#: reads them).
NO_ANSWER = "no answer within"
ALL_CUT = "every output was cut by max_tokens"


class EndpointError(RuntimeError):
    """The endpoint cannot be used at all (unreachable, no model listed, no dialect works)."""


@dataclass(frozen=True)
class Sampling:
    temperature: float
    max_tokens: int
    seed: int


@dataclass(frozen=True)
class Reply:
    kind: str
    text: str  # the output when ``kind`` is ok, else the reason


def error_text(text: str) -> str:
    """The message inside a JSON error body (OpenAI's ``{"error": {"message"}}``, vLLM's
    ``{"message"}``, Ollama's ``{"error": "..."}``), else the body, on one line."""
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        err = doc.get("error", doc)
        msg = err.get("message") if isinstance(err, dict) else err
        if isinstance(msg, str) and msg:
            text = msg
    return " ".join(text.split())[:REASON_CHARS]


class Dialect:
    """One server's way of taking a schema. Subclasses set the class attributes and
    :meth:`body`; the OpenAI-style ones share :class:`ChatCompletions`."""

    name = ""
    describe = ""  # what the report prints as "constrained by"
    path = ""  # POST path below the base URL
    under_v1 = True  # the base URL ends in /v1 (OpenAI style) or is the server's root
    models_path: str | None = "/models"  # GET below the base URL that names the models
    #: Substrings of another dialect's refusal that suggest this dialect (the exit hint).
    hint_markers: tuple[str, ...] = ()

    def body(self, model: str | None, messages: list[dict], schema: Any, s: Sampling) -> dict:
        raise NotImplementedError

    def read(self, status: int, text: str) -> Reply:
        raise NotImplementedError

    def first_model(self, doc: Any) -> str:
        """The model named by the ``models_path`` reply (OpenAI's ``data[0].id``)."""
        return doc["data"][0]["id"]

    def refusal(self, status: int, text: str) -> str | None:
        """Why the server refused, when ``status``/``text`` is this server's refusal; a 4xx by
        default. Servers that refuse with a 5xx override it."""
        if 400 <= status < 500:
            return f"HTTP {status}: {error_text(text)}"
        return None


class ChatCompletions(Dialect):
    """``POST /v1/chat/completions``: the answer is ``choices[0].message``; subclasses say how
    the schema goes in (:meth:`constraint`) and may read the message differently."""

    path = "/chat/completions"

    def constraint(self, schema: Any) -> dict[str, Any]:
        raise NotImplementedError

    def body(self, model: str | None, messages: list[dict], schema: Any, s: Sampling) -> dict:
        return {
            "model": model,
            "messages": messages,
            **self.constraint(schema),
            "temperature": s.temperature,
            "max_tokens": s.max_tokens,
            "seed": s.seed,
        }

    def read(self, status: int, text: str) -> Reply:
        if (why := self.refusal(status, text)) is not None:
            return Reply(REFUSED, why)
        if status != 200:
            return Reply(ERROR, f"HTTP {status}: {error_text(text)}")
        try:
            choice = json.loads(text)["choices"][0]
            message = choice["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            return Reply(ERROR, f"not an OpenAI chat completion: {text[:REASON_CHARS]}")
        if choice.get("finish_reason") == "length":
            return Reply(LENGTH, "")
        return self.output(message)

    def output(self, message: dict) -> Reply:
        return Reply(OK, message.get("content") or "")
