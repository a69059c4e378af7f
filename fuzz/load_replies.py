"""Reading one answer from any of Corral's endpoints, streamed or not, into a `Reply`.

Chat completions, completions and Responses answer with different shapes (and different
server-sent events); the soak's judges see one: the text, the tool calls, how it finished
("stop", "length" or "tool_calls"), and any error. `send` may hang up mid-stream on purpose:
then it returns None.
"""

from __future__ import annotations

import json

import httpx

from corral.fuzz.load_kinds import Reply


def _chat_message(body: dict) -> Reply:
    choice = body["choices"][0]
    msg = choice["message"]
    calls = [
        (c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls") or []
    ]
    return Reply(200, msg.get("content") or "", calls, choice["finish_reason"])


def _completion(body: dict) -> Reply:
    choice = body["choices"][0]
    return Reply(200, choice["text"], None, choice["finish_reason"])


def _response(body: dict) -> Reply:
    """A Response object: `completed` is "stop" (or "tool_calls"), `incomplete` is "length"."""
    text, calls = "", []
    for item in body.get("output", []):
        if item["type"] == "message":
            text += "".join(p.get("text", "") for p in item["content"])
        elif item["type"] == "function_call":
            calls.append((item["name"], item["arguments"]))
    status = body["status"]
    finish = {"completed": "tool_calls" if calls else "stop", "incomplete": "length"}.get(status)
    error = None if finish else f"response status {status}: {body.get('error')}"
    return Reply(200, text, calls, finish or status, error)


def parse(path: str, body: dict) -> Reply:
    if path.endswith("/chat/completions"):
        return _chat_message(body)
    if path.endswith("/completions"):
        return _completion(body)
    if path.endswith("/responses"):
        return _response(body)
    return Reply(200, body=body)


class _Stream:
    """Events of one stream folded into a `Reply`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.reply = Reply(200, "", [])
        self.pieces: dict[int, list[str]] = {}  # chat tool-call index -> [name, arguments]

    def add(self, event: dict) -> None:
        r = self.reply
        if "error" in event and self.path.endswith("/completions"):
            r.error = f"error event: {event['error']}"
        elif self.path.endswith("/responses"):
            if event["type"] == "error":
                r.error = f"error event: {event.get('code')} {event.get('message')}"
            elif event["type"] in ("response.completed", "response.incomplete", "response.failed"):
                final = _response(event["response"])
                r.text, r.calls, r.finish = final.text, final.calls, final.finish
                r.error = r.error or final.error
        else:
            for c in event.get("choices", []):
                r.finish = c.get("finish_reason") or r.finish
                if "text" in c:
                    r.text += c["text"] or ""
                    continue
                delta = c.get("delta") or {}
                r.text += delta.get("content") or ""
                for call in delta.get("tool_calls") or []:
                    name_args = self.pieces.setdefault(call["index"], ["", ""])
                    fn = call.get("function") or {}
                    name_args[0] += fn.get("name") or ""
                    name_args[1] += fn.get("arguments") or ""

    def done(self) -> Reply:
        if self.pieces:
            self.reply.calls = [tuple(self.pieces[i]) for i in sorted(self.pieces)]
        return self.reply


async def send(
    client: httpx.AsyncClient, path: str, body: dict, hang_up_after: int | None = None
) -> Reply | None:
    """POST `body`; a streamed answer is read event by event (None: hung up after that many)."""
    if not body.get("stream"):
        r = await client.post(path, json=body)
        if r.status_code != 200:
            return Reply(r.status_code, error=r.text[:500])
        return parse(path, r.json())
    folded, events = _Stream(path), 0
    async with client.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            return Reply(r.status_code, error=(await r.aread()).decode(errors="replace")[:500])
        async for line in r.aiter_lines():
            if hang_up_after is not None and events >= hang_up_after:
                return None  # leaving the block closes the connection mid-stream
            if not line.startswith("data: "):
                continue
            events += 1
            if line == "data: [DONE]":
                break
            folded.add(json.loads(line[6:]))
    return folded.done()
