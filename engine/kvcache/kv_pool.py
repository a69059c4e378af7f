"""The KV pool: every key/value slot the engine will ever use, allocated once up front.

A *slot* holds the key and value vectors of one token in every layer. The pool owns the
buffers and a free list; who owns an allocated slot (the radix tree, or a live request) is
the caller's business, checked by `RadixCache.check_integrity(held=...)`.

Invariants:
- Slot `PAD_SLOT` (0) is never handed out and never freed. The model runner may write the KV
  of padding tokens there (e.g. CUDA-graph padding) without corrupting anyone's cache.
- Every other slot is either free (in the free list exactly once) or allocated; `free` of a
  slot that is already free raises `DoubleFreeError` instead of corrupting the free list.
- Index tensors returned by `alloc` are fresh int64 CPU tensors, owned by the caller. The free
  list lives on the host so that "is there room?" never needs a device sync; the model runner
  copies the indices to the device when it builds a batch.
"""

from __future__ import annotations

import torch

PAD_SLOT = 0
"""Reserved slot: never allocated, never freed; a safe write target for padding tokens."""

_SMALL_FREE = 256  # below this many indices, `free` validates them as a Python list


class KVIntegrityError(RuntimeError):
    """The KV bookkeeping is inconsistent: a bug in the engine, never a client mistake."""


class DoubleFreeError(KVIntegrityError):
    """A slot was freed while already free (or twice in one call)."""


def format_slots(t: torch.Tensor, limit: int = 8) -> str:
    """The first `limit` slots of `t` for an error message."""
    vals = t.reshape(-1)[:limit].tolist()
    more = ", ..." if t.numel() > limit else ""
    return f"[{', '.join(map(str, vals))}{more}]"


