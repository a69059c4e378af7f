"""Per-row sampling parameters as device tensors, and the result of a sampling step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch


class SampleResult(NamedTuple):
    """One sampled token per logits row.

    ``tokens[i]`` is -1 only when row i had no allowed token with a finite logit (a grammar that
    allows nothing, or a row of -inf); ``logprobs[i]`` is then -inf.
    ``logprobs[i]`` is the log-probability of the chosen token under the *masked* distribution at
    temperature 1, before top-k / top-p / min-p: the model's own probability given the constraint.
    """

    tokens: torch.Tensor
    logprobs: torch.Tensor


def on_device(values: list, dtype: torch.dtype | None, device: torch.device | str) -> torch.Tensor:
    """A host list as a tensor on `device`: built on the host, then one asynchronous copy
    (`torch.tensor(device=cuda)` would wait for every kernel queued before it, the forward)."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


@dataclass(frozen=True)
class SamplingTensors:
    """Sampling parameters, one entry per logits row, all on the logits' device.

    ``temperature <= 0`` means greedy (argmax of the masked logits; the filters are then moot);
    ``top_k <= 0``, ``top_p >= 1`` and ``min_p <= 0`` switch the filter off. ``(seed, offset)``
    alone fixes a row's random draw, so a row's token does not depend on the rest of the batch.

    The ``uses_*``/``all_greedy``/``logprobs`` hints are host-side facts that let :func:`sample`
    skip whole passes without reading the tensors back (a host sync). Their defaults are the safe
    choice: "maybe". :meth:`build` sets the filter hints exactly; ``logprobs=False`` (nobody reads
    the chosen tokens' logprobs) lets the CPU path skip the log-sum-exp pass over the vocabulary,
    and the logprobs it returns are then NaN.
    """

    temperature: torch.Tensor  # float32[B]
    top_k: torch.Tensor  # int32/int64[B]
    top_p: torch.Tensor  # float32[B]
    min_p: torch.Tensor  # float32[B]
    seed: torch.Tensor  # int64[B]
    offset: torch.Tensor  # int64[B]
    uses_top_k_or_top_p: bool = True
    uses_min_p: bool = True
    all_greedy: bool = False
    logprobs: bool = True

    def __post_init__(self) -> None:
        b = self.temperature.shape
        for name in ("top_k", "top_p", "min_p", "seed", "offset"):
            t = getattr(self, name)
            if t.shape != b or t.device != self.temperature.device:
                raise ValueError(
                    f"SamplingTensors.{name} has shape {tuple(t.shape)} on {t.device}; every field "
                    f"must be a 1-D tensor of shape {tuple(b)} on {self.temperature.device}"
                )
        if len(b) != 1:
            raise ValueError("SamplingTensors fields must be 1-D (one entry per logits row)")

    @property
    def batch_size(self) -> int:
        return self.temperature.shape[0]

    @classmethod
    def build(
        cls,
        temperature: Sequence[float],
        top_k: Sequence[int] | None = None,
        top_p: Sequence[float] | None = None,
        min_p: Sequence[float] | None = None,
        seed: Sequence[int] | None = None,
        offset: Sequence[int] | None = None,
        device: torch.device | str = "cpu",
        logprobs: bool = True,
    ) -> SamplingTensors:
        """Validate host-side values and copy them to ``device`` (omitted filters are off)."""
        n = len(temperature)
        top_k = [0] * n if top_k is None else list(top_k)
        top_p = [1.0] * n if top_p is None else list(top_p)
        min_p = [0.0] * n if min_p is None else list(min_p)
        seed = [0] * n if seed is None else list(seed)
        offset = [0] * n if offset is None else list(offset)
        for name, values in (("top_k", top_k), ("top_p", top_p), ("min_p", min_p)):
            if len(values) != n:
                raise ValueError(f"{name} has {len(values)} entries for {n} rows")
        if any(not 0.0 < p <= 1.0 for p in top_p):
            raise ValueError("top_p must be in (0, 1]; use 1.0 to switch it off")
        if any(not 0.0 <= p <= 1.0 for p in min_p):
            raise ValueError("min_p must be in [0, 1]; use 0.0 to switch it off")
        sampled = [t > 0 for t in temperature]
        return cls(
            temperature=on_device(list(temperature), torch.float32, device),
            top_k=on_device(top_k, torch.int64, device),
            top_p=on_device(top_p, torch.float32, device),
            min_p=on_device(min_p, torch.float32, device),
            seed=on_device(seed, torch.int64, device),
            offset=on_device(offset, torch.int64, device),
            uses_top_k_or_top_p=any(
                s and (k > 0 or p < 1.0) for s, k, p in zip(sampled, top_k, top_p, strict=True)
            ),
            uses_min_p=any(s and p > 0.0 for s, p in zip(sampled, min_p, strict=True)),
            all_greedy=not any(sampled),
            logprobs=logprobs,
        )
