"""How each kind of server is asked for schema-constrained JSON: one module per dialect.

``--dialect`` names one of :data:`DIALECTS`, or ``auto`` (:mod:`corral.fuzz.dialects.auto`
probes the endpoint once and says which it chose). Each dialect knows how to send a schema, how
to read the output back and how its server refuses (see :class:`~.base.Dialect`).
"""

from __future__ import annotations

from corral.fuzz.dialects.base import ALL_CUT, NO_ANSWER, Dialect
from corral.fuzz.dialects.llama_cpp import LlamaCppPython, LlamaServer
from corral.fuzz.dialects.ollama import Ollama
from corral.fuzz.dialects.openai import OpenAIJsonSchema
from corral.fuzz.dialects.sglang import SglangNative
from corral.fuzz.dialects.tools import Tools
from corral.fuzz.dialects.vllm import VllmGuidedJson, VllmStructuredOutputs

#: Every dialect by name, in the order ``--dialect auto`` tries them (``tools`` is never probed:
#: it is asked for by name, or by ``--via tools``).
DIALECTS: dict[str, Dialect] = {
    d.name: d
    for d in (
        OpenAIJsonSchema(),
        LlamaCppPython(),
        LlamaServer(),
        VllmStructuredOutputs(),
        VllmGuidedJson(),
        Ollama(),
        SglangNative(),
        Tools(),
    )
}
AUTO = "auto"


def hint(reason: str, dialect: str, probed: bool = False) -> str:
    """A next step for a run whose commonest failure was ``reason`` in ``dialect``: more tokens
    or time when those ran out; the dialect a refusal points at (``try --dialect llama-cpp``);
    else ``--dialect auto``, unless the dialect was already chosen by probing."""
    if reason.startswith(ALL_CUT):
        return "raise --max-tokens"
    if reason.startswith(NO_ANSWER):
        return "the server may be overloaded: raise --timeout or lower --concurrency"
    for d in DIALECTS.values():
        if d.name != dialect and any(m in reason for m in d.hint_markers):
            return f"try --dialect {d.name}"
    return "" if probed else "try --dialect auto, which probes the request forms the server takes"