class KVPool:
    """Per-layer K and V buffers of shape `[num_slots, num_kv_heads, head_dim]` plus a free list.

    `alloc` and `free` are vectorised (a few tensor ops per call, no per-token Python loop).
    Usable capacity is `num_slots - 1` because slot `PAD_SLOT` is reserved.
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        num_slots: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        for name, val in (
            ("num_layers", num_layers),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
        ):
            if val < 1:
                raise ValueError(f"KVPool: {name} must be >= 1, got {val}")
        if num_slots < 2:
            raise ValueError(
                f"KVPool: num_slots must be >= 2 (slot {PAD_SLOT} is reserved for padding), "
                f"got {num_slots}; raise the KV memory budget"
            )
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.num_slots = num_slots
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (num_slots, num_kv_heads, head_dim)
        # Zeros, not empty: garbage (NaN) in an unused slot would leak through a masked
        # attention as 0 * NaN = NaN.
        self.k_buffers = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v_buffers = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        # Free list as a stack: _stack[:_num_free] are the free slots; alloc pops from the top.
        # Reversed so a fresh pool hands out slots 1, 2, 3, ... in order.
        self._stack = torch.arange(num_slots - 1, 0, -1, dtype=torch.int64)
        self._num_free = num_slots - 1
        self._is_free = torch.ones(num_slots, dtype=torch.bool)
        self._is_free[PAD_SLOT] = False

    @staticmethod
    def slot_bytes(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """Bytes one slot costs: K and V, in every layer."""
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * num_kv_heads * head_dim * elem

    @classmethod
    def from_budget(
        cls,
        budget_bytes: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> KVPool:
        """The largest pool whose K and V buffers fit in `budget_bytes` (the pad slot included)."""
        per_slot = cls.slot_bytes(num_layers, num_kv_heads, head_dim, dtype)
        num_slots = int(budget_bytes) // per_slot
        if num_slots < 2:
            raise ValueError(
                f"KV memory budget of {budget_bytes} bytes holds {num_slots} slot(s) of "
                f"{per_slot} bytes; at least 2 are needed (one is the padding slot). "
                "Raise the KV memory budget."
            )
        return cls(num_layers, num_kv_heads, head_dim, num_slots, dtype, device)

    @property
    def num_free(self) -> int:
        """Slots that `alloc` can hand out right now."""
        return self._num_free

    @property
    def capacity(self) -> int:
        """Slots that can ever be allocated at once (`num_slots - 1`: the pad slot is reserved)."""
        return self.num_slots - 1

    def alloc(self, n: int) -> torch.Tensor | None:
        """`n` free slots as a fresh int64 CPU tensor, or None when fewer than `n` are free.

        Never raises for lack of room: the caller decides whether to evict, wait or preempt.
        """
        if n < 0:
            raise ValueError(f"KVPool.alloc: n must be >= 0, got {n}")
        if n > self._num_free:
            return None
        top = self._num_free
        out = self._stack[top - n : top].flip(0)  # flip copies: the stack is reused later
        self._is_free[out] = False
        self._num_free = top - n
        return out

    def free(self, indices: torch.Tensor) -> None:
        """Return slots to the pool. Raises `DoubleFreeError` if any is already free.

        Validation happens before any change, so a failed call leaves the pool untouched.
        """
        idx = torch.as_tensor(indices, dtype=torch.int64).reshape(-1).cpu()
        k = idx.numel()
        if k == 0:
            return
        lo, hi, distinct = self._summarise(idx)
        if lo < 1 or hi >= self.num_slots:
            bad = idx[(idx < 1) | (idx >= self.num_slots)]
            raise KVIntegrityError(
                f"KVPool.free: slots {format_slots(bad)} are not allocatable slots "
                f"(valid: 1..{self.num_slots - 1}; slot {PAD_SLOT} is the reserved pad slot)"
            )
        already = self._is_free[idx]
        if bool(already.any()):
            raise DoubleFreeError(
                f"KVPool.free: slots {format_slots(idx[already])} are already free; a slot must be "
                "freed exactly once, by its current owner (the radix tree or one live request)"
            )
        if not distinct:
            raise DoubleFreeError(
                f"KVPool.free: the same slot appears twice in {format_slots(idx)}; "
                "a slot must be freed exactly once"
            )
        self._stack[self._num_free : self._num_free + k] = idx
        self._is_free[idx] = True
        self._num_free += k

    @staticmethod
    def _summarise(idx: torch.Tensor) -> tuple[int, int, bool]:
        """(min, max, all distinct) of a non-empty index tensor, cheaply for either size."""
        if idx.numel() <= _SMALL_FREE:  # tensor ops cost ~5-20 us each; a short list is cheaper
            vals = idx.tolist()
            return min(vals), max(vals), len(set(vals)) == len(vals)
        lo, hi = torch.aminmax(idx)
        srt = torch.sort(idx).values
        return int(lo), int(hi), not bool((srt[1:] == srt[:-1]).any())

    def free_slots(self) -> torch.Tensor:
        """A copy of the free slots (int64 CPU, unordered)."""
        return self._stack[: self._num_free].clone()

    def is_free(self, indices: torch.Tensor) -> torch.Tensor:
        """Bool tensor: which of `indices` are free right now."""
        return self._is_free[torch.as_tensor(indices, dtype=torch.int64).cpu()]

    def check_integrity(self) -> None:
        """Raise `KVIntegrityError` unless the free stack and the free mask agree exactly."""
        free = self._stack[: self._num_free]
        counts = torch.bincount(free, minlength=self.num_slots)
        if free.numel() and int(counts.max()) > 1:
            raise KVIntegrityError(
                f"KVPool: slots {format_slots(torch.nonzero(counts > 1).reshape(-1))} are in the "
                "free list twice"
            )
        if not torch.equal(counts.bool(), self._is_free):
            diff = torch.nonzero(counts.bool() != self._is_free).reshape(-1)
            raise KVIntegrityError(
                f"KVPool: free list and free mask disagree on {format_slots(diff)}"
            )
        if bool(self._is_free[PAD_SLOT]):
            raise KVIntegrityError(f"KVPool: the pad slot {PAD_SLOT} is marked free")

    def __repr__(self) -> str:
        return (
            f"KVPool(layers={self.num_layers}, kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, slots={self.num_slots}, free={self._num_free}, "
            f"dtype={self.dtype}, device={self.device})"
        )
