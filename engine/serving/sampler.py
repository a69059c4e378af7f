"""Sampling glue: penalties, the grammar mask, min_tokens, logprobs, then `mask_kernels.sample`.

One call handles every logits row of a step. A row is described by a `RowSpec`: its sequence,
the output position it samples (the RNG offset, so a seeded row's draw does not depend on the
batch), and for jump-forward verification rows the draft tokens assumed before it (they count
for the penalties and for `min_tokens` exactly as they would token by token).

Order per row: repetition penalty (tokens of prompt + output), frequency/presence penalties
(output), the grammar mask, then the `min_tokens` ban of EOS and stop tokens, which is lifted
for a row where it would leave nothing allowed (the grammar wins: it allows only EOS there).

Seeds: an n > 1 request's choices draw from seeds derived from the request's (`choice_seeds`),
so each is reproducible on its own yet they differ.

Logprobs are those of the masked distribution at temperature 1, after penalties (what
`mask_kernels.sample` reports for the sampled token); `top_logprobs` come from the same one and
omit masked alternatives (-inf), so they may be fewer than asked; every value is finite. With
them each row reports how many tokens it allowed (finite logits after the mask and the
`min_tokens` ban).

Devices. Every tensor is made on the logits' device, from host lists copied asynchronously; on
CUDA the grammar mask is fused into `mask_kernels.sample` when nothing reads the masked logits
first, and the step's results come back in one device-to-host transfer (`read_back`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from corral.engine.serving.core import Sequence, TokenLogprob
from corral.mask_kernels import SampleResult, SamplingTensors, apply_bitmask_, sample
from corral.mask_kernels.params import on_device

_SEED_MIX = 0x9E3779B97F4A7C15  # spreads the seeds of an n > 1 request's choices apart


@dataclass
class RowSpec:
    """One logits row to sample: `seq` at output position `offset`, after `assumed` drafts."""

    seq: Sequence
    offset: int
    assumed: list[int]


def choice_seeds(seed: int | None, n: int) -> list[int]:
    """The seed of each of a request's `n` choices: from `seed`, or from a fresh random one
    when the request gave none."""
    base = seed if seed is not None else random.getrandbits(62)
    return [(base ^ (i * _SEED_MIX)) & ((1 << 63) - 1) for i in range(n)]


def sample_rows(
    logits: torch.Tensor,
    specs: list[RowSpec],
    bitmask: torch.Tensor | None = None,
    mask_rows: torch.Tensor | None = None,
    eos: frozenset[int] = frozenset(),
) -> tuple[list[int], list[TokenLogprob | None]]:
    """Sample one token per row of `logits` (modified in place); logprobs where asked.

    `bitmask`/`mask_rows` may live on the host (pinned for a CUDA model): they are copied to the
    logits' device here. `eos`: the model's EOS ids (banned with the stop tokens until
    `min_tokens`). The work runs on the logits' device (`sample_on_device`); the results come
    back to the host in one transfer at the end (`read_back`; on CUDA the step's only sync).
    """
    return read_back(sample_on_device(logits, specs, bitmask, mask_rows, eos), specs)


@dataclass
class DeviceSample:
    """A step's draws, still on the logits' device."""

    result: SampleResult
    top: _Top | None


def sample_on_device(
    logits: torch.Tensor,
    specs: list[RowSpec],
    bitmask: torch.Tensor | None = None,
    mask_rows: torch.Tensor | None = None,
    eos: frozenset[int] = frozenset(),
) -> DeviceSample:
    """Penalties, mask, min_tokens ban, top alternatives and the draw, without a host sync."""
    dev = logits.device
    _apply_penalties(logits, specs)
    if bitmask is not None and bitmask.shape[0]:
        bitmask = bitmask.to(dev, non_blocking=True)
        mask_rows = None if mask_rows is None else mask_rows.to(dev, non_blocking=True)
    else:
        bitmask = mask_rows = None
    bans = _early_stop_bans(specs, eos, logits.shape[1])
    want_lp = any(s.seq.params.wants_logprobs for s in specs)
    # On CUDA the mask is fused into the sampling kernel, unless something reads the masked
    # logits before the draw (the min_tokens ban looks for rows left empty, logprobs rank the
    # alternatives and count the allowed tokens).
    fused = bitmask is not None and dev.type == "cuda" and bans is None and not want_lp
    if bitmask is not None and not fused:
        apply_bitmask_(logits, bitmask, mask_rows)
    if bans is not None:
        _ban_early_stops(logits, *bans)
    top = _top_logprobs(logits, specs)
    tensors = _tensors(specs, dev)
    result = sample(logits, bitmask, tensors, mask_rows) if fused else sample(logits, None, tensors)
    return DeviceSample(result, top)


def read_back(
    drawn: DeviceSample, specs: list[RowSpec]
) -> tuple[list[int], list[TokenLogprob | None]]:
    """Tokens, logprobs and top alternatives, read back in one transfer (token ids are exact in
    float64)."""
    return _decode(_flat(drawn).tolist(), drawn.top, specs)


def _flat(drawn: DeviceSample) -> torch.Tensor:
    """Everything `read_back` returns, as one float64 tensor on the device."""
    result, top = drawn.result, drawn.top
    parts = [result.tokens.double()]
    if top is not None:
        parts += [result.logprobs.double(), top.ids.double().reshape(-1)]
        parts += [top.values.double().reshape(-1), top.allowed.double()]
    return torch.cat(parts)


class ReadBack:
    """`read_back` in two halves (overlap scheduling): the transfer is queued when made (into
    pinned memory on CUDA, so device work queued later does not delay it), `result` waits for
    it and decodes it."""

    def __init__(self, drawn: DeviceSample, specs: list[RowSpec]) -> None:
        flat = _flat(drawn)
        self._event = None
        if flat.device.type == "cuda":
            host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
            flat = host.copy_(flat, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        self._flat, self._drawn, self._specs = flat, drawn, specs

    def result(self) -> tuple[list[int], list[TokenLogprob | None]]:
        if self._event is not None:
            self._event.synchronize()
        return _decode(self._flat.tolist(), self._drawn.top, self._specs)


def _decode(
    flat: list[float], top: _Top | None, specs: list[RowSpec]
) -> tuple[list[int], list[TokenLogprob | None]]:
    n = len(specs)
    tokens = [int(t) for t in flat[:n]]
    if top is None:
        return tokens, [None] * n
    lps, k, m = flat[n : 2 * n], top.k, len(top.rows)
    ids, values = flat[2 * n : 2 * n + m * k], flat[2 * n + m * k : 2 * n + 2 * m * k]
    counts = flat[2 * n + 2 * m * k :]
    alternatives, allowed = {}, {}
    for r, i in enumerate(top.rows):
        allowed[i] = int(counts[r])
        want = specs[i].seq.params.top_logprobs
        pairs = zip(ids[r * k : r * k + want], values[r * k : r * k + want], strict=True)
        # Masked alternatives (-inf) are omitted, so there may be fewer than asked.
        alternatives[i] = tuple((int(t), v) for t, v in pairs if math.isfinite(v))
    out: list[TokenLogprob | None] = []
    for i, spec in enumerate(specs):
        if not spec.seq.params.wants_logprobs:
            out.append(None)
        else:
            top_i = alternatives.get(i, ())
            out.append(TokenLogprob(tokens[i], lps[i], top_i, allowed=allowed.get(i)))
    return tokens, out


def _tensors(specs: list[RowSpec], device: torch.device) -> SamplingTensors:
    ps = [s.seq.params for s in specs]
    return SamplingTensors.build(
        temperature=[p.temperature for p in ps],
        top_k=[p.top_k for p in ps],
        top_p=[p.top_p for p in ps],
        min_p=[p.min_p for p in ps],
        seed=[s.seq.seed for s in specs],
        offset=[s.offset for s in specs],
        device=device,
        logprobs=any(p.wants_logprobs for p in ps),
    )


def _apply_penalties(logits: torch.Tensor, specs: list[RowSpec]) -> None:
    """Repetition (prompt + output), then frequency/presence (output) penalties, all rows at
    once; only rows that ask for a penalty are touched."""
    rows = [i for i, s in enumerate(specs) if s.seq.params.penalized]
    if not rows:
        return
    dev, dtype = logits.device, logits.dtype
    params = [specs[i].seq.params for i in rows]
    counts = _output_counts(specs, rows, logits.shape[1], dtype, dev)
    idx = on_device(rows, torch.int64, dev)
    sub = logits[idx]
    if any(p.repetition_penalty != 1 for p in params):
        seen = counts > 0
        for r, i in enumerate(rows):
            if params[r].repetition_penalty != 1:
                seen[r, _prompt_ids(specs[i].seq, dev)] = True
        rp = on_device([p.repetition_penalty for p in params], dtype, dev).unsqueeze(1)
        sub = torch.where(seen, torch.where(sub > 0, sub / rp, sub * rp), sub)
    if any(p.frequency_penalty or p.presence_penalty for p in params):
        freq = on_device([p.frequency_penalty for p in params], dtype, dev)
        pres = on_device([p.presence_penalty for p in params], dtype, dev)
        sub = sub - (freq[:, None] * counts + pres[:, None] * (counts > 0).to(dtype))
    logits[idx] = sub


def _output_counts(
    specs: list[RowSpec], rows: list[int], vocab: int, dtype: torch.dtype, dev: torch.device
) -> torch.Tensor:
    """float[len(rows), V]: how often each token occurs in the row's output (+ assumed drafts)."""
    row_idx, tok_idx = [], []
    for r, i in enumerate(rows):
        spec = specs[i]
        toks = spec.seq.output_ids + spec.assumed
        row_idx.extend([r] * len(toks))
        tok_idx.extend(toks)
    counts = torch.zeros(len(rows), vocab, dtype=dtype, device=dev)
    if tok_idx:
        ri = on_device(row_idx, torch.int64, dev)
        ti = on_device(tok_idx, torch.int64, dev).clamp_(max=vocab - 1)
        counts.index_put_((ri, ti), torch.ones(len(ti), dtype=dtype, device=dev), accumulate=True)
    return counts


def _prompt_ids(seq: Sequence, dev: torch.device) -> torch.Tensor:
    """The distinct token ids of `seq`'s prompt, made once per sequence."""
    ids = seq.seen_prompt
    if ids is None or ids.device != dev:
        ids = seq.seen_prompt = on_device(sorted(set(seq.prompt_ids)), torch.int64, dev)
    return ids


_Bans = tuple[list[int], list[int], list[int], list[int]]


def _early_stop_bans(specs: list[RowSpec], eos: frozenset[int], vocab: int) -> _Bans | None:
    """`min_tokens`: (rows, row of each ban, token of each ban, owner index of each ban) for
    the rows sampling an output position below it; None when no row has a ban."""
    rows, row_idx, tok_idx, owner = [], [], [], []
    for i, spec in enumerate(specs):
        p = spec.seq.params
        if spec.offset >= p.min_tokens:
            continue
        banned = set(p.stop_token_ids) if p.ignore_eos else eos.union(p.stop_token_ids)
        banned = [t for t in banned if 0 <= t < vocab]
        if banned:
            row_idx.extend([i] * len(banned))
            tok_idx.extend(banned)
            owner.extend([len(rows)] * len(banned))
            rows.append(i)
    return (rows, row_idx, tok_idx, owner) if rows else None


def _ban_early_stops(
    logits: torch.Tensor, rows: list[int], row_idx: list[int], tok_idx: list[int], owner: list[int]
) -> None:
    """EOS (unless `ignore_eos`) and stop tokens become -inf on the banned rows, except on rows
    where nothing else would be left (the grammar wins: it allows only EOS there)."""
    dev = logits.device
    ri, ti = on_device(row_idx, torch.int64, dev), on_device(tok_idx, torch.int64, dev)
    saved = logits[ri, ti]
    logits[ri, ti] = float("-inf")
    dead = logits[on_device(rows, torch.int64, dev)].amax(dim=1) == float("-inf")
    logits[ri, ti] = torch.where(dead[on_device(owner, torch.int64, dev)], saved, logits[ri, ti])


@dataclass
class _Top:
    """The `top_logprobs` alternatives of the rows that want them, still on the device."""

    rows: list[int]
    k: int
    ids: torch.Tensor  # int64 [len(rows), k]
    values: torch.Tensor  # float32 [len(rows), k]
    allowed: torch.Tensor  # int64 [len(rows)]: tokens with a finite logit


def _top_logprobs(logits: torch.Tensor, specs: list[RowSpec]) -> _Top | None:
    """The top alternatives of every row that wants logprobs (None when no row does)."""
    want = [i for i, s in enumerate(specs) if s.seq.params.wants_logprobs]
    if not want:
        return None
    k = max(specs[i].seq.params.top_logprobs for i in want)
    rows = logits[on_device(want, torch.int64, logits.device)]
    allowed = torch.isfinite(rows).sum(dim=-1)
    if k == 0:
        empty = logits.new_zeros(len(want), 0)
        return _Top(want, 0, empty.long(), empty.float(), allowed)
    values, ids = torch.log_softmax(rows.float(), dim=-1).topk(k, dim=-1)
    return _Top(want, k, ids, values, allowed)
