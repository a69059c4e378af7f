"""A forced tool call: the schema is the ``parameters`` of the one strict function that
``tool_choice`` names, and the call's ``arguments`` are judged.

An answer without exactly one call to that function is unsound (the server broke the tool
choice), reported as ``wrong-call``.
"""

from __future__ import annotations

from typing import Any

from corral.fuzz.dialects.base import OK, WRONG_CALL, ChatCompletions, Reply

TOOL_NAME = "fuzz_call"


class Tools(ChatCompletions):
    name = "tools"
    describe = (
        f"tool_choice naming one function ({TOOL_NAME}, strict true) whose parameters are the "
        "schema; its arguments are judged"
    )
    hint_markers = ("tool_choice",)

    def constraint(self, schema: Any) -> dict[str, Any]:
        function = {
            "name": TOOL_NAME,
            "description": "Call with arguments that match the schema",
            "parameters": schema,
            "strict": True,
        }
        return {
            "tools": [{"type": "function", "function": function}],
            "tool_choice": {"type": "function", "function": {"name": TOOL_NAME}},
            "parallel_tool_calls": False,
        }

    def output(self, message: dict) -> Reply:
        return arguments(message)


def arguments(message: dict) -> Reply:
    """The arguments of the one call to the named function; anything else is a wrong call."""
    calls = message.get("tool_calls") or []
    if len(calls) != 1 or (calls[0].get("function") or {}).get("name") != TOOL_NAME:
        names = [(c.get("function") or {}).get("name") for c in calls]
        return Reply(
            WRONG_CALL,
            f"tool_choice named {TOOL_NAME} but the answer called {names or 'no function'} "
            f"(content: {str(message.get('content'))[:200]!r})",
        )
    return Reply(OK, calls[0]["function"].get("arguments") or "")
