"""Chat output -> Responses output: Response objects and their stream of typed events.

One translator serves both modes. Streamed, it reads the chat path's chunks as they come and
answers each with Responses events (``response.output_text.delta``,
``response.function_call_arguments.delta``, ...), so tool-call arguments stream here exactly as
far as the chat path streams them. Not streamed, the final chat message is fed to it as a single
delta and only the finished Response is kept: the two modes cannot drift apart.

The chat path's ``reasoning_content`` (a reasoning model's think block) becomes a ``reasoning``
item with one ``reasoning_text`` part, before the message or calls it preceded.

Events follow OpenAI's order: ``response.created``, ``response.in_progress``; per output item
``output_item.added`` (a message or reasoning item also gets ``content_part.added``), its
deltas, their ``done`` events and ``output_item.done``; last ``response.completed``
(``response.incomplete`` when ``max_output_tokens`` cut it, ``error`` then ``response.failed``
when the generation failed).
"""

from __future__ import annotations

import copy
import json
import time
from typing import Any

from corral.api.protocol_responses import ResponsesRequest
from corral.api.responses import new_id
from corral.api.sse import data_event


class ResponseDraft:
    """The Response object being built: request echo, output items, status, usage."""

    def __init__(self, req: ResponsesRequest, model: str) -> None:
        self.id = new_id("resp_")
        self.created_at = int(time.time())
        self.req, self.model = req, model
        self.output: list[dict[str, Any]] = []
        self.status = "in_progress"
        self.incomplete: dict[str, str] | None = None
        self.error: dict[str, Any] | None = None
        self.usage: dict[str, Any] | None = None
        self.unenforced: list[dict[str, Any]] | None = None
        self.receipt: dict[str, Any] | None = None  # the constraint's, as ``corral``

    def set_usage(self, u: dict[str, Any]) -> None:
        """The chat usage in Responses terms. Every prompt token not served from the prefix
        cache is written to it (``cache_write_tokens``)."""
        cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        reasoning = (u.get("completion_tokens_details") or {}).get("reasoning_tokens", 0)
        self.usage = {
            "input_tokens": u["prompt_tokens"],
            "input_tokens_details": {
                "cached_tokens": cached,
                "cache_write_tokens": u["prompt_tokens"] - cached,
            },
            "output_tokens": u["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": u["total_tokens"],
        }
        if u.get("speculative"):  # the extension, as chat reports it
            self.usage["speculative"] = u["speculative"]

    def body(self) -> dict[str, Any]:
        r = self.req
        body = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "error": self.error,
            "incomplete_details": self.incomplete,
            "instructions": r.instructions,
            "max_output_tokens": r.max_output_tokens,
            "model": self.model,
            "output": copy.deepcopy(self.output),
            "parallel_tool_calls": r.parallel_tool_calls,
            "previous_response_id": None,
            "reasoning": None,
            "store": False,
            "background": False,
            "temperature": r.temperature,
            "top_p": r.top_p,
            "text": {"format": r.format()},
            "tool_choice": r.tool_choice or "auto",
            "tools": [_tool_echo(t) for t in r.tools or ()],
            "truncation": "disabled",
            "usage": self.usage,
            "user": r.user,
            "metadata": r.metadata or {},
        }
        if self.unenforced:
            body["unenforced"] = self.unenforced
        if self.receipt:
            body["corral"] = self.receipt
        return body


def _tool_echo(tool: dict[str, Any]) -> dict[str, Any]:
    echo = {"type": "function", "description": None, "parameters": None, "strict": True}
    return echo | {k: v for k, v in tool.items() if v is not None}


#: chat delta field -> (output item type, its content part type, the delta/done event prefix)
_TEXT_KINDS = {
    "reasoning_content": ("reasoning", "reasoning_text", "response.reasoning_text"),
    "content": ("message", "output_text", "response.output_text"),
}


