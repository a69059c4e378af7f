"""Which replica should serve a request: prefix and constraint affinity, with a load guard.

The router cannot see a replica's radix cache or compile cache, so it keeps what it can know:
the prompts and constraints it has sent to each replica (the approach of SGLang's and Ray LLM's
cache-aware routers). A prompt is read as text and cut into fixed blocks whose hashes are
chained, so a block's hash stands for the whole prefix up to it; a replica "holds" the longest
run of leading blocks it was sent. Both records are bounded LRUs, so a replica's record forgets
what its own caches would have evicted long ago.

Nothing here imports Ray: ``router.py`` feeds it Ray's replica ids and queue lengths.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: characters per prefix block; shorter shared openings (a role tag) do not count as a prefix
BLOCK_CHARS = 64
#: the header that names the replica that answered, and that pins a request to one replica
REPLICA_HEADER = "x-corral-replica"
# The request fields that make up a constraint: the same values, the same compiled grammar.
_CONSTRAINT_FIELDS = ("response_format", "tools", "tool_choice", "regex", "grammar", "choice")


@dataclass(frozen=True)
class RoutingKey:
    """What the router knows about one request.

    ``blocks``: chained hashes of the prompt text's full ``BLOCK_CHARS`` blocks. ``constraint``:
    a digest of the constraint fields, or None for a free-form request. ``pin``: the replica
    the client asked for with ``X-Corral-Replica`` (a scrape of one replica's /metrics).
    """

    blocks: tuple[int, ...] = ()
    constraint: str | None = None
    pin: str | None = None


def routing_key(scope: Mapping[str, Any], body: bytes) -> RoutingKey:
    """The key of an HTTP request (its ASGI scope and body); a body that is not a JSON object
    (a GET, a malformed request the replica will refuse) has no prefix and no constraint."""
    pin = _header(scope, REPLICA_HEADER.encode())
    try:
        request = json.loads(body) if body else None
    except ValueError:
        request = None
    if not isinstance(request, dict):
        return RoutingKey(pin=pin)
    return RoutingKey(_blocks(_prompt_text(request)), _constraint_digest(request), pin)


def _header(scope: Mapping[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1").strip() or None
    return None


def _prompt_text(request: dict[str, Any]) -> str:
    """The prompt as the chat template would order it: tools first (they render into the
    system turn), then the messages; a completion's prompt as given. JSON text keeps
    message boundaries, so two conversations share a prefix only where their turns do."""
    if "messages" in request:
        return json.dumps([request.get("tools"), request["messages"]], ensure_ascii=False)
    prompt = request.get("prompt")
    return prompt if isinstance(prompt, str) else json.dumps(prompt)


def _blocks(text: str) -> tuple[int, ...]:
    hashes, h = [], 0
    for start in range(0, len(text) - BLOCK_CHARS + 1, BLOCK_CHARS):
        h = hash((h, text[start : start + BLOCK_CHARS]))
        hashes.append(h)
    return tuple(hashes)


def _constraint_digest(request: dict[str, Any]) -> str | None:
    fields = {k: request[k] for k in _CONSTRAINT_FIELDS if request.get(k) is not None}
    if not fields:
        return None
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.blake2b(canonical.encode(), digest_size=16).hexdigest()


class _Lru:
    """A bounded set that forgets its least recently touched members first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[Any, None] = OrderedDict()

    def touch(self, items: Iterable[Any]) -> None:
        for item in items:
            self._items[item] = None
            self._items.move_to_end(item)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def __contains__(self, item: Any) -> bool:
        return item in self._items


class AffinityIndex:
    """Per replica: the prefix blocks and constraints it was sent, each a bounded LRU."""

    def __init__(self, max_blocks: int = 1 << 16, max_constraints: int = 4096) -> None:
        self.max_blocks, self.max_constraints = max_blocks, max_constraints
        self._blocks: dict[str, _Lru] = {}
        self._constraints: dict[str, _Lru] = {}

    def record(self, replica: str, key: RoutingKey) -> None:
        """``key``'s request was sent to ``replica``: its caches now hold the prefix and the
        compiled constraint."""
        self._blocks.setdefault(replica, _Lru(self.max_blocks)).touch(key.blocks)
        if key.constraint is not None:
            self._constraints.setdefault(replica, _Lru(self.max_constraints)).touch(
                [key.constraint]
            )

    def forget(self, replica: str) -> None:
        """The replica is gone; a new one starts with empty caches."""
        self._blocks.pop(replica, None)
        self._constraints.pop(replica, None)

    def prefix_blocks(self, replica: str, key: RoutingKey) -> int:
        """How many leading blocks of ``key``'s prompt ``replica`` was sent before."""
        held = self._blocks.get(replica)
        n = 0
        if held is not None:
            while n < len(key.blocks) and key.blocks[n] in held:
                n += 1
        return n

    def holds_constraint(self, replica: str, key: RoutingKey) -> bool:
        held = self._constraints.get(replica)
        return key.constraint is not None and held is not None and key.constraint in held


@dataclass(frozen=True)
class Policy:
    """``min_prefix_share``: the share of a prompt's blocks a replica must hold for the prefix
    to count. ``max_imbalance``: how many more requests in flight than the least loaded replica
    a preferred one may have before the request goes to the least loaded one instead."""

    min_prefix_share: float = 0.25
    max_imbalance: int = 8


def rank_replicas(
    key: RoutingKey,
    replicas: list[str],
    queue_lens: Mapping[str, int | None],
    index: AffinityIndex,
    policy: Policy = Policy(),
) -> list[list[str]]:
    """Replicas in ranks, most preferred first; the caller sends to the least loaded replica of
    the first rank that has room (Ray Serve's contract for ``choose_replicas``).

    A pinned request goes to its replica. Otherwise replicas within ``max_imbalance`` of the
    least loaded one compete on (prefix blocks held, constraint held); the winners form the
    first rank, everyone else the second. With nothing held anywhere, all replicas form one
    rank, shuffled: the least loaded one gets it, ties broken at random rather than always
    loading the first replica.
    """
    if key.pin in replicas:
        return [[key.pin]]
    loads = {r: queue_lens.get(r) or 0 for r in replicas}
    least = min(loads.values(), default=0)
    need = max(1, int(policy.min_prefix_share * len(key.blocks) + 0.999))

    def score(r: str) -> tuple[int, bool]:
        held = index.prefix_blocks(r, key)
        return (held if held >= need else 0, index.holds_constraint(r, key))

    scores = {r: score(r) for r in replicas if loads[r] - least <= policy.max_imbalance}
    best = max(scores.values(), default=(0, False))
    if best == (0, False):
        return [random.sample(replicas, len(replicas))]
    first = [r for r, s in scores.items() if s == best]
    return [first, [r for r in replicas if r not in first]]
