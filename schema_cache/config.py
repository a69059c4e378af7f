"""CacheConfig: where the compiled-constraint cache lives and how it is bounded."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from corral.base.paths import constraints_root

#: How compiles are isolated: ``thread`` (in process, fast), ``process`` (killable worker
#: processes, always bounded) or ``auto`` (in process unless the constraint looks risky).
ISOLATION_MODES = ("auto", "thread", "process")


@dataclass(frozen=True)
class CacheConfig:
    """Bounds and policies of the compiled-constraint cache and the compile service.

    ``root`` defaults to ``constraints/`` in Corral's cache folder (``corral.base.paths``).
    ``max_disk_bytes`` bounds every file under ``root`` (all tokenizers together); an entry
    larger than the whole budget is kept in memory only. ``max_memory_bytes`` bounds the
    in-process LRU by the estimated size of its entries (payload plus the backend's native
    form), beside ``max_memory_entries``. ``compile_deadline_s`` bounds each compile as the
    caller sees it; a compile past it is a :class:`CompileUnavailable` (``compile_timeout``:
    HTTP 503 with ``Retry-After``), never cached as a refusal. Refusals (ConstraintError) are
    cached for ``failure_ttl_s``. ``process_workers`` worker processes compile the risky
    constraints, that many at a time.
    ``inline_max_source_bytes`` is, in ``auto`` mode, the largest constraint source compiled
    in process; larger ones (and EBNF grammars, which may reach xgrammar) go to a worker process.
    Worker processes start on first need (seconds: they load the tokenizer), or with the service
    when ``prestart_workers`` is set or ``isolation`` is ``process``; a worker's start-up never
    counts against a compile's deadline. Disk writes happen behind the compile, once no miss
    has been answered for ``write_quiet_s`` (so they do not slow the next compile or the first
    mask), and at the latest ``write_max_delay_s`` after the compile; ``flush()`` writes at once.
    ``redis_url`` (``redis://host:port/db``) adds a tier shared by every replica that names the
    same Redis (see ``redis_store``): each of its commands gives up after ``redis_timeout_s``, a
    failure leaves Redis alone for ``redis_retry_s``, and a replica compiling an entry holds its
    lock for ``redis_lock_ttl_s`` past its last renewal (so a dead compiler blocks nobody longer).
    With ``redis_prefetch`` (the default), entries the other replicas compile are loaded into
    memory in the background as they announce them (``prefetch``); without it, on first request.
    ``key_file`` names the file holding the key that disk and Redis entries are sealed under
    (``sealing``); the Redis tier needs one (replicas must share it). Without one, the disk
    store uses the key generated in ``root`` (``sealing.folder_key``).
    """

    root: Path = field(default_factory=constraints_root)
    max_disk_bytes: int = 512 * 1024 * 1024
    max_memory_entries: int = 4096
    max_memory_bytes: int = 256 * 1024 * 1024
    failure_ttl_s: float = 300.0
    compile_deadline_s: float = 10.0
    isolation: str = "auto"
    process_workers: int = 1
    prestart_workers: bool = False
    worker_start_timeout_s: float = 120.0
    inline_max_source_bytes: int = 64 * 1024
    disk_rescan_interval_s: float = 60.0
    write_quiet_s: float = 0.05
    write_max_delay_s: float = 2.0
    redis_url: str | None = None
    redis_timeout_s: float = 0.25
    redis_retry_s: float = 5.0
    redis_lock_ttl_s: float = 5.0
    redis_prefetch: bool = True
    key_file: Path | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root).expanduser())
        if self.key_file is not None:
            object.__setattr__(self, "key_file", Path(self.key_file).expanduser())
        if self.redis_url is not None and self.key_file is None:
            raise ValueError(
                "the shared Redis tier needs a key file that every replica reads (key_file): "
                "entries in Redis are sealed under it, so that whoever can write to Redis "
                "cannot make replicas serve a grammar they did not compile"
            )
        if self.max_disk_bytes < 0:
            raise ValueError("max_disk_bytes must be >= 0 (0 disables the disk store)")
        if self.max_memory_entries < 0:
            raise ValueError("max_memory_entries must be >= 0 (0 disables the memory LRU)")
        if self.max_memory_bytes < 0:
            raise ValueError("max_memory_bytes must be >= 0")
        if self.failure_ttl_s < 0:
            raise ValueError("failure_ttl_s must be >= 0 (0 disables failure caching)")
        if not self.compile_deadline_s > 0:
            raise ValueError("compile_deadline_s must be > 0")
        if self.isolation not in ISOLATION_MODES:
            raise ValueError(f"isolation must be one of {ISOLATION_MODES}, not {self.isolation!r}")
        if self.write_quiet_s < 0 or self.write_max_delay_s < 0:
            raise ValueError("write_quiet_s and write_max_delay_s must be >= 0")
        if self.process_workers < 1:
            raise ValueError("process_workers must be >= 1")
        if not min(self.redis_timeout_s, self.redis_retry_s, self.redis_lock_ttl_s) > 0:
            raise ValueError("redis_timeout_s, redis_retry_s and redis_lock_ttl_s must be > 0")
