"""The compile worker process: ``python -P -m corral.schema_cache.worker_main``.

It talks to its parent through :func:`corral.base.supervisor.child_channel`, in frames; nothing is
pickled. The first frames are the tokenizer (a JSON header with the logits width and EOS ids,
then the tokenizer JSON); the worker builds it once, answers ``{"ready": fingerprint}``, and
then compiles one request per frame until stdin closes. A reply is a JSON header frame, followed
by the ``CompiledConstraint.to_bytes()`` frame when it is ok.
"""

from __future__ import annotations

import json

import tokenizers
from transformers import PreTrainedTokenizerFast

from corral.base.heap import freeze_startup_heap
from corral.base.supervisor import child_channel
from corral.grammar import ConstraintError, ConstraintSpec, TokenizerInfo, compile_constraint
from corral.schema_cache.workers import ready_message, spec_from_request


def _warm_up(tok: TokenizerInfo) -> None:
    """Build both backends' tokenizer views and load every compile path before saying ready.

    The first compile of each kind imports modules and builds caches; doing that now keeps
    start-up work out of every compile's deadline.
    """
    _ = tok.llguidance, tok.xgrammar
    for spec in (
        ConstraintSpec.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}}),
        ConstraintSpec.regex("[a-z]+"),
        ConstraintSpec.ebnf('root ::= "a" | "b"'),
    ):
        compile_constraint(spec, tok)


def _compile_reply(request: bytes, tok: TokenizerInfo) -> list[bytes]:
    """The reply frames to one compile request."""
    try:
        data = compile_constraint(spec_from_request(json.loads(request)), tok).to_bytes()
    except ConstraintError as e:
        reply = {
            "status": "refused",
            "reason": e.reason,
            "pointer": e.pointer,
            "keyword": e.keyword,
            "limit": e.limit,
        }
        return [json.dumps(reply).encode()]
    except Exception as e:  # a server bug: reported to the parent, the worker lives on
        reply = {"status": "error", "type": type(e).__name__, "message": str(e)}
        return [json.dumps(reply).encode()]
    return [b'{"status": "ok"}', data]


def main() -> None:
    channel = child_channel()
    header, tokenizer_json = channel.recv(), channel.recv()
    if header is None or tokenizer_json is None:
        return
    init = json.loads(header)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer.from_str(tokenizer_json.decode())
    )
    tok = TokenizerInfo.from_hf(hf, vocab_size=init["vocab_size"], eos_token_ids=init["eos"])
    _warm_up(tok)
    freeze_startup_heap()  # a full collection would walk it all inside some compile
    channel.send(ready_message(tok))
    while (request := channel.recv()) is not None:
        channel.send(*_compile_reply(request, tok))


if __name__ == "__main__":
    main()
