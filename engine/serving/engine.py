"""The synchronous engine: a step is schedule -> run -> postprocess.

    plan = scheduler.schedule()                   # policy: who runs, how many tokens, slots
    tokens = run(step_inputs(plan))               # forward (masks filled meanwhile), sample
    outputs = postprocess(plan, tokens)           # accept, jump-forward, finish, emit

Who owns what: validation `validate`, seeds `sampler.choice_seeds`, grammar masks and their
deadline `step_masks` (over `grammar_masks`), forced tokens and drafts `drafter.Drafter`,
appending tokens and finish rules `postprocess`, KV slots `cache_manager`. The engine wires them
together and keeps the books.

Mask deadline. A constrained row whose mask is not ready `EngineConfig.mask_grace_ms` after the
logits sits the step out (`grammar_masks`): it is not sampled, keeps the KV of all but its last
fed token and runs again later, so its output does not change; `mask_deferrals` counts it.

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
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING

import torch

from corral.engine.constrained.drafter import Drafter
from corral.engine.constrained.step_masks import StepMasks
from corral.engine.execution.batch import ForwardBatch
from corral.engine.kvcache.cache_manager import CacheManager
from corral.engine.serving import prompt_logprobs
from corral.engine.serving.config import IDLE_WAIT_S, EngineConfig
from corral.engine.serving.core import (
    CollectedChoice,
    EngineFailure,
    Output,
    RequestError,
    SamplingParams,
    Sequence,
    SequenceFailed,
    TokenLogprob,
)
from corral.engine.serving.detokenize import Detokenizer
from corral.engine.serving.faults import Faults
from corral.engine.serving.overlap import OverlapLoop
from corral.engine.serving.postprocess import Postprocessor
from corral.engine.serving.sampler import choice_seeds, read_back
from corral.engine.serving.scheduler import Schedule, ScheduledSeq, Scheduler
from corral.engine.serving.stats import collect
from corral.engine.serving.step_inputs import StepRows, step_inputs
from corral.engine.serving.validate import (
    validate_budget_close,
    validate_constraint,
    validate_prompt,
)

if TYPE_CHECKING:
    from corral.grammar import CompiledConstraint

log = logging.getLogger(__name__)


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
        self._threads_bound_to: int | None = None  # the thread `step` set torch's threads for
        self.model = model
        self.runner = model.runner
        self.tokenizer = model.tokenizer
        self.vocab_size = self.runner.config.vocab_size
        limit = self.config.max_model_len or model.max_position_embeddings
        self.max_model_len = min(limit, model.max_position_embeddings)
        self.pool = self.runner.kv_pool_from_budget(self._kv_budget())
        if self.config.cuda_graphs and self.runner.device.type == "cuda":
            self.runner.use_decode_graphs(self.pool, self.config.max_num_seqs, self.max_model_len)
        self.cache = CacheManager(self.pool, self.config.prefix_cache)
        self.scheduler = Scheduler(self.config, self.cache)
        self.eos = frozenset(model.eos_token_ids)
        self.post = Postprocessor(self.eos, self.max_model_len)
        self.counters: Counter[str] = Counter()
        self.masks = StepMasks(
            self.config, self.vocab_size, self.runner.device, self.eos,
            self.faults, self.cache, self.counters,
        )  # fmt: skip
        row_cost = self.config.lookup_row_cost
        if row_cost is None:  # see EngineConfig.lookup_row_cost
            row_cost = 0.05 if self.runner.device.type == "cuda" else 0.5
        self.drafter = Drafter(
            self.config, self.tokenizer, self.vocab_size, self.post, self.counters, row_cost
        )
        self._requests: dict[str, list[Sequence]] = {}
        self._ids = itertools.count()
        self._batches = 0  # steps that ran a batch (what CORRAL_FAULTS counts)
        self._overlap = OverlapLoop(self) if self.config.overlap else None

    def _kv_budget(self) -> int:
        """Bytes for the KV pool: `kv_cache_bytes` on the CPU; on CUDA what is left of
        `gpu_memory_fraction` after the weights and one full-size forward (`engine.device`)."""
        fraction, device = self.config.gpu_memory_fraction, self.runner.device
        if device.type != "cuda" or fraction is None:
            return self.config.kv_cache_bytes
        from corral.engine.execution.device import profiled_kv_budget

        tokens = min(self.config.max_batched_tokens, self.max_model_len)
        return profiled_kv_budget(self.runner, fraction, tokens)

    # ---- requests --------------------------------------------------------------------------

    def add_request(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        constraint: CompiledConstraint | None = None,
        request_id: str | None = None,
    ) -> str:
        """Queue a request; returns its id.

        Raises `RequestError` for a client mistake: empty prompt, unknown token ids, a prompt +
        max_tokens beyond the context length or the KV cache, a duplicate request id, a
        constraint compiled for another tokenizer. Every choice is built before any is queued,
        so a failure (e.g. `constraint.matcher()` raising) leaves nothing behind.
        """
        params = params or SamplingParams()
        prompt = [int(t) for t in prompt_ids]
        validate_prompt(prompt, params, self.vocab_size, self.max_model_len, self.cache.capacity)
        if self._overlap is not None and (
            params.prefill_only or params.prompt_logprobs_from is not None
        ):
            raise RequestError(
                "max_tokens 0 and prompt logprobs are not served with overlap scheduling; "
                "start the server without --overlap"
            )
        if request_id is not None and request_id in self._requests:
            raise RequestError(f"request id {request_id!r} is already in use")
        if constraint is not None:
            validate_constraint(constraint, self.vocab_size, self.tokenizer_fingerprint)
        validate_budget_close(params, self.tokenizer_fingerprint)
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        seqs = self._choices(rid, prompt, params, constraint)
        for seq in seqs:
            self.scheduler.add(seq)
        self._requests[rid] = seqs
        self.counters["requests"] += 1
        self.counters["prompt_tokens"] += len(prompt)
        return rid

    def _choices(
        self,
        rid: str,
        prompt: list[int],
        params: SamplingParams,
        constraint: CompiledConstraint | None,
    ) -> list[Sequence]:
        """One `Sequence` per choice, each with its own seed, matcher, detokenizer and first
        draft; the first is the others' leader (they wait to share its prompt's KV)."""
        seqs: list[Sequence] = []
        for i, seed in enumerate(choice_seeds(params.seed, params.n)):
            seq = Sequence(
                request_id=rid,
                index=i,
                prompt_ids=prompt,
                params=params,
                seed=seed,
                matcher=constraint.matcher() if constraint is not None else None,
                leader=seqs[0] if seqs else None,
            )
            seq.detok = Detokenizer(self.tokenizer, prompt, params.stop, params.skip_special_tokens)
            if not params.prefill_only:
                self.drafter.start(seq)  # verified in the prefill pass
            seqs.append(seq)
        return seqs

    def abort(self, request_id: str) -> list[Output]:
        """Stop a request wherever it is; frees all it holds. Unknown ids are ignored."""
        outputs = []
        for seq in self._requests.pop(request_id, []):
            if seq.finished:
                continue
            self.post.finish(seq, "abort")
            self._finish(seq, keep=False)
            outputs.append(self.post.emit(seq))
            self.counters["aborted"] += 1
        return outputs

    def flush_cache(self) -> int:
        """Evict every prefix-cache entry no sequence holds; returns the tokens freed."""
        radix = self.cache.radix
        return radix.evict(radix.evictable_size) if radix.evictable_size else 0

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work() or (self._overlap is not None and self._overlap.has_work())

    def fail_all(self, failure: EngineFailure) -> list[Output]:
        """End every live sequence with finish reason "error" and `failure`; one `Output` each,
        even where the engine's state is broken (then `reset` finds the leak). With overlap,
        the outputs of a step postprocessed before the failure come first."""
        outputs = list(self._overlap.undelivered) if self._overlap is not None else []
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
        if self._overlap is not None:
            self._overlap.reset()
        self.scheduler.waiting.clear()
        self.scheduler.running.clear()
        self._requests.clear()
        self.check_integrity()
        if self.cache.radix.protected_size:
            raise RuntimeError(f"{self.cache.radix.protected_size} tree tokens are still locked")

    # ---- the step --------------------------------------------------------------------------

    def step(self) -> list[Output]:
        """Run one scheduling step; returns the incremental outputs it produced (with overlap,
        those of the step before, see `engine.overlap`)."""
        started = time.perf_counter()
        if self._overlap is not None:
            outputs = self._overlap.step()
            self.counters["step_seconds"] += time.perf_counter() - started
            return outputs
        self._bind_threads()
        self.masks.late_done.clear()
        plan = self.scheduler.schedule()
        if not plan.items:
            if self.scheduler.running:  # every one waits for a late mask fill to end
                self.masks.late_done.wait(IDLE_WAIT_S)
            return []
        self._batches += 1
        if self.faults:
            self.faults.fire("step", self._batches)
        batch, rows = step_inputs(plan)
        tokens, logprobs, late = self._run(batch, rows)
        outputs = self._postprocess(plan, tokens, logprobs, late)
        self.counters["steps"] += 1
        self.counters["batched_tokens"] += batch.num_tokens
        self.counters["step_seconds"] += time.perf_counter() - started
        return outputs

    def _bind_threads(self) -> None:
        """Give the thread that steps the engine its torch intra-op threads (`num_threads`).

        OpenMP keeps one worker team per thread that starts parallel work, and once there are
        more workers than cores (a second team, e.g. the server's main thread that loaded the
        model) libgomp stops spinning idle workers, so every parallel region of the step pays a
        futex wake-up: measured 2x slower decode steps on 2 cores. So the stepping thread sets
        its own thread count here, and the server loads single-threaded (`api.server`).
        """
        me = threading.get_ident()
        if self._threads_bound_to != me:
            torch.set_num_threads(self.config.threads)
            self._threads_bound_to = me

    def _run(
        self, batch: ForwardBatch, rows: StepRows
    ) -> tuple[list[int], list[TokenLogprob | None], set[Sequence]]:
        """The forward pass, with the grammar masks filled on the worker threads meanwhile, then
        one sampled token (and its logprob where asked) per row; rows whose mask missed the
        deadline are not sampled, and their sequences are returned (`grammar_masks`)."""
        fill = self.masks.start(rows, self._batches)
        try:
            logits = self.runner.forward(batch, self.pool)
            if rows.prompt:
                prompt_logprobs.take(logits[len(rows.specs) :], rows.prompt)
                logits = logits[: len(rows.specs)]
        except BaseException:  # never leave fills running on matchers past a failed forward
            self.masks.settle(fill)
            raise
        sitting_out = self.masks.late(fill)
        drawn, rows = self.masks.draw(logits, rows, fill, sitting_out)
        if drawn is None:
            return [], [], sitting_out
        return (*read_back(drawn, rows.specs), sitting_out)

    def _postprocess(
        self,
        plan: Schedule,
        tokens: list[int],
        logprobs: list[TokenLogprob | None],
        sitting_out: set[Sequence],
    ) -> list[Output]:
        """Each scheduled sequence takes its rows' tokens under its own guard: a failure there
        ends that sequence only (module docstring). Those in `sitting_out` had no rows sampled."""
        outputs: list[Output] = []
        row = 0
        for k, item in enumerate(plan.items):
            if item.seq in sitting_out:
                self.masks.sit_out(item)
                continue
            n_rows = item.draft_len + 1 if item.sample and not item.seq.params.prefill_only else 0
            if item.seq.finished:  # overlap: aborted while its step ran
                row += n_rows
                continue
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

    def _postprocess_one(
        self, item: ScheduledSeq, tokens: list[int], logprobs: list[TokenLogprob | None]
    ) -> Output | None:
        seq = item.seq
        seq.forward_passes += 1
        self.counters["seq_forward_passes"] += 1
        if not item.sample:
            seq.num_computed += item.num_new
            return None
        if seq.params.prefill_only:  # the prompt has KV now: it goes to the tree as it ends
            seq.num_computed += item.num_new
            self.post.finish(seq, "length")
            self._finish(seq)
            return self.post.emit(seq)
        if seq.failure is not None:  # its mask fill failed: its sampled row means nothing
            raise SequenceFailed(seq.failure)
        self._take_sampled(seq, item, tokens, logprobs)
        if seq.finish_reason is None:
            if seq.prefix_len < len(seq.prompt_ids):
                self.cache.cache_computed(seq)  # n > 1 siblings and equal prompts reuse it
            self.drafter.jump_forward(seq)
        if seq.finish_reason is not None:
            self._finish(seq)
        return self.post.emit(seq)

    def _take_sampled(
        self,
        seq: Sequence,
        item: ScheduledSeq,
        tokens: list[int],
        logprobs: list[TokenLogprob | None],
    ) -> None:
        """Append a sampled row group's tokens (row i > 0 only while the draft was right), then
        fix up the KV bookkeeping: everything fed has KV now, except a rejected draft tail
        (freed)."""
        seq.draft = seq.draft[: item.draft_len]
        if item.settled:  # overlap: the placeholder of this token goes, the token comes
            seq.output_ids.pop()
        appended = self.post.accept(seq, tokens, logprobs)
        self.counters["output_tokens"] += appended
        rejected = self.drafter.verify(seq, appended)
        if not item.settled:  # (a settled one already holds the slot of its next step)
            seq.num_computed += item.num_new - rejected
            self.cache.truncate(seq)

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

    def run_until_done(self) -> dict[str, list[CollectedChoice]]:
        """Step until nothing is left; returns every request's choices, by request id."""
        results: dict[str, list[CollectedChoice]] = {}
        while self.has_unfinished():
            for out in self.step():
                choices = results.setdefault(out.request_id, [])
                while len(choices) <= out.index:
                    choices.append(CollectedChoice(index=len(choices)))
                choices[out.index].add(out)
        return results

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams | None = None,
        constraints: list[CompiledConstraint | None] | None = None,
    ) -> list[list[CollectedChoice]]:
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
        if self._overlap is not None:
            self._overlap.close()
        self.masks.close()
