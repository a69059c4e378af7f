"""vLLM's own request fields: ``structured_outputs: {"json": schema}`` (vLLM 0.10.2 on) and
the older ``guided_json`` (dialect ``vllm-guided``, removed in later releases).

Both ride on ``/v1/chat/completions``; vLLM refuses with an OpenAI-style 400. A server that does
not know the field ignores it, so ``--dialect auto`` only picks one that visibly constrained
its probe.
"""

from __future__ import annotations

from typing import Any

from corral.fuzz.dialects.base import ChatCompletions


class VllmStructuredOutputs(ChatCompletions):
    name = "vllm"
    describe = "structured_outputs json (vLLM)"
    hint_markers = ("structured_outputs",)

    def constraint(self, schema: Any) -> dict[str, Any]:
        return {"structured_outputs": {"json": schema}}


class VllmGuidedJson(ChatCompletions):
    name = "vllm-guided"
    describe = "guided_json (vLLM before structured_outputs)"
    hint_markers = ("guided_json",)

    def constraint(self, schema: Any) -> dict[str, Any]:
        return {"guided_json": schema}
