"""Plain types shared by the engine loop: requests, sampling parameters, outputs.

A request with `n` choices becomes `n` `Sequence`s; a sequence is the unit the scheduler runs.
Fields the engine fills later are `field(init=False)`. Sequences are identity-hashed.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # annotations only: no torch or grammar at runtime; jump_forward imports us
    import torch

    from corral.engine.constrained.budget_close import BudgetSteer
    from corral.engine.constrained.jump_forward import Boundary
    from corral.engine.constrained.lookup import LookupIndex, SpecState
    from corral.engine.constrained.masks import LateMask
    from corral.engine.kvcache.radix_cache import Node
    from corral.engine.serving.detokenize import Detokenizer
    from corral.grammar.core.matcher import Matcher
    from corral.grammar.core.runtime import BudgetClose

FinishReason = Literal["stop", "length", "abort", "error"]
#: How an output token was produced: drawn from the model's distribution ("sampled"); decided by
#: the grammar ("forced": the mask allowed only it, or jump-forward proposed it from the text the
#: grammar forces and the draw confirmed it); appended to end the output at a budget ("closed":
#: budget closing at `max_tokens`, or a think block's end marker at its reasoning budget).
TokenSource = Literal["sampled", "forced", "closed"]


@dataclass(frozen=True)
class EngineFailure:
    """Why a sequence ended with finish reason "error": never the client's mistake.

    ``code``: ``constraint_failed`` (its matcher hit a backend limit and could not be rebuilt,
    or refused a token its own mask allowed), ``sequence_failed`` (an exception in work tied to
    this sequence: its matcher, detokenizer or draft), ``engine_restarted`` (the step itself
    failed and the engine loop was restarted), ``engine_stopped`` (the server shut down).
    """

    code: str
    message: str


class SequenceFailed(Exception):
    """Raised by work tied to one sequence that knows why it must end (e.g. its matcher is in a
    backend error state it could not recover from); the step fails that sequence only."""

    def __init__(self, failure: EngineFailure) -> None:
        super().__init__(f"{failure.code}: {failure.message}")
        self.failure = failure


class RequestError(ValueError):
    """A client mistake in a request (bad parameter, too long): the API maps it to HTTP 400."""


@dataclass(frozen=True)
class ReasoningBudget:
    """At most `tokens` output tokens of thinking: when the output reaches that many and the
    think block is still open (`close` not yet written; with `open` set, only once the output
    began with `open`), the engine appends `close` as forced tokens (`jump_forward`)."""

    tokens: int
    close: str
    open: str = ""  # "": the prompt opened the block


@dataclass(frozen=True)
class BudgetReport:
    """What budget closing did for one choice (`engine.budget_close`): `steered` when the
    budget shaped the output (its end was appended as the shortest completion); `cut_short`
    the JSON pointers of the values that completion finished or filled; `complete` whether
    the output is a complete instance; `reason` why it was not steered, where it was not."""

    steered: bool
    cut_short: tuple[str, ...] = ()
    complete: bool = True
    reason: str | None = None


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens for one request (OpenAI semantics).

    temperature 0 is greedy. `top_k` <= 0, `top_p` = 1 and `min_p` = 0 are off. `seed` fixes the
    random draws: a seeded request produces the same tokens whatever it is batched with. `stop`
    strings are not part of the returned text. `logprobs` returns the sampled token's log
    probability, `top_logprobs` that many alternatives (both under the masked distribution at
    temperature 1, after penalties); alternatives the mask forbids are omitted, so `top` may be
    shorter than asked, and every reported logprob is finite.

    Penalties (vLLM semantics): `repetition_penalty` (> 0; 1 is off) divides the positive logits
    of tokens seen in the prompt or the output so far and multiplies the negative ones; then
    `frequency_penalty` (times the count) and `presence_penalty` (once) are subtracted for
    tokens seen in the output. `min_tokens`: EOS and `stop_token_ids` are masked out until that
    many output tokens exist, and stop strings do not end the output before it; where a grammar
    allows nothing but EOS (or a stop token) earlier, the grammar wins and the output ends.
    `ignore_eos`: EOS does not end the output (unconstrained requests; a grammar still ends it).
    `reasoning_budget`: the think block of a reasoning model is closed after that many tokens.
    `max_tokens` 0 prefills the prompt and ends ("length") without sampling: its KV stays in
    the prefix cache for the requests that share it. `prompt_logprobs_from` (a prompt position
    p, or None): the log probability of every prompt token from p on (from 1 on: token 0 has
    none) given the tokens before it, with `top_logprobs` alternatives (the model's own
    distribution: no penalty, mask or temperature), in `Output.prompt_logprobs`; the prefix
    cache is then reused only up to the first position whose logits that needs.
    `speculative`: False turns prompt-lookup speculation off for this request
    (`engine.constrained.lookup`; outputs are the same either way, only the speed differs).
    `budget_close`: the budget closing of what the constraint enforces
    (`grammar.core.runtime.BudgetClose`: a JSON schema's `JsonCloser`, or a structural tag's
    `TagCloser` for tool calls, with the tokenizer whose token bytes it reads; a server's
    `ConstraintRuntime` keeps one per constraint); with it, a constrained output is steered to
    end complete within `max_tokens` (`engine.budget_close`). It must be built for the engine's
    tokenizer (refused otherwise, where the engine knows its fingerprint).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    logprobs: bool = False
    top_logprobs: int = 0
    n: int = 1
    skip_special_tokens: bool = True
    reasoning_budget: ReasoningBudget | None = None
    budget_close: BudgetClose | None = None
    prompt_logprobs_from: int | None = None
    speculative: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        problems = [
            (self.max_tokens < 0, f"max_tokens must be >= 0, got {self.max_tokens}"),
            (
                self.prompt_logprobs_from is not None and self.prompt_logprobs_from < 0,
                "prompt_logprobs_from must be a prompt position >= 0",
            ),
            (self.temperature < 0, f"temperature must be >= 0, got {self.temperature}"),
            (not 0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (not 0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}"),
            (not -2 <= self.presence_penalty <= 2, "presence_penalty must be in [-2, 2]"),
            (not -2 <= self.frequency_penalty <= 2, "frequency_penalty must be in [-2, 2]"),
            (
                not (self.repetition_penalty > 0 and math.isfinite(self.repetition_penalty)),
                f"repetition_penalty must be > 0 (1 is off), got {self.repetition_penalty}",
            ),
            (self.min_tokens < 0, f"min_tokens must be >= 0, got {self.min_tokens}"),
            (not 0 <= self.top_logprobs <= 20, "top_logprobs must be in [0, 20]"),
            (self.n < 1, f"n must be >= 1, got {self.n}"),
            (any(not s for s in self.stop), "stop strings must be non-empty"),
            (
                self.reasoning_budget is not None
                and (self.reasoning_budget.tokens < 0 or not self.reasoning_budget.close),
                "reasoning_budget needs tokens >= 0 and an end marker",
            ),
        ]
        for bad, message in problems:
            if bad:
                raise RequestError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1
        )

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs or self.top_logprobs > 0

    @property
    def prefill_only(self) -> bool:
        return self.max_tokens == 0


@dataclass(frozen=True)
class TokenLogprob:
    """Log probability of one output token and, if asked, the `top` alternatives (id, logprob).

    `source`: how the token was produced (`TokenSource`). `allowed`: how many tokens the row it
    was drawn from allowed (grammar mask and `min_tokens` ban; the whole vocabulary when
    unconstrained), 1 for a token appended because the mask allowed only it, None for a closed
    token (no row was drawn). A token not drawn from a row (forced without a pass, or closed)
    was certain: its logprob is 0 and it is its own only alternative.
    """

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    source: TokenSource = "sampled"
    allowed: int | None = None

    @staticmethod
    def certain(token_id: int, source: TokenSource, top: int, allowed: int | None) -> TokenLogprob:
        """A token appended without a draw (it had no alternative)."""
        return TokenLogprob(token_id, 0.0, ((token_id, 0.0),) if top else (), source, allowed)


@dataclass(frozen=True)
class Output:
    """An incremental result for one choice: what is new since the previous `Output`."""

    request_id: str
    index: int
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] | None
    finish_reason: FinishReason | None
    num_prompt_tokens: int
    num_cached_tokens: int
    error: EngineFailure | None = None  # set when finish_reason is "error"
    budget_close: BudgetReport | None = None  # in the final Output, where budget closing acted
    # with `prompt_logprobs_from` p, once: prompt tokens max(p, 1) .. end, in order
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None
    # prompt-lookup speculation so far (`engine.constrained.lookup`): draft tokens proposed
    # and fed for verification, and how many of them the sampled tokens confirmed
    spec_proposed: int = 0
    spec_accepted: int = 0


@dataclass
class CollectedChoice:
    """Everything one choice produced, collected from its `Output`s (`Engine.generate`, for
    tests and benches; not the API's `Completion` response)."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    num_cached_tokens: int = 0
    error: EngineFailure | None = None
    budget_close: BudgetReport | None = None
    prompt_logprobs: list[TokenLogprob] | None = None
    spec_proposed: int = 0
    spec_accepted: int = 0

    def add(self, out: Output) -> None:
        if out.prompt_logprobs is not None:
            self.prompt_logprobs = list(out.prompt_logprobs)
        self.text += out.text
        self.token_ids.extend(out.token_ids)
        if out.logprobs:
            self.logprobs.extend(out.logprobs)
        self.finish_reason = out.finish_reason
        self.num_cached_tokens = out.num_cached_tokens
        self.error = out.error
        self.budget_close = out.budget_close
        self.spec_proposed, self.spec_accepted = out.spec_proposed, out.spec_accepted


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One choice of one request, as the scheduler and the engine track it.

    KV invariant: `kv` holds the pool slots of tokens `[0, num_computed)` of `prompt + output`;
    the first `prefix_len` of them belong to the radix tree (pinned by the lock on `node`), the
    rest belong to this sequence. The last sampled output token never has KV yet: it is the next
    input, together with the `num_forced` tokens the grammar forced after it (jump-forward).
    """

    request_id: str
    index: int
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    matcher: Matcher | None = None  # set when constrained
    leader: Sequence | None = None  # n > 1: siblings wait until the leader's prompt is cached
    output_ids: list[int] = field(default_factory=list, init=False)
    status: SeqStatus = field(default=SeqStatus.WAITING, init=False)
    finish_reason: FinishReason | None = field(default=None, init=False)
    error: EngineFailure | None = field(default=None, init=False)  # with finish "error"
    # Set on the mask thread when this sequence's matcher broke: its sampled row is discarded.
    failure: EngineFailure | None = field(default=None, init=False)
    # Its row missed a step's mask deadline (`grammar_masks`): while that fill still runs it sits
    # out; the masks it made wait in `late_mask` for its next step; `mask_deferrals` ranks it
    # first among the next step's fills.
    mask_busy: bool = field(default=False, init=False)
    late_mask: LateMask | None = field(default=None, init=False)
    mask_deferrals: int = field(default=0, init=False)
    kv: torch.Tensor | None = field(default=None, init=False)  # int64 slots (cache manager)
    node: Node | None = field(default=None, init=False)  # locked radix node
    prefix_len: int = field(default=0, init=False)
    num_computed: int = field(default=0, init=False)
    num_cached_tokens: int = field(default=0, init=False)
    admitted_at: int = field(default=-1, init=False)  # admission counter: newest is preempted
    queued_at: int = field(default=-1, init=False)  # arrival counter (the scheduler's)
    overtaken: int = field(default=0, init=False)  # later arrivals admitted while it waited
    draft: list[int] = field(default_factory=list, init=False)  # jump-forward tokens to verify
    draft_hint: Boundary | None = field(default=None, init=False)  # the draft's last token
    # draft[draft_lookup_from:] is a lookup proposal, draft[:draft_lookup_from] forced text
    draft_lookup_from: int = field(default=0, init=False)
    num_forced: int = field(default=0, init=False)  # output tokens appended without a pass
    lookup: LookupIndex | None = field(default=None, init=False)  # made on first use
    spec: SpecState | None = field(default=None, init=False)  # adaptive k and counts (lookup)
    forward_passes: int = field(default=0, init=False)
    detok: Detokenizer | None = field(default=None, init=False)  # the engine attaches one
    pending_ids: list[int] = field(default_factory=list, init=False)  # not yet in an Output
    pending_logprobs: list[TokenLogprob] = field(default_factory=list, init=False)
    seen_prompt: torch.Tensor | None = field(default=None, init=False)  # prompt ids (penalty)
    budget: BudgetSteer | None = field(default=None, init=False)  # with params.budget_close
    # `prompt_logprobs_from`: the prompt tokens' logprobs computed so far; sent once, complete
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list, init=False)
    prompt_logprobs_sent: bool = field(default=False, init=False)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

    @property
    def prefilling(self) -> bool:
        """Tokens before the last sampled one lack KV (a prompt, or a resumed preempted
        sequence); forced tokens appended since the last pass do not count."""
        return self.num_tokens - self.num_computed > 1 + self.num_forced

    def tokens(self, start: int, end: int) -> list[int]:
        """Token ids `[start, end)` of prompt + output, without building the whole list."""
        p = len(self.prompt_ids)
        if end <= p:
            return self.prompt_ids[start:end]
        if start >= p:
            return self.output_ids[start - p : end - p]
        return self.prompt_ids[start:] + self.output_ids[: end - p]

    @property
    def reuse_limit(self) -> int:
        """How many prompt tokens may come from the prefix cache: all but the last, or, with
        prompt logprobs, up to the first position whose logits are still to be computed."""
        limit = self.num_tokens - 1
        start = self.params.prompt_logprobs_from
        if start is not None:
            limit = min(limit, max(start, 1) - 1 + len(self.prompt_logprobs))
        return limit

    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids
