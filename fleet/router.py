"""CorralRouter: Ray Serve's request router for the replicas, driven by ``affinity``.

Ray Serve runs one router per deployment handle, here inside the ingress replica, and calls
``choose_replicas`` for every request with the handle call's arguments: the ASGI scope and
body (``ingress.py``). ``on_request_routed`` is told where each request went, which is what the
affinity index records. Queue lengths come from Ray Serve's own cache of the replicas' replies.
"""

from __future__ import annotations

from typing import Any

from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    ReplicaResult,
    RequestRouter,
    RunningReplica,
)

from corral.fleet.affinity import AffinityIndex, Policy, RoutingKey, rank_replicas, routing_key


class CorralRouter(RequestRouter):
    """Prefix first, then the compiled constraint, then the least loaded replica."""

    def initialize_state(self, **policy: Any) -> None:
        """``policy``: the fields of ``affinity.Policy`` (``request_router_kwargs``)."""
        self._policy = Policy(**policy)
        self._index = AffinityIndex()

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        key = _key(pending_request)
        queue_lens = {
            rid: self.replica_queue_len_cache.get(r.replica_id) for rid, r in by_id.items()
        }
        ranks = rank_replicas(key, list(by_id), queue_lens, self._index, self._policy)
        return [[by_id[rid] for rid in rank] for rank in ranks]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: ReplicaResult
    ) -> None:
        self._index.record(replica_id.unique_id, _key(pending_request))

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._index.forget(replica_id.unique_id)


def _key(pending_request: PendingRequest | None) -> RoutingKey:
    """The routing key of a ``Replica.asgi(scope, body)`` call; parsing the body again for
    ``on_request_routed`` costs less than keeping keys of requests that may never be routed."""
    if pending_request is None or len(pending_request.args) != 2:
        return RoutingKey()
    scope, body = pending_request.args
    return routing_key(scope, body)
