"""CorralRouter: Ray Serve's request router for the replicas, driven by ``affinity``.

Ray Serve runs one router per deployment handle, here inside the ingress replica, and calls
``choose_replicas`` for every request with the handle call's arguments: the ASGI scope and
body (``ingress.py``). ``on_request_routed`` is told where each request went, which is what the
affinity index records. Queue lengths come from Ray Serve's own cache of the replicas' replies.

A request's routing key parses its whole body (a large schema: milliseconds), so it is computed
once, when the request is first ranked, and kept until the request is routed; keys of requests
that are never routed (their caller left) fall out of a small bounded table.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    ReplicaResult,
    RequestRouter,
    RunningReplica,
)

from corral.fleet.affinity import AffinityIndex, Policy, RoutingKey, rank_replicas, routing_key

#: routing keys kept for requests ranked but not routed yet (more are in flight only when the
#: ingress holds that many requests that Ray Serve has not placed; a forgotten key is re-parsed)
_PENDING_KEYS = 1024


class CorralRouter(RequestRouter):
    """Prefix first, then the compiled constraint, then the least loaded replica."""

    def initialize_state(self, **policy: Any) -> None:
        """``policy``: the fields of ``affinity.Policy`` (``request_router_kwargs``)."""
        self._policy = Policy(**policy)
        self._index = AffinityIndex()
        self._pending: OrderedDict[str, RoutingKey] = OrderedDict()

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        key = self._key(pending_request, keep=True)
        queue_lens = {
            rid: self.replica_queue_len_cache.get(r.replica_id) for rid, r in by_id.items()
        }
        ranks = rank_replicas(key, list(by_id), queue_lens, self._index, self._policy)
        return [[by_id[rid] for rid in rank] for rank in ranks]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: ReplicaResult
    ) -> None:
        self._index.record(replica_id.unique_id, self._key(pending_request, keep=False))

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._index.forget(replica_id.unique_id)

    def _key(self, pending_request: PendingRequest | None, keep: bool) -> RoutingKey:
        """The routing key of a ``Replica.asgi(scope, body)`` call, parsed at most once while
        the request waits to be routed (Ray Serve may rank it again); ``keep`` False: the
        request is routed, its key is not needed again."""
        if pending_request is None or len(pending_request.args) != 2:
            return RoutingKey()
        request_id = pending_request.metadata.internal_request_id
        key = self._pending.pop(request_id, None)
        if key is None:
            key = routing_key(*pending_request.args)
        if keep:
            self._pending[request_id] = key
            while len(self._pending) > _PENDING_KEYS:
                self._pending.popitem(last=False)
        return key
