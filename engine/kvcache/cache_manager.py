"""Who owns which KV slot: the glue between sequences, the KV pool and the radix tree.

The scheduler decides *whether* a sequence gets slots; this manager does the bookkeeping, so the
scheduler never touches a tensor. Ownership follows `Sequence`'s KV invariant: `seq.kv[:prefix_len]`
belongs to the tree (pinned by the lock on `seq.node`), `seq.kv[prefix_len:]` to the sequence.
"""

from __future__ import annotations

import torch

from corral.engine.kvcache.kv_pool import KVPool
from corral.engine.kvcache.radix_cache import RadixCache
from corral.engine.serving.core import Sequence


class CacheManager:
    """Prefix matching, slot allocation (evicting the tree first) and release of sequences."""

    def __init__(self, pool: KVPool, prefix_cache: bool = True) -> None:
        self.pool = pool
        self.radix = RadixCache(pool)
        self.prefix_cache = prefix_cache
        self.hit_tokens = 0  # prompt tokens served from the tree (the scheduler counts them)

    @property
    def capacity(self) -> int:
        return self.pool.capacity

    def available(self) -> int:
        """Slots that `alloc` could hand out now, evicting unlocked tree nodes if needed."""
        return self.pool.num_free + self.radix.evictable_size

    def match_len(self, seq: Sequence) -> int:
        """How many tokens of `seq` the tree holds now (for prefix-aware ordering); a pure
        query: the tree and its LRU clocks stay as they are."""
        if not self.prefix_cache:
            return 0
        return int(self.radix.match_prefix(seq.tokens(0, seq.reuse_limit))[0].numel())

    def admit(self, seq: Sequence) -> None:
        """Reuse the longest cached prefix of `seq` (at most `seq.reuse_limit` tokens: all but
        its last, or fewer where its prompt logprobs need the logits) and lock it."""
        if self.prefix_cache:
            idx, match = self.radix.match_prefix(seq.tokens(0, seq.reuse_limit))
        else:
            idx, match = self.radix.match_prefix(())
        seq.kv, seq.node = idx, self.radix.lock(match)
        seq.prefix_len = seq.num_computed = int(idx.numel())

    def alloc(self, n: int) -> torch.Tensor | None:
        """`n` fresh slots, evicting least-recently-used tree leaves if the pool is short."""
        slots = self.pool.alloc(n)
        if slots is None and self.radix.evictable_size + self.pool.num_free >= n:
            self.radix.evict(n - self.pool.num_free)
            slots = self.pool.alloc(n)
        return slots

    def grow(self, seq: Sequence, n: int) -> bool:
        """Append `n` slots to `seq.kv` (for its next forward); False when memory is short."""
        slots = self.alloc(n)
        if slots is None:
            return False
        seq.kv = torch.cat((seq.kv, slots))
        return True

    def truncate(self, seq: Sequence) -> None:
        """Free the slots past `seq.num_computed` (rejected jump-forward draft tokens)."""
        extra = seq.kv[seq.num_computed :]
        if extra.numel():
            self.pool.free(extra)
            seq.kv = seq.kv[: seq.num_computed]

    def cache_computed(self, seq: Sequence) -> None:
        """Hand the computed tokens to the tree now, so other requests (n > 1 siblings, equal
        prompts) can reuse them while `seq` keeps running; `seq` then holds a lock on them."""
        if not self.prefix_cache or seq.num_computed <= seq.prefix_len:
            return
        n = seq.num_computed
        ids = seq.tokens(0, n)
        self.radix.insert(ids, seq.kv[:n])
        idx, match = self.radix.match_prefix(ids)
        node = self.radix.lock(match)
        self.radix.unlock(seq.node)
        seq.kv = torch.cat((idx, seq.kv[n:]))
        seq.node, seq.prefix_len = node, n

    def release(self, seq: Sequence, keep: bool = True) -> None:
        """Give up everything `seq` holds. With `keep` (finish, preemption) its computed tokens
        stay in the tree for later requests; without (abort) its own slots go back to the pool."""
        if seq.kv is None:
            return
        self.truncate(seq)
        if keep and self.prefix_cache and seq.num_computed > seq.prefix_len:
            self.radix.insert(seq.tokens(0, seq.num_computed), seq.kv)
        else:
            self.pool.free(seq.kv[seq.prefix_len :])
        self.radix.unlock(seq.node)
        seq.kv, seq.node = None, None
        seq.prefix_len = seq.num_computed = 0

    def check_integrity(self, live: list[Sequence]) -> None:
        """Raise `KVIntegrityError` unless every slot is free, in the tree, or held once."""
        held = [s.kv[s.prefix_len :] for s in live if s.kv is not None]
        self.radix.check_integrity(held=held)
