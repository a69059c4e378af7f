"""EngineConfig: every knob of the engine loop, frozen and validated where it is built."""

from __future__ import annotations

import os
from dataclasses import dataclass

from corral.engine.serving.faults import parse_faults

IDLE_WAIT_S = 0.02  # longest wait for a late mask fill before the loop looks at its inbox again


@dataclass(frozen=True)
class EngineConfig:
    """Scheduling, memory and sampling-loop settings of one `Engine`.

    - `kv_cache_bytes`: memory for the KV pool (K and V of every layer) on the CPU; fixes how
      many tokens can be held at once across running requests and the prefix cache.
    - `gpu_memory_fraction`: on CUDA, the share of the device's memory the engine may fill
      (weights, activations, then the KV pool gets the rest; `engine.device`); None sizes the
      pool from `kv_cache_bytes` on CUDA too.
    - `max_num_seqs`: most sequences decoding in one step.
    - `max_batched_tokens`: the token budget of one step (decodes + prefill chunks + drafts);
      a long prompt is prefilled in chunks of what is left, so decodes never stall behind it.
    - `max_model_len`: prompt + max_tokens limit; None means the model's own context length.
    - `prefix_cache`: reuse the KV of prefixes seen before (radix tree).
    - `jump_forward`: append the grammar's forced continuation as a draft in one extend step.
    - `max_draft_tokens`: longest jump-forward draft per step.
    - `speculative`: prompt-lookup speculation for every sequence (`engine.constrained.lookup`):
      the tokens after the latest earlier occurrence of its longest suffix n-gram are drafted
      and verified in the same pass (exact like every draft); a request may turn it off
      (`SamplingParams.speculative`). False (`--speculative false`) turns it off for all.
    - `lookup_draft_tokens`: the most tokens one lookup proposal drafts (its adaptive k's
      ceiling); 0 turns speculation off.
    - `lookup_min_ngram`, `lookup_max_ngram`: the suffix n-gram lengths tried, longest first.
    - `lookup_min_tokens`: a sequence speculates once its prompt + output hold this many tokens
      (shorter ones have too little to mine).
    - `lookup_row_cost`: what one more row costs in a step, as a share of a one-token decode
      pass; each sequence drafts only as many tokens as its acceptance pays for at that cost
      (`engine.constrained.lookup`). None: 0.5 on the CPU, 0.05 on CUDA (`Engine` resolves it).
    - `num_threads`: torch intra-op threads; None (the default) resolves to the cores this
      process may use (`available_cores()`: CPU affinity, capped by a cgroup CPU quota).
    - `max_step_draft_tokens`: most jump-forward draft tokens fed in one step, over all
      sequences (each costs a mask row and a matcher accept in the step's mask fill).
    - `mask_threads`: worker threads that fill grammar masks during the forward pass (the
      stepping thread helps once the logits are ready); None resolves to `num_threads`.
    - `mask_grace_ms`: the per-step mask deadline: a constrained row whose mask is not ready
      this long after the logits sits the step out and runs again (`grammar_masks`); None
      waits for every mask.
    - `overlap`: overlap scheduling (`engine.overlap`): step n+1 is scheduled, and the model
      started on it, before step n's tokens are read back and postprocessed; outputs are the
      same either way.
    - `cuda_graphs`: on CUDA, decode steps of up to `max_num_seqs` sequences replay CUDA graphs
      captured per batch-size bucket (`engine.cuda_graphs`); False runs every step eagerly
      (`--no-cuda-graphs`). Ignored on the CPU.
    - `lpm_queue_limit`: order the waiting queue by longest cached prefix when it holds at most
      this many requests (the match costs a tree walk each); beyond it, first come first served.
    - `lpm_max_overtakes`: how many later arrivals may be admitted before a waiting request for
      their longer cached prefix; a request overtaken that often goes first (in arrival order),
      so a prompt that shares no prefix with the traffic is never starved by it.
    - `faults`: test-only fault injection (`engine.faults`, e.g. "step@3,seq@5"); None reads the
      `CORRAL_FAULTS` environment variable when the engine is built.
    """

    kv_cache_bytes: int = 1 << 30
    gpu_memory_fraction: float | None = 0.9
    max_num_seqs: int = 64
    max_batched_tokens: int = 512
    max_model_len: int | None = None
    prefix_cache: bool = True
    jump_forward: bool = True
    max_draft_tokens: int = 16
    speculative: bool = True
    lookup_draft_tokens: int = 8
    lookup_min_ngram: int = 2
    lookup_max_ngram: int = 4
    lookup_min_tokens: int = 64
    lookup_row_cost: float | None = None
    num_threads: int | None = None
    max_step_draft_tokens: int = 256
    mask_threads: int | None = None
    mask_grace_ms: float | None = 20.0
    overlap: bool = False
    cuda_graphs: bool = True
    lpm_queue_limit: int = 128
    lpm_max_overtakes: int = 8
    faults: str | None = None

    def __post_init__(self) -> None:
        checks = (
            ("kv_cache_bytes", self.kv_cache_bytes, 1),
            ("max_num_seqs", self.max_num_seqs, 1),
            ("max_batched_tokens", self.max_batched_tokens, 2),
            ("max_draft_tokens", self.max_draft_tokens, 0),
            ("lookup_draft_tokens", self.lookup_draft_tokens, 0),
            ("lookup_min_ngram", self.lookup_min_ngram, 1),
            ("lookup_max_ngram", self.lookup_max_ngram, self.lookup_min_ngram),
            ("lookup_min_tokens", self.lookup_min_tokens, 0),
            ("max_step_draft_tokens", self.max_step_draft_tokens, 0),
            ("mask_grace_ms", 0 if self.mask_grace_ms is None else self.mask_grace_ms, 0),
            ("lpm_queue_limit", self.lpm_queue_limit, 0),
            ("lpm_max_overtakes", self.lpm_max_overtakes, 0),
        )
        for name, value, low in checks:
            if value < low:
                raise ValueError(f"EngineConfig.{name} must be >= {low}, got {value}")
        if self.lookup_row_cost is not None and not self.lookup_row_cost >= 0:
            raise ValueError(
                f"EngineConfig.lookup_row_cost must be >= 0, got {self.lookup_row_cost}"
            )
        if self.gpu_memory_fraction is not None and not 0 < self.gpu_memory_fraction <= 1:
            raise ValueError(
                f"EngineConfig.gpu_memory_fraction must be in (0, 1], got "
                f"{self.gpu_memory_fraction}"
            )
        if self.max_num_seqs > self.max_batched_tokens:
            raise ValueError(
                f"EngineConfig.max_num_seqs ({self.max_num_seqs}) must not exceed "
                f"max_batched_tokens ({self.max_batched_tokens}): every decode needs one token"
            )
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"EngineConfig.max_model_len must be >= 2, got {self.max_model_len}")
        if self.faults is not None:
            parse_faults(self.faults)  # a malformed fault list is refused here, not mid-run
        if self.num_threads is None:
            object.__setattr__(self, "num_threads", available_cores())
        elif self.num_threads < 1:
            raise ValueError(f"EngineConfig.num_threads must be >= 1, got {self.num_threads}")
        if self.mask_threads is None:
            object.__setattr__(self, "mask_threads", self.num_threads)
        elif self.mask_threads < 1:
            raise ValueError(f"EngineConfig.mask_threads must be >= 1, got {self.mask_threads}")

    @property
    def threads(self) -> int:
        """Torch intra-op threads to use (`num_threads`, resolved)."""
        return int(self.num_threads)


def available_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by a cgroup v2 CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) // int(period))))
    except (OSError, ValueError):
        pass  # no cgroup v2 quota visible: the affinity is the limit
    return max(1, cores)
