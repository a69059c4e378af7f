"""From a step's `Schedule` to what the model runs and which of its logits rows are sampled.

Each scheduled sequence feeds the tokens it lacks KV for, then its jump-forward draft (if
any). A sequence whose chunk reaches its last token is sampled: one row at its last real token,
and one after each draft token, so a draft is verified in the same pass (see `jump_forward`).
A constrained sampled sequence also gets a `MaskJob` that fills one bitmask row per row.
A prefill-only sequence (`max_tokens` 0) has no sampling row. Rows for prompt logprobs
(`prompt_logprobs`) come after every sampling row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from corral.engine.constrained.masks import MaskJob
from corral.engine.execution.batch import ForwardBatch
from corral.engine.serving.core import Sequence
from corral.engine.serving.prompt_logprobs import PromptRows, rows_for
from corral.engine.serving.sampler import RowSpec
from corral.engine.serving.scheduler import Schedule


@dataclass
class StepRows:
    """The logits rows one step samples: a `RowSpec` each; the grammar-mask jobs, and the
    logits row (in sampling order) each bitmask row they fill belongs to."""

    specs: list[RowSpec] = field(default_factory=list)
    jobs: list[MaskJob] = field(default_factory=list)
    mask_rows: list[int] = field(default_factory=list)
    prompt: list[PromptRows] = field(default_factory=list)  # after the sampling rows

    def without(self, sitting_out: set[Sequence]) -> tuple[list[int], list[int], StepRows]:
        """The rows left when `sitting_out` sequences skip sampling (their masks missed the
        deadline): the logits rows kept, the bitmask rows kept, and the rows themselves, mask
        rows renumbered to the kept logits."""
        keep = [i for i, spec in enumerate(self.specs) if spec.seq not in sitting_out]
        new_index = {old: new for new, old in enumerate(keep)}
        mask_keep = [j for j, r in enumerate(self.mask_rows) if r in new_index]
        left = StepRows(
            specs=[self.specs[i] for i in keep],
            jobs=[j for j in self.jobs if j.seq not in sitting_out],
            mask_rows=[new_index[self.mask_rows[j]] for j in mask_keep],
            prompt=self.prompt,
        )
        return keep, mask_keep, left


def step_inputs(plan: Schedule) -> tuple[ForwardBatch, StepRows]:
    """The forward batch of `plan` and the rows to sample from its logits."""
    new_ids, kvs, logits_index, prompt_index = [], [], [], []
    rows = StepRows()
    start = 0
    for item in plan.items:
        seq, draft = item.seq, item.seq.draft[: item.draft_len]
        real = item.num_new - item.draft_len
        first = seq.num_computed
        new_ids.append(seq.tokens(first, first + real) + draft)
        kvs.append(seq.kv)
        positions = rows_for(seq, first, first + real)
        if positions:
            prompt_index += [start + p - first for p in positions]
            rows.prompt.append(PromptRows(seq, [seq.prompt_ids[p + 1] for p in positions]))
        if item.sample and not seq.params.prefill_only:
            if seq.matcher is not None:
                rows.jobs.append(MaskJob(seq, draft, len(rows.mask_rows)))
            for i in range(item.draft_len + 1):
                if seq.matcher is not None:
                    rows.mask_rows.append(len(logits_index))
                logits_index.append(start + real - 1 + i)
                rows.specs.append(RowSpec(seq, len(seq.output_ids) + i, draft[:i]))
        start += item.num_new
    index = torch.tensor(logits_index + prompt_index, dtype=torch.int64)
    return ForwardBatch.from_sequences(new_ids, kvs, index), rows