class Translator:
    """Feeds chat deltas into a ``ResponseDraft``; every method returns the SSE events to send.

    At most one text item (a ``reasoning`` item or a ``message``) is open at a time; a delta of
    another kind, or a tool call, closes it."""

    def __init__(self, draft: ResponseDraft) -> None:
        self.draft = draft
        self.seq = 0
        self.started = False
        self._text: dict[str, Any] | None = None  # the open text item, its index, part, kind
        self._calls: dict[int, dict[str, Any]] = {}  # chat tool-call index -> open item

    def event(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return data_event(json.dumps(data, ensure_ascii=False), event=kind)

    def start(self) -> list[str]:
        if self.started:
            return []
        self.started = True
        body = self.draft.body()
        return [
            self.event("response.created", response=body),
            self.event("response.in_progress", response=body),
        ]

    def delta(self, delta: dict[str, Any], finish: str | None) -> list[str]:
        """One chat delta (``reasoning_content``, ``content``, ``tool_calls``) and the choice's
        finish reason, if any."""
        events = self.start()
        for field in _TEXT_KINDS:
            if delta.get(field):
                events += self._text_delta(field, delta[field])
        for call in delta.get("tool_calls") or ():
            events += self._call_delta(call)
        if finish is not None:
            events += self._finish(finish)
        return events

    def _add_item(self, item: dict[str, Any]) -> tuple[int, list[str]]:
        self.draft.output.append(item)
        index = len(self.draft.output) - 1
        return index, [self.event("response.output_item.added", output_index=index, item=item)]

    def _text_delta(self, field: str, text: str) -> list[str]:
        events = []
        if self._text is not None and self._text["field"] != field:
            events += self._close_text("completed")
        if self._text is None:
            events += self._close_calls("completed")
            item_type, part_type, _ = _TEXT_KINDS[field]
            if item_type == "message":
                item = {"id": new_id("msg_"), "type": "message", "status": "in_progress",
                        "role": "assistant", "content": []}  # fmt: skip
                part = {"type": part_type, "text": "", "annotations": [], "logprobs": []}
            else:
                item = {"id": new_id("rs_"), "type": "reasoning", "status": "in_progress",
                        "summary": [], "content": []}  # fmt: skip
                part = {"type": part_type, "text": ""}
            index, added = self._add_item(item)
            item["content"].append(part)
            self._text = {"item": item, "index": index, "part": part, "field": field}
            events += added
            events.append(self._part_event("response.content_part.added", part={**part}))
        self._text["part"]["text"] += text
        prefix = _TEXT_KINDS[field][2]
        extra = {"logprobs": []} if field == "content" else {}
        events.append(self._part_event(f"{prefix}.delta", delta=text, **extra))
        return events

    def _part_event(self, kind: str, **fields: Any) -> str:
        t = self._text
        assert t is not None
        return self.event(
            kind, item_id=t["item"]["id"], output_index=t["index"], content_index=0, **fields
        )

    def _close_text(self, status: str) -> list[str]:
        t, events = self._text, []
        if t is None:
            return events
        part, field = t["part"], t["field"]
        extra = {"logprobs": []} if field == "content" else {}
        prefix = _TEXT_KINDS[field][2]
        events.append(self._part_event(f"{prefix}.done", text=part["text"], **extra))
        events.append(self._part_event("response.content_part.done", part=part))
        t["item"]["status"] = status
        events.append(
            self.event("response.output_item.done", output_index=t["index"], item=t["item"])
        )
        self._text = None
        return events

    def _call_delta(self, call: dict[str, Any]) -> list[str]:
        events: list[str] = []
        k = call.get("index", 0)
        fn = call.get("function") or {}
        if k not in self._calls:
            events += self._close_text("completed")
            item = {"id": new_id("fc_"), "type": "function_call", "status": "in_progress",
                    "call_id": call.get("id") or new_id("call_"), "name": fn.get("name") or "",
                    "arguments": ""}  # fmt: skip
            index, added = self._add_item(item)
            self._calls[k] = {"item": item, "index": index}
            events += added
        open_ = self._calls[k]
        if fn.get("arguments"):
            open_["item"]["arguments"] += fn["arguments"]
            events.append(
                self.event(
                    "response.function_call_arguments.delta",
                    item_id=open_["item"]["id"],
                    output_index=open_["index"],
                    delta=fn["arguments"],
                )
            )
        return events

    def _close_calls(self, status: str) -> list[str]:
        events = []
        for open_ in self._calls.values():
            item, index = open_["item"], open_["index"]
            events.append(
                self.event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
            item["status"] = status
            events.append(self.event("response.output_item.done", output_index=index, item=item))
        self._calls = {}
        return events

    def _finish(self, finish: str) -> list[str]:
        """The choice ended well: close what is open; ``length`` makes it incomplete."""
        status = "incomplete" if finish == "length" else "completed"
        if not self.draft.output:  # an empty answer is still a message, as when not streamed
            events = self._text_delta("content", "")
        else:
            events = []
        events += self._close_text(status) + self._close_calls(status)
        self.draft.status = status
        if finish == "length":
            self.draft.incomplete = {"reason": "max_output_tokens"}
        return events

    def end(self) -> list[str]:
        """The last event: ``response.completed`` or ``response.incomplete``."""
        kind = "response.incomplete" if self.draft.status == "incomplete" else "response.completed"
        return [*self.start(), self.event(kind, response=self.draft.body())]

    def fail(self, error: dict[str, Any]) -> list[str]:
        """The generation failed after the stream began: ``error``, then ``response.failed``."""
        events = self.start()
        self.draft.status = "failed"
        # OpenAI's Response.error.code has a fixed set of values; Corral's code (e.g.
        # constraint_failed) goes in the error event and the message
        self.draft.error = {"code": "server_error", "message": error["message"]}
        events.append(
            self.event(
                "error", code=error.get("code"), message=error["message"], param=error.get("param")
            )
        )
        events.append(self.event("response.failed", response=self.draft.body()))
        return events


def message_delta(message: dict[str, Any]) -> dict[str, Any]:
    """A finished chat message as one delta (tool calls numbered as a stream numbers them)."""
    calls = [{"index": k, **c} for k, c in enumerate(message.get("tool_calls") or ())]
    return {
        "reasoning_content": message.get("reasoning_content"),
        "content": message.get("content"),
        "tool_calls": calls,
    }
