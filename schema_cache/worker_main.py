"""The compile worker process: ``python -m corral.schema_cache.worker_main``.

It talks to its parent over stdin/stdout in frames (a 4-byte little-endian length, then the
bytes); nothing is pickled. The first frames are the tokenizer (a JSON header with the logits
width and EOS ids, then the tokenizer JSON); the worker builds it once, answers
``{"ready": fingerprint}``, and then compiles one request per frame until stdin closes. A reply
is a JSON header frame, followed by the ``CompiledConstraint.to_bytes()`` frame when it is ok.

The parent starts it with ``-P`` (see ``workers.worker_command``), so nothing is imported from
the server's current directory.
"""

from __future__ import annotations

import json
import signal
import sys

import tokenizers
from transformers import PreTrainedTokenizerFast

from corral.grammar import ConstraintError, ConstraintSpec, TokenizerInfo, compile_constraint
from corral.schema_cache.workers import read_frame, spec_from_request, write_frame


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


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # stray prints must not corrupt the frame stream
    header, tokenizer_json = read_frame(stdin), read_frame(stdin)
    if header is None or tokenizer_json is None:
        return
    init = json.loads(header)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer.from_str(tokenizer_json.decode())
    )
    tok = TokenizerInfo.from_hf(hf, vocab_size=init["vocab_size"], eos_token_ids=init["eos"])
    _warm_up(tok)
    write_frame(stdout, json.dumps({"ready": tok.fingerprint}).encode())
    stdout.flush()
    while (frame := read_frame(stdin)) is not None:
        try:
            data = compile_constraint(spec_from_request(json.loads(frame)), tok).to_bytes()
        except ConstraintError as e:
            reply = {
                "status": "refused",
                "reason": e.reason,
                "pointer": e.pointer,
                "keyword": e.keyword,
                "limit": e.limit,
            }
            write_frame(stdout, json.dumps(reply).encode())
        except Exception as e:  # a server bug: reported to the parent, the worker lives on
            reply = {"status": "error", "type": type(e).__name__, "message": str(e)}
            write_frame(stdout, json.dumps(reply).encode())
        else:
            write_frame(stdout, b'{"status": "ok"}')
            write_frame(stdout, data)
        stdout.flush()


if __name__ == "__main__":
    main()
