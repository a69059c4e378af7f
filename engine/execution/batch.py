"""ForwardBatch: one forward step over several sequences, as the model runner takes it.

It lives apart from the runner so that what runs a batch (`model_runner`, `cuda_graphs`) and
what builds one (`serving.step_inputs`) share the type without importing each other.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class ForwardBatch:
    """One forward step over several sequences, flattened.

    Invariants: `len(input_ids) == len(positions) == len(out_slots) == sum(extend_lens)`; the new
    tokens of sequence `s` are rows `sum(extend_lens[:s]) : sum(extend_lens[:s+1])`, and they are
    the last `extend_lens[s]` entries of `seq_kv_indices[s]` (whose earlier entries are the
    sequence's cached prefix, in position order).
    """

    input_ids: torch.Tensor  # int64 [T]
    positions: torch.Tensor  # int64 [T]
    out_slots: torch.Tensor  # int64 [T]
    seq_kv_indices: list[torch.Tensor]
    extend_lens: list[int]
    logits_index: torch.Tensor  # int64 [R]
    # Overlap scheduling: (positions in input_ids, rows of the previous step's sampled tokens)
    # of input tokens not known on the host yet (`engine.overlap`); `forward` fills them in.
    pending: tuple[torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def from_sequences(
        cls,
        new_token_ids: Sequence[Sequence[int]],
        seq_kv_indices: Sequence[torch.Tensor],
        logits_index: torch.Tensor | None = None,
    ) -> ForwardBatch:
        """Build a batch where sequence `s` extends its cached prefix by `new_token_ids[s]`.

        Positions continue from the prefix length; `logits_index` defaults to the last new token
        of every sequence.
        """
        if len(new_token_ids) != len(seq_kv_indices):
            raise ValueError("one list of new token ids per sequence is required")
        # Plain Python lists, one tensor each at the end: a decode step of 32 sequences would
        # otherwise cost a few hundred tiny tensor ops.
        ids, pos, slot_parts, lens = [], [], [], []
        for toks, kv in zip(new_token_ids, seq_kv_indices, strict=True):
            n, total = len(toks), int(kv.numel())
            if not 0 < n <= total:
                raise ValueError(f"sequence extends by {n} tokens but has {total} KV slots")
            ids.extend(toks)
            pos.extend(range(total - n, total))
            slot_parts.append(kv[total - n :])
            lens.append(n)
        ends = list(itertools.accumulate(lens))
        return cls(
            input_ids=torch.tensor(ids, dtype=torch.int64),
            positions=torch.tensor(pos, dtype=torch.int64),
            out_slots=torch.cat(slot_parts).to(torch.int64),
            seq_kv_indices=[kv.to(torch.int64) for kv in seq_kv_indices],
            extend_lens=lens,
            logits_index=(
                torch.tensor(ends, dtype=torch.int64) - 1 if logits_index is None else logits_index
            ),
        )

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())


def fill_pending(
    input_ids: torch.Tensor, batch: ForwardBatch, prev: torch.Tensor | None, dev: torch.device
) -> None:
    """Write the previous step's sampled tokens (on the device) into `input_ids` where
    `batch.pending` says they go (overlap scheduling)."""
    if batch.pending is not None:
        at, rows = (t.to(dev, non_blocking=True) for t in batch.pending)
        # -1 (a row with no allowed token) fails its sequence; feed a harmless id meanwhile
        input_ids[at] = prev[rows].to(input_ids.dtype).clamp_(min=0)
