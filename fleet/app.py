"""FleetConfig and the Ray Serve application of `corral fleet`: N replicas behind one endpoint.

The application is two deployments: ``Ingress`` (one replica, no model) takes HTTP from Ray
Serve's proxy, and ``Replica`` (N replicas, one Corral engine each) serves it, chosen per
request by ``CorralRouter``. Every replica runs the same ``ServerConfig``, so a fleet answers
exactly as one `corral serve` with those settings would.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import signal
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any

from corral.api.config import ServerConfig
from corral.engine.serving.config import available_cores
from corral.fleet.affinity import Policy

log = logging.getLogger("corral.fleet")
APP_NAME = "corral"


@dataclass(frozen=True)
class FleetConfig:
    """How `corral fleet` runs.

    ``server``: every replica's settings (host and port are the fleet's endpoint). ``address``:
    an existing Ray cluster (``ray://…`` or ``auto``); None starts a local Ray with
    ``cpus`` CPUs (default: this machine's cores). ``server.threads`` None gives each replica
    an equal share of those CPUs.
    """

    server: ServerConfig = field(default_factory=ServerConfig)
    replicas: int = 2
    address: str | None = None
    cpus: int | None = None
    policy: Policy = field(default_factory=Policy)

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        if self.cpus is not None and self.cpus < 1:
            raise ValueError(f"cpus must be >= 1, got {self.cpus}")
        if self.address is not None and self.cpus is not None:
            raise ValueError("--cpus sizes a local Ray; a cluster at --address has its own")

    @property
    def local_cpus(self) -> int:
        return self.cpus or available_cores()

    @property
    def replica_threads(self) -> int:
        """Torch threads (and Ray CPUs) per replica."""
        if self.server.threads is not None:
            return self.server.threads
        if self.address is not None:
            return 1  # a cluster's nodes differ; say --threads to use more
        return max(1, self.local_cpus // self.replicas)


def build_application(config: FleetConfig) -> Any:
    """The Ray Serve application (bound, not yet running)."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from corral.fleet.ingress import Ingress
    from corral.fleet.replica import Replica
    from corral.fleet.router import CorralRouter

    server = dataclasses.replace(config.server, threads=config.replica_threads)
    in_flight = server.max_concurrent + server.queue_limit  # Corral's 429 decides, not Ray's queue
    replica = serve.deployment(Replica).options(
        name="corral-replica",
        num_replicas=config.replicas,
        max_ongoing_requests=in_flight,
        ray_actor_options={"num_cpus": server.threads},
        request_router_config=RequestRouterConfig(
            request_router_class=CorralRouter,
            request_router_kwargs=dataclasses.asdict(config.policy),
        ),
    )
    ingress = serve.deployment(serve.ingress()(Ingress)).options(
        name="corral-ingress",
        num_replicas=1,
        max_ongoing_requests=in_flight * config.replicas,
        ray_actor_options={"num_cpus": 0},
    )
    return ingress.bind(replica.bind(server), server.max_body_bytes)


class FleetRunner:
    """Starts the application on Ray (a local Ray it starts itself, or ``address``'s cluster)
    and stops it again; a context manager. A local Ray is shut down with it and its temporary
    folder removed; a cluster is left running, without the application."""

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self._temp_dir: str | None = None

    def start(self) -> None:
        """Returns once every replica is ready."""
        import ray
        from ray import serve

        c = self.config
        if c.address is None:
            self._start_local_ray()
        else:
            ray.init(address=c.address)
        try:
            serve.start(http_options={"host": c.server.host, "port": c.server.port})
            serve.run(build_application(c), name=APP_NAME, route_prefix="/")
        except BaseException:
            self.stop()
            raise

    def _start_local_ray(self, attempts: int = 3) -> None:
        """A lean local Ray: the CPUs asked for, no dashboard, files in a temporary folder.
        Ray's raylet waits a fixed 15 s for its agent processes (and the driver 30 s for the
        raylet), which a machine with saturated CPUs can miss; Ray then raises a bare
        ``Exception``, and another try may start."""
        import ray

        c = self.config
        for attempt in range(1, attempts + 1):
            self._temp_dir = tempfile.mkdtemp(prefix="corral-ray-")
            try:
                ray.init(
                    num_cpus=max(c.local_cpus, c.replicas * c.replica_threads),
                    include_dashboard=False,
                    _temp_dir=self._temp_dir,
                )
                return
            except Exception as e:
                ray.shutdown()
                shutil.rmtree(self._temp_dir, ignore_errors=True)
                if attempt == attempts:
                    raise
                log.warning("local Ray did not start (%s); trying again", e)

    def stop(self) -> None:
        import ray
        from ray import serve

        if self.config.address is not None:
            serve.delete(APP_NAME)
            return
        serve.shutdown()
        ray.shutdown()
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)

    def __enter__(self) -> FleetRunner:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run(config: FleetConfig) -> int:
    """Start the fleet, print where it serves, and wait for SIGINT or SIGTERM."""
    logging.basicConfig(
        level=config.server.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    where = config.address or f"local Ray, {config.local_cpus} CPUs"
    print(f"Corral fleet: starting {config.replicas} replicas on {where} ...", file=sys.stderr,
          flush=True)  # fmt: skip
    with FleetRunner(config):
        s = config.server
        print(f"Corral fleet: {config.replicas} replicas of "
              f"{s.model or 'the embedded SmolLM2-135M-Instruct'} "
              f"({config.replica_threads} threads each) at http://{s.host}:{s.port}/v1",
              flush=True)  # fmt: skip
        while not done.wait(1.0):  # a timed wait lets the signal handlers run promptly
            pass
    return 0
