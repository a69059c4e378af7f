"""Radix prefix cache: a tree over token ids whose edges carry KV pool slots (page size 1).

It knows nothing about requests. A typical caller (the scheduler) does:

    indices, match = cache.match_prefix(prompt)  # reuse len(indices) cached tokens
    node = cache.lock(match)                     # now the indices are safe to read
    need = len(prompt) - len(indices)
    fresh = pool.alloc(need)
    if fresh is None:                            # make room from unlocked cached prefixes
        cache.evict(need - pool.num_free)
        fresh = pool.alloc(need)                 # still None: the request must wait
    ...run the model, writing KV of the new tokens into `fresh`...
    cache.insert(prompt + output, torch.cat([indices, fresh, ...]))  # hands ALL slots over
    cache.unlock(node)

(A scheduler that needs logits for the prompt's last token matches at most `prompt[:-1]`.)

Ownership and safety rules (the invariants `check_integrity` enforces):
- Every allocatable pool slot is in exactly one place: the pool's free list, one tree node, or
  one live request (its freshly allocated, not yet inserted slots).
- `match_prefix` is a pure query (as mini-sglang's): it changes neither the tree's shape nor
  its LRU clocks, so ranking a waiting queue by cached prefix costs nothing but the walks.
  Nodes are split only by `lock` (a match that ends inside an edge) and `insert`. Its
  `PrefixMatch` is good until the tree next changes (`lock`, `insert`, `evict`): lock it at once.
- Indices returned by `match_prefix` are only safe to use while its match is locked; an
  unlocked path may be evicted (its slots freed and reused) by the next `evict`.
- `insert(ids, kv)` takes ownership of *every* slot in `kv`. Slots for tokens the tree did not
  have become tree slots. For the leading tokens it already had (the returned count) the tree
  keeps its own slots and frees the caller's duplicates, i.e. each `kv[i] != tree_slot[i]`.
  Slots equal to the tree's own (obtained from `match_prefix`) are left alone. So after
  `insert` the caller owns nothing in `kv`; to keep reading the KV (a still-running request),
  call `match_prefix(ids)` again and lock that match before unlocking the old node.
- `lock(node)` pins the node and all its ancestors (a reference count on the path), so a
  node's `lock_ref` is always >= the sum of its children's. Locked nodes are never evicted.
- A node always stands for the same prefix (root → its last token): a split inserts a new
  node *above* the split one, so a handle stays valid across splits. An evicted node is dead;
  locking it raises.
- `evict` removes only unlocked leaves, least recently used first (a logical clock ticked by
  `lock` and `insert`, never wall time: a path only looked at is not "used"), cascading to
  parents that become leaves.
  Since an unlocked node's descendants are all unlocked, `evict(n)` frees
  `min(n, evictable_size)` tokens or slightly more (whole nodes are evicted).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from corral.engine.kvcache.kv_pool import PAD_SLOT, KVIntegrityError, KVPool, format_slots

_EMPTY = torch.empty(0, dtype=torch.int64)


class Node:
    """One edge of the tree: `key` tokens whose KV lives in pool slots `value` (same length)."""

    __slots__ = ("key", "value", "parent", "children", "lock_ref", "last_access")

    def __init__(
        self, key: tuple[int, ...], value: torch.Tensor, parent: Node | None, last_access: int
    ) -> None:
        self.key = key
        self.value = value
        self.parent = parent
        self.children: dict[int, Node] = {}  # keyed by the child's first token
        self.lock_ref = 0
        self.last_access = last_access

    def __repr__(self) -> str:
        return f"Node(len={len(self.key)}, lock_ref={self.lock_ref}, t={self.last_access})"


@dataclass(frozen=True)
class PrefixMatch:
    """Where a `match_prefix` walk ended: `inside` tokens into `node`'s edge (all of it when the
    match ends on a node boundary; the root when nothing matched). `lock` turns it into a node,
    splitting the edge there first."""

    node: Node
    inside: int

    @property
    def on_boundary(self) -> bool:
        return self.inside == len(self.node.key)


def _as_key(ids: Sequence[int] | torch.Tensor) -> tuple[int, ...]:
    if isinstance(ids, torch.Tensor):
        return tuple(ids.reshape(-1).tolist())
    return tuple(int(t) for t in ids)


def _common_len(edge: tuple[int, ...], key: tuple[int, ...], start: int) -> int:
    """Length of the common prefix of `edge` and `key[start:]`."""
    m = min(len(edge), len(key) - start)
    if edge[:m] == key[start : start + m]:  # fast path: a C-level compare
        return m
    i = 0
    while edge[i] == key[start + i]:
        i += 1
    return i


class RadixCache:
    """Prefix cache over token ids; see the module docstring for the ownership rules."""

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool
        self.root = Node((), _EMPTY, None, 0)
        self._clock = 0
        self._evictable = 0  # tokens in nodes with lock_ref == 0
        self._protected = 0  # tokens in nodes with lock_ref > 0

    @property
    def evictable_size(self) -> int:
        """Tokens `evict` could free right now (in unlocked nodes)."""
        return self._evictable

    @property
    def protected_size(self) -> int:
        """Tokens pinned by locks."""
        return self._protected

    @property
    def total_size(self) -> int:
        """Tokens (= pool slots) owned by the tree."""
        return self._evictable + self._protected

    # ---- lookup and insertion -------------------------------------------------------------

    def match_prefix(self, ids: Sequence[int] | torch.Tensor) -> tuple[torch.Tensor, PrefixMatch]:
        """Slots of the longest cached prefix of `ids`, and where that prefix ends.

        A pure query: nothing is split and no clock moves. The indices are only safe to use
        once the match is locked (`lock(match)`, which pins exactly the matched prefix).
        """
        node, inside, values = self._find(_as_key(ids))
        return (torch.cat(values) if values else _EMPTY.clone()), PrefixMatch(node, inside)

    def insert(self, ids: Sequence[int] | torch.Tensor, kv_indices: torch.Tensor) -> int:
        """Add `ids` with their slots; return how many leading tokens were already cached.

        Takes ownership of every slot in `kv_indices` (see the module docstring): duplicates
        of slots the tree already holds for the same tokens are freed to the pool here. Marks
        the path of `ids` as just used.
        """
        key = _as_key(ids)
        kv = torch.as_tensor(kv_indices, dtype=torch.int64).reshape(-1).cpu()
        if kv.numel() != len(key):
            raise ValueError(
                f"RadixCache.insert: {len(key)} token ids but {kv.numel()} kv indices; "
                "pass one pool slot per token"
            )
        if not key:
            return 0
        end, inside, values = self._find(key)
        node = self._node_at(PrefixMatch(end, inside))
        self._touch(node)
        pos = sum(v.numel() for v in values)
        if pos:
            mine = kv[:pos]
            self.pool.free(mine[mine != torch.cat(values)])
        if pos < len(key):
            leaf = Node(key[pos:], kv[pos:].clone(), node, self._clock)
            node.children[key[pos]] = leaf
            self._evictable += len(leaf.key)
        return pos

    def _find(self, key: tuple[int, ...]) -> tuple[Node, int, list[torch.Tensor]]:
        """Follow `key` from the root, changing nothing: the deepest node reached, how many of
        its edge's tokens matched, and the matched slots edge by edge."""
        node, inside, pos, values = self.root, 0, 0, []
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                break
            n = _common_len(child.key, key, pos)
            values.append(child.value if n == len(child.key) else child.value[:n])
            node, inside, pos = child, n, pos + n
            if n < len(child.key):
                break
        return node, inside, values

    def _node_at(self, match: PrefixMatch) -> Node:
        """The node ending exactly where `match` ends, splitting its edge there if needed."""
        node = match.node
        if node is not self.root and node.parent is None:
            raise KVIntegrityError(
                "RadixCache.lock: this node was evicted; call match_prefix again and lock the "
                "match it returns (lock right after matching, before any evict)"
            )
        if not 0 < match.inside <= len(node.key) and node is not self.root:
            raise KVIntegrityError(
                f"RadixCache.lock: a match {match.inside} tokens into {node} is stale (the tree "
                "changed since match_prefix); match again"
            )
        return node if match.on_boundary else self._split(node, match.inside)

    def _touch(self, node: Node) -> None:
        """Mark `node` and its ancestors as used now (the LRU clock)."""
        self._clock += 1
        while node is not None:
            node.last_access = self._clock
            node = node.parent

    def _split(self, child: Node, n: int) -> Node:
        """Insert a node for `child.key[:n]` above `child`; the new node inherits its locks."""
        parent = child.parent
        assert parent is not None  # only attached nodes are walked
        head = Node(child.key[:n], child.value[:n], parent, child.last_access)
        head.lock_ref = child.lock_ref
        head.children[child.key[n]] = child
        parent.children[child.key[0]] = head
        child.key, child.value, child.parent = child.key[n:], child.value[n:], head
        return head

    # ---- locking and eviction -------------------------------------------------------------

    def lock(self, match: PrefixMatch) -> Node:
        """Pin the prefix `match` found (splitting its last edge where the match ends) and mark
        it used; returns the node to `unlock` later. Locking the root is a no-op."""
        node = self._node_at(match)
        self._touch(node)
        locked = node
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            node = node.parent
        return locked

    def unlock(self, node: Node) -> None:
        """Undo one `lock(node)`; raises if the node is not locked."""
        if node is not self.root and node.lock_ref <= 0:
            raise KVIntegrityError("RadixCache.unlock: node is not locked (unlock without lock)")
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._protected -= len(node.key)
                self._evictable += len(node.key)
            node = node.parent

    def evict(self, n_tokens: int) -> int:
        """Free at least `n_tokens` slots (if that many are evictable); return how many."""
        if n_tokens <= 0:
            return 0
        tie = 0  # breaks ties between equal clocks without comparing nodes
        heap: list[tuple[int, int, Node]] = []
        for leaf in self._unlocked_leaves():
            heap.append((leaf.last_access, tie, leaf))
            tie += 1
        heapq.heapify(heap)
        freed, dead = 0, []
        while freed < n_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[leaf.key[0]]
            leaf.parent = None
            dead.append(leaf.value)
            freed += len(leaf.key)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, tie, parent))
                tie += 1
        self._evictable -= freed
        if dead:
            self.pool.free(torch.cat(dead))
        return freed

    def _unlocked_leaves(self) -> list[Node]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node is not self.root and node.lock_ref == 0:
                out.append(node)
        return out

    # ---- integrity -----------------------------------------------------------------------

    def check_integrity(self, held: Sequence[torch.Tensor] | None = None) -> None:
        """Raise `KVIntegrityError` on any broken invariant. Cost: O(nodes + slots).

        Always checks the tree's shape, lock counts, clocks, size counters, that no slot is in
        the tree twice and that no tree slot is free in the pool, plus the pool's own free list.
        With `held` (the slots each live request holds outside the tree; `[]` when none) it
        also checks the exact partition: every allocatable slot is free, in the tree, or held,
        exactly once — so a leaked slot (e.g. after an abort) is caught.
        """
        self.pool.check_integrity()
        tree_slots = self._check_nodes()
        counts = torch.bincount(tree_slots, minlength=self.pool.num_slots)
        if tree_slots.numel() and int(counts.max()) > 1:
            dup = torch.nonzero(counts > 1).reshape(-1)
            raise KVIntegrityError(f"RadixCache: slots {format_slots(dup)} are in the tree twice")
        if tree_slots.numel() and bool(self.pool.is_free(tree_slots).any()):
            bad = tree_slots[self.pool.is_free(tree_slots)]
            raise KVIntegrityError(
                f"RadixCache: tree slots {format_slots(bad)} are free in the pool"
            )
        if held is not None:
            self._check_partition(tree_slots, held)

    def _check_nodes(self) -> torch.Tensor:
        evictable = protected = 0
        values: list[torch.Tensor] = []
        stack = [self.root]
        while stack:
            node = stack.pop()
            child_locks = 0
            for first, child in node.children.items():
                self._check_edge(node, first, child)
                child_locks += child.lock_ref
                stack.append(child)
            if node is self.root:
                continue
            if node.lock_ref < child_locks:
                raise KVIntegrityError(
                    f"RadixCache: {node} has lock_ref below its children's total {child_locks}"
                )
            values.append(node.value)
            if node.lock_ref:
                protected += len(node.key)
            else:
                evictable += len(node.key)
        if (evictable, protected) != (self._evictable, self._protected):
            raise KVIntegrityError(
                f"RadixCache: counted evictable={evictable} protected={protected}, but the "
                f"counters say {self._evictable} and {self._protected}"
            )
        slots = torch.cat(values) if values else _EMPTY
        if slots.numel() and (int(slots.min()) < 1 or int(slots.max()) >= self.pool.num_slots):
            raise KVIntegrityError(
                f"RadixCache: tree holds slots outside 1..{self.pool.num_slots - 1} "
                f"(slot {PAD_SLOT} is the pad slot)"
            )
        return slots

    @staticmethod
    def _check_edge(parent: Node, first: int, child: Node) -> None:
        if not child.key or child.key[0] != first:
            raise KVIntegrityError(f"RadixCache: child {child} filed under token {first}")
        if child.parent is not parent:
            raise KVIntegrityError(f"RadixCache: {child} has a wrong parent pointer")
        if child.value.numel() != len(child.key) or child.value.dtype != torch.int64:
            raise KVIntegrityError(f"RadixCache: {child} has {child.value.numel()} slots")
        if child.lock_ref < 0:
            raise KVIntegrityError(f"RadixCache: {child} has a negative lock_ref")
        if child.last_access > parent.last_access:
            raise KVIntegrityError(f"RadixCache: {child} was used after its parent {parent}")

    def _check_partition(self, tree_slots: torch.Tensor, held: Sequence[torch.Tensor]) -> None:
        parts = [self.pool.free_slots(), tree_slots]
        parts += [torch.as_tensor(h, dtype=torch.int64).reshape(-1).cpu() for h in held]
        every = torch.cat(parts)
        if every.numel() and (int(every.min()) < 1 or int(every.max()) >= self.pool.num_slots):
            raise KVIntegrityError(
                f"held slots must lie in 1..{self.pool.num_slots - 1} "
                f"(slot {PAD_SLOT} is the pad slot, owned by nobody)"
            )
        counts = torch.bincount(every, minlength=self.pool.num_slots)
        counts[PAD_SLOT] += 1  # the pad slot belongs to nobody: count it as owned once
        if bool((counts == 1).all()):
            return
        leaked = torch.nonzero(counts == 0).reshape(-1)
        twice = torch.nonzero(counts > 1).reshape(-1)
        raise KVIntegrityError(
            f"KV slots leaked (not free, not in the tree, not held): {format_slots(leaked)}; "
            f"owned more than once: {format_slots(twice)}"
        )
