"""The synchronous engine: a step is schedule -> run -> postprocess.

    plan = scheduler.schedule()                  # policy: who runs, how many tokens, slots
    logits = runner.forward(batch)               # meanwhile: grammar masks on a worker thread
    outputs = postprocess(plan, sample(logits))  # accept tokens, finish, detokenize, emit

Usable directly (tests, benches) or from `AsyncEngine`'s background thread. Not thread-safe:
one thread calls `add_request`, `abort` and `step`.
"""

from __future__ import annotations

import itertools
import random
import time
from collections import Counter

import torch

from corral.engine.cache_manager import CacheManager
from corral.engine.config import EngineConfig
from corral.engine.constraints import MaskFiller, MaskJob
from corral.engine.core import Completion, Output, RequestError, SamplingParams, Sequence
from corral.engine.detokenize import Detokenizer
from corral.engine.jump_forward import DraftHints, forced_token, lookup_draft, make_draft
from corral.engine.model_runner import ForwardBatch
from corral.engine.postprocess import Postprocessor
from corral.engine.sampling import RowSpec, sample_rows
from corral.engine.scheduler import Schedule, ScheduledSeq, Scheduler
from corral.engine.stats import collect

_SEED_MIX = 0x9E3779B97F4A7C15  # spreads the seeds of an n > 1 request's choices apart


class Engine:
    """Continuous batching with a radix prefix cache, constraints and jump-forward."""

    def __init__(self, model, config: EngineConfig | None = None) -> None:
        """`model` is an `assets.LoadedModel` (runner, tokenizer, eos_token_ids, ...)."""
        self.config = config or EngineConfig()
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
        self.post = Postprocessor(frozenset(model.eos_token_ids), self.max_model_len)
        self.counters: Counter[str] = Counter()
        self._requests: dict[str, list[Sequence]] = {}
        self._ids = itertools.count()

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
        max_tokens beyond the context length or the KV cache, a duplicate request id.
        """
        params = params or SamplingParams()
        prompt = [int(t) for t in prompt_ids]
        self._validate(prompt, params, request_id)
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
                seq.draft = self._make_draft(seq)  # verified in the prefill pass
            seqs.append(seq)
            self.scheduler.add(seq)
        self._requests[rid] = seqs
        self.counters["requests"] += 1
        self.counters["prompt_tokens"] += len(prompt)
        return rid

    def _validate(self, prompt: list[int], params: SamplingParams, rid: str | None) -> None:
        if not prompt:
            raise RequestError("the prompt is empty; send at least one token")
        if min(prompt) < 0 or max(prompt) >= self.vocab_size:
            raise RequestError(f"prompt token ids must lie in [0, {self.vocab_size})")
        total = len(prompt) + params.max_tokens
        if total > self.max_model_len:
            raise RequestError(
                f"the prompt has {len(prompt)} tokens and max_tokens is {params.max_tokens}: "
                f"{total} exceeds the context length of {self.max_model_len}; shorten the "
                "prompt or lower max_tokens"
            )
        if total > self.cache.capacity:
            raise RequestError(
                f"the prompt ({len(prompt)} tokens) plus max_tokens ({params.max_tokens}) "
                f"needs {total} KV slots but the whole KV cache holds {self.cache.capacity}; "
                "lower max_tokens or start the engine with a larger kv_cache_bytes"
            )
        if rid is not None and rid in self._requests:
            raise RequestError(f"request id {rid!r} is already in use")

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

    # ---- the step --------------------------------------------------------------------------

    def step(self) -> list[Output]:
        """Run one scheduling step; returns the incremental outputs it produced."""
        started = time.perf_counter()
        plan = self.scheduler.schedule()
        if not plan.items:
            return []
        batch, specs, jobs, mask_rows = self._prepare(plan)
        fill = self.masks.start(jobs, len(mask_rows)) if jobs else None
        logits = self.runner.forward(batch, self.pool)
        bitmask = fill.result() if fill is not None else None
        tokens, logprobs = [], []
        if specs:
            rows = torch.tensor(mask_rows, dtype=torch.int64) if mask_rows else None
            with torch.inference_mode():  # the logits are inference tensors
                tokens, logprobs = sample_rows(logits, specs, bitmask, rows)
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
        for item in plan.items:
            seq = item.seq
            seq.forward_passes += 1
            self.counters["seq_forward_passes"] += 1
            if not item.sample:
                seq.num_computed += item.num_new
                continue
            n_rows = item.draft_len + 1
            self._take_sampled(seq, item, tokens[row : row + n_rows], logprobs[row : row + n_rows])
            row += n_rows
            if seq.finish_reason is None:
                if seq.prefix_len < len(seq.prompt_ids):
                    self.cache.cache_computed(seq)  # n > 1 siblings and equal prompts reuse it
                if self.config.jump_forward and seq.matcher is not None:
                    self._jump_forward(seq)
            if seq.finish_reason is not None:
                self._finish(seq)
            outputs.append(self.post.emit(seq))
        return outputs

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

    def _finish(self, seq: Sequence) -> None:
        self.cache.release(seq, keep=True)
        self.scheduler.finish(seq)
        seqs = self._requests.get(seq.request_id, [])
        if all(s.finished for s in seqs):
            self._requests.pop(seq.request_id, None)

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
