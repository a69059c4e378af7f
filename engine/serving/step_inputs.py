"""From a step's `Schedule` to what the model runs and which of its logits rows are sampled.

Each scheduled sequence feeds the tokens it lacks KV for, then its jump-forward draft (if
any). A sequence whose chunk reaches its last token is sampled: one row at its last real token,
and one after each draft token, so a draft is verified in the same pass (see `jump_forward`).
A constrained sampled sequence also gets a `MaskJob` that fills one bitmask row per row.
A prefill-only sequence (`max_tokens` 0) has no sampling row. Rows for prompt logprobs
(`prompt_logprobs`) come after every sampling row.

Drafts as decode rows. A decoding sequence that feeds several tokens (its sampled token, forced
tokens, a draft) enters the batch as that many one-token rows, row i attending over the slots
of the tokens up to its own (`ForwardBatch` takes a row's position from its slot count). Every
attention backend stores all of a step's new K/V before any row attends, so this is the same
causal attention as one extend span, but the step stays decode-only: on the CPU it keeps the
fused decode path (`kernels.fused_decode`, one C call per layer; an extend step runs the layers
one by one, several times slower for a small batch), on CUDA its rows replay the decode graphs
(`execution.cuda_graphs`), and each verification row is computed by the same kernels as the
token-by-token decode it stands for. Prompt chunks (and rows past `FLAT_MAX`) stay extend spans.

Switched off for now (`FLAT_MAX = 0`: every draft is fed as an extend span, as before speculation
came). With it on, `tests/api/test_api_failures.py::test_logprobs_under_a_schema_are_finite_and_
agree_streamed_or_not[2]` failed: the same greedy request, streamed and not, returned the same
tokens with logprobs up to 0.034 apart, so a token's value depended on how its step was grouped.
Until that is understood, drafts take the extend path, whose values that test pins.
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

FLAT_MAX = 0  # most tokens of one decoding sequence fed as one-token rows (off: see above)


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
        fed = seq.tokens(first, first + real) + draft
        if 1 < len(fed) <= FLAT_MAX and not seq.prefilling and seq.kv is not None:
            kv = seq.kv  # the slots of every fed token are its last len(fed) entries
            base = int(kv.numel()) - len(fed)
            new_ids += [[t] for t in fed]
            kvs += [kv[: base + i + 1] for i in range(len(fed))]
        else:
            new_ids.append(fed)
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
