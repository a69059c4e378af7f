"""The synchronous engine: a step is schedule -> run -> postprocess.

    plan = scheduler.schedule()                  # policy: who runs, how many tokens, slots
    logits = runner.forward(batch)               # meanwhile: grammar masks on a worker thread
    outputs = postprocess(plan, sample(logits))  # accept tokens, finish, detokenize, emit

Usable directly (tests, benches) or from `AsyncEngine`'s background thread. Not thread-safe:
one thread calls `add_request`, `abort` and `step`.

Fault isolation. Work tied to one sequence (its matcher's fill/accept/rollback/forced tokens,
its detokenizer, its drafts) runs under a per-sequence guard: an exception there ends that
sequence with finish reason "error" (`EngineFailure` "constraint_failed" when its matcher is in
an unrecoverable error state, "sequence_failed" otherwise), frees its KV, and the step goes on
for the others. An exception anywhere else in `step` (scheduler, forward, sampler) propagates:
`AsyncEngine` then fails every live sequence (`fail_all`) and `reset`s the engine.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from collections import Counter

import torch

from corral.engine.cache_manager import CacheManager
from corral.engine.config import EngineConfig
from corral.engine.constraints import MaskFiller, MaskJob
from corral.engine.core import (
    Completion,
    EngineFailure,
    Output,
    RequestError,
    SamplingParams,
    Sequence,
    SequenceFailed,
)
from corral.engine.detokenize import Detokenizer
from corral.engine.faults import Faults
from corral.engine.jump_forward import DraftHints, forced_token, lookup_draft, make_draft
from corral.engine.model_runner import ForwardBatch
from corral.engine.postprocess import Postprocessor
from corral.engine.sampling import RowSpec, sample_rows
from corral.engine.scheduler import Schedule, ScheduledSeq, Scheduler
from corral.engine.stats import collect
from corral.engine.validate import validate_constraint, validate_prompt

log = logging.getLogger(__name__)

_SEED_MIX = 0x9E3779B97F4A7C15  # spreads the seeds of an n > 1 request's choices apart


class Engine:
    """Continuous batching with a radix prefix cache, constraints and jump-forward."""

    def __init__(
        self, model, config: EngineConfig | None = None, tokenizer_fingerprint: str | None = None
    ) -> None:
        """`model` is an `assets.LoadedModel` (runner, tokenizer, eos_token_ids, ...).
        `tokenizer_fingerprint`: the model tokenizer's (`TokenizerInfo.fingerprint`); when
        given, constraints compiled for any other tokenizer are refused."""
        self.config = config or EngineConfig()
        self.tokenizer_fingerprint = tokenizer_fingerprint
        self.faults = Faults.from_config(self.config.faults)
        torch.set_num_threads(self.config.threads)
        self.model = model
        self.runner = model.runner
        self.tokenizer = model.tokenizer
        self.vocab_size = self.runner.config.vocab_size
        self.pool = self.runner.kv_pool_from_budget(self.config.kv_cache_bytes)
        self.cache = CacheManager(self.pool, self.config.prefix_cache)
        self.scheduler = Scheduler(self.config, self.cache)
        self.masks = MaskFiller(self.vocab_size)
        self.hints = DraftHints(self.tokenizer)
        self._force_mask = torch.empty(1, self.masks.words, dtype=torch.int32)
        limit = self.config.max_model_len or model.max_position_embeddings
        self.max_model_len = min(limit, model.max_position_embeddings)
        self.eos = frozenset(model.eos_token_ids)
        self.post = Postprocessor(self.eos, self.max_model_len)
        self.counters: Counter[str] = Counter()
        self._requests: dict[str, list[Sequence]] = {}
        self._ids = itertools.count()
        self._batches = 0  # steps that ran a batch (what CORRAL_FAULTS counts)

    # ---- requests --------------------------------------------------------------------------

    def add_request(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        constraint=None,
        request_id: str | None = None,
    ) -> str:
        """Queue a request (a `CompiledConstraint` or None); returns its id.

        Raises `RequestError` for a client mistake: empty prompt, unknown token ids, a prompt +
        max_tokens beyond the context length or the KV cache, a duplicate request id, a
        constraint compiled for another tokenizer. Every choice is built before any is queued,
        so a failure (e.g. `constraint.matcher()` raising) leaves nothing behind.
        """
        params = params or SamplingParams()
        prompt = [int(t) for t in prompt_ids]
        validate_prompt(prompt, params, self.vocab_size, self.max_model_len, self.cache.capacity)
        if request_id is not None and request_id in self._requests:
            raise RequestError(f"request id {request_id!r} is already in use")
        if constraint is not None:
            validate_constraint(constraint, self.vocab_size, self.tokenizer_fingerprint)
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        seed = params.seed if params.seed is not None else random.getrandbits(62)
        seqs: list[Sequence] = []
        for i in range(params.n):
            seq = Sequence(
                request_id=rid,
                index=i,
                prompt_ids=prompt,
                params=params,
                seed=(seed ^ (i * _SEED_MIX)) & ((1 << 63) - 1),
                matcher=constraint.matcher() if constraint is not None else None,
                leader=seqs[0] if seqs else None,
            )
            seq.detok = Detokenizer(self.tokenizer, prompt, params.stop, params.skip_special_tokens)
            if self.config.jump_forward and seq.matcher is not None:
                seq.draft = self._first_draft(seq)  # verified in the prefill pass
            seqs.append(seq)
        for seq in seqs:
            self.scheduler.add(seq)
        self._requests[rid] = seqs
        self.counters["requests"] += 1
        self.counters["prompt_tokens"] += len(prompt)
        return rid

    def _first_draft(self, seq: Sequence) -> list[int]:
        try:
            return self._make_draft(seq)
        except SequenceFailed:
            return []  # its matcher is broken: the first mask fill fails the sequence

    def abort(self, request_id: str) -> list[Output]:
        """Stop a request wherever it is; frees all it holds. Unknown ids are ignored."""
        outputs = []
        for seq in self._requests.pop(request_id, []):
            if seq.finished:
                continue
            self.cache.release(seq, keep=False)
            self.scheduler.finish(seq)
            self.post.finish(seq, "abort")
            outputs.append(self.post.emit(seq))
            self.counters["aborted"] += 1
        return outputs

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def fail_all(self, failure: EngineFailure) -> list[Output]:
        """End every live sequence with finish reason "error" and `failure`; one `Output` each,
        even where the engine's state is broken (then `reset` finds the leak)."""
        outputs = []
        for seq in self.live_sequences():
            try:
                outputs.append(self._fail(seq, failure))
            except Exception:
                self.post.fail(seq, failure)
                outputs.append(self.post.bare_output(seq))
        return outputs

    def reset(self) -> None:
        """After `fail_all`: forget anything left and check that every KV slot is back (free or
        in the prefix tree, unlocked). Raises when the state is broken: rebuild the engine."""
        self.scheduler.waiting.clear()
        self.scheduler.running.clear()
        self._requests.clear()
        self.check_integrity()
        if self.cache.radix.protected_size:
            raise RuntimeError(f"{self.cache.radix.protected_size} tree tokens are still locked")

    # ---- the step --------------------------------------------------------------------------

    def step(self) -> list[Output]:
        """Run one scheduling step; returns the incremental outputs it produced."""
        started = time.perf_counter()
        plan = self.scheduler.schedule()
        if not plan.items:
            return []
        self._batches += 1
        if self.faults:
            self.faults.fire("step", self._batches)
        batch, specs, jobs, mask_rows = self._prepare(plan)
        fill = None
        if jobs:
            fault = self.faults.take("mask", self._batches) if self.faults else None
            fill = self.masks.start(jobs, len(mask_rows), fault)
        try:
            logits = self.runner.forward(batch, self.pool)
        finally:  # never leave the mask thread running on matchers past a failed forward
            bitmask = fill.result() if fill is not None else None
        tokens, logprobs = [], []
        if specs:
            rows = torch.tensor(mask_rows, dtype=torch.int64) if mask_rows else None
            with torch.inference_mode():  # the logits are inference tensors
                tokens, logprobs = sample_rows(logits, specs, bitmask, rows, self.eos)
        outputs = self._postprocess(plan, tokens, logprobs)
        self.counters["steps"] += 1
        self.counters["batched_tokens"] += batch.num_tokens
        self.counters["step_seconds"] += time.perf_counter() - started
        return outputs

    def _prepare(self, plan: Schedule):
        new_ids, kvs, logits_index = [], [], []
        specs: list[RowSpec] = []
        jobs: list[MaskJob] = []
        mask_rows: list[int] = []
        start = 0
        for item in plan.items:
            seq, draft = item.seq, item.seq.draft[: item.draft_len]
            real = item.num_new - item.draft_len
            new_ids.append(seq.tokens(seq.num_computed, seq.num_computed + real) + draft)
            kvs.append(seq.kv)
            if item.sample:
                if seq.matcher is not None:
                    jobs.append(MaskJob(seq, draft, len(mask_rows)))
                for i in range(item.draft_len + 1):
                    if seq.matcher is not None:
                        mask_rows.append(len(logits_index))
                    logits_index.append(start + real - 1 + i)
                    specs.append(RowSpec(seq, len(seq.output_ids) + i, draft[:i]))
            start += item.num_new
        index = torch.tensor(logits_index, dtype=torch.int64)
        return ForwardBatch.from_sequences(new_ids, kvs, index), specs, jobs, mask_rows

    def _postprocess(self, plan: Schedule, tokens: list[int], logprobs: list) -> list[Output]:
        outputs: list[Output] = []
        row = 0
        for k, item in enumerate(plan.items):
            n_rows = item.draft_len + 1 if item.sample else 0
            try:
                if k == 0 and self.faults:
                    self.faults.fire("seq", self._batches)
                out = self._postprocess_one(
                    item, tokens[row : row + n_rows], logprobs[row : row + n_rows]
                )
            except SequenceFailed as e:
                out = self._fail(item.seq, e.failure)
            except Exception as e:  # work tied to this sequence failed: only it ends
                log.exception("sequence %s/%d failed", item.seq.request_id, item.seq.index)
                out = self._fail(item.seq, EngineFailure("sequence_failed", repr(e)))
            row += n_rows
            if out is not None:
                outputs.append(out)
        return outputs

    def _postprocess_one(self, item: ScheduledSeq, tokens: list[int], logprobs: list):
        seq = item.seq
        seq.forward_passes += 1
        self.counters["seq_forward_passes"] += 1
        if not item.sample:
            seq.num_computed += item.num_new
            return None
        if seq.failure is not None:  # its mask fill failed: its sampled row means nothing
            raise SequenceFailed(seq.failure)
        self._take_sampled(seq, item, tokens, logprobs)
        if seq.finish_reason is None:
            if seq.prefix_len < len(seq.prompt_ids):
                self.cache.cache_computed(seq)  # n > 1 siblings and equal prompts reuse it
            if self.config.jump_forward and seq.matcher is not None:
                self._jump_forward(seq)
        if seq.finish_reason is not None:
            self._finish(seq)
        return self.post.emit(seq)

    def _take_sampled(
        self, seq: Sequence, item: ScheduledSeq, tokens: list[int], logprobs: list
    ) -> None:
        """Append a sampled row's tokens (verifying the draft), then fix up the KV bookkeeping:
        everything fed has KV now, except a rejected draft tail (freed)."""
        seq.draft = draft = seq.draft[: item.draft_len]
        appended = self.post.accept(seq, tokens, logprobs)
        got = seq.output_ids[len(seq.output_ids) - appended :]
        self.hints.observe(seq.draft_hint, draft, got)
        accepted = max(0, appended - 1)  # the last appended token is sampled, not a draft
        c = self.counters
        c["output_tokens"] += appended
        c["draft_tokens"] += len(draft)
        c["draft_accepted"] += accepted
        if seq.draft_looked_up:
            c["lookup_draft_tokens"] += len(draft)
            c["lookup_draft_accepted"] += accepted
        c["jump_forward_tokens"] += accepted
        seq.num_computed += item.num_new - len(draft) + accepted
        seq.draft, seq.draft_hint, seq.draft_looked_up, seq.num_forced = [], None, False, 0
        self.cache.truncate(seq)

    def _jump_forward(self, seq: Sequence) -> None:
        """Append the tokens the grammar alone decides (their KV comes with the next extend),
        then draft the forced text after them."""
        while seq.finish_reason is None:
            tok = forced_token(seq, self._force_mask)
            if tok is None:
                break
            self.post.force(seq, tok)
            seq.num_forced += 1
            self.counters["output_tokens"] += 1
            self.counters["forced_tokens"] += 1
            self.counters["jump_forward_tokens"] += 1
        if seq.finish_reason is None:
            seq.draft = self._make_draft(seq)

    def _make_draft(self, seq: Sequence) -> list[int]:
        # The draft's last token is verified with one more sampled token after it, so leave
        # room for that one within max_tokens.
        limit = min(self.config.max_draft_tokens, seq.params.max_tokens - len(seq.output_ids) - 1)
        draft = make_draft(seq, self.tokenizer, limit, self.hints)
        if not draft and seq.output_ids:
            draft = lookup_draft(seq, min(limit, self.config.lookup_draft_tokens))
            seq.draft_looked_up = bool(draft)
        return draft

    def _finish(self, seq: Sequence, keep: bool = True) -> None:
        self.cache.release(seq, keep=keep)
        self.scheduler.finish(seq)
        seqs = self._requests.get(seq.request_id, [])
        if all(s.finished for s in seqs):
            self._requests.pop(seq.request_id, None)

    def _fail(self, seq: Sequence, failure: EngineFailure) -> Output:
        """End `seq` with finish reason "error"; its KV goes back to the pool (none of it is
        offered to the prefix tree: the failure may have left its bookkeeping half done)."""
        self.post.fail(seq, failure)
        self._finish(seq, keep=False)
        self.counters["failed"] += 1
        return self.post.emit(seq)

    # ---- conveniences for tests and benches ------------------------------------------------

    def run_until_done(self) -> dict[str, list[Completion]]:
        """Step until nothing is left; returns every request's choices, by request id."""
        results: dict[str, list[Completion]] = {}
        while self.has_unfinished():
            for out in self.step():
                choices = results.setdefault(out.request_id, [])
                while len(choices) <= out.index:
                    choices.append(Completion(index=len(choices)))
                choices[out.index].add(out)
        return results

    def generate(
        self, prompts: list[list[int]], params: SamplingParams | None = None, constraints=None
    ) -> list[list[Completion]]:
        """Submit all prompts together, run to completion, return the choices in order."""
        constraints = constraints or [None] * len(prompts)
        rids = [self.add_request(p, params, c) for p, c in zip(prompts, constraints, strict=True)]
        results = self.run_until_done()
        return [results[r] for r in rids]

    def live_sequences(self) -> list[Sequence]:
        return [s for seqs in self._requests.values() for s in seqs if not s.finished]

    def check_integrity(self) -> None:
        """Raise `KVIntegrityError` on any leak or double ownership of a KV slot."""
        self.cache.check_integrity(self.live_sequences())

    def stats(self) -> dict[str, float]:
        """Figures for /metrics and benches (keys: `engine.stats.collect`)."""
        return collect(self.counters, self.scheduler, self.cache)

    def close(self) -> None:
        self.masks.close()
