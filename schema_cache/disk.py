"""DiskStore: content-addressed files of compiled constraints, atomic and size-bounded.

Layout: ``<root>/v<STORE_VERSION>/<tokenizer fingerprint[:16]>/<key[:2]>/<key>.cc``, where the key
is ``entries.entry_key``: a sha256 over (spec digest, tokenizer fingerprint, entry format version).
This module imports no grammar backend, so that ``corral cache stats|clear`` start quickly. The backend and its
version live in the entry header and are checked when the entry is loaded, so an entry written
by another backend version is a miss, not an error.

Invariants that hold with several processes sharing one root:

* Readers never see a partial file: writers write a temp file in the same folder and
  ``os.replace`` it into place. Two writers of one key both succeed; the last one wins.
* A missing file is just a miss (another process may have evicted it a moment ago).
* The hot read path is one ``open`` + ``read`` and one ``utime`` (the LRU clock); no directory
  scans, no fsync. Sizes are tracked in memory and re-counted by a directory scan only when a
  write pushes the estimate past the budget, or the last count is older than the rescan interval.
* Eviction deletes least-recently-used files (oldest mtime) until the total is at most 90 % of
  ``max_bytes``; an entry larger than ``max_bytes`` is never written.

Nothing here unpickles anything: entries are bytes that ``CompiledConstraint.from_bytes`` checks.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from corral.schema_cache.stats import CacheStats

#: Bumped when the folder layout changes; old layouts are then only evicted, never read.
STORE_VERSION = 1
SUFFIX = ".cc"
_TMP_SUFFIX = ".tmp"
_STALE_TMP_S = 3600.0  # a temp file this old belongs to a writer that died
_LOW_WATER = 0.9


@dataclass
class DiskUsage:
    """What a directory scan found: every entry file and the total per tokenizer folder."""

    entries: int = 0
    bytes: int = 0
    per_tokenizer: dict[str, dict[str, int]] = field(default_factory=dict)


class DiskStore:
    """Compiled-constraint files under ``root``, bounded by ``max_bytes`` in all."""

    def __init__(
        self, root: Path, max_bytes: int, stats: CacheStats, rescan_interval_s: float = 60.0
    ) -> None:
        self.root = Path(root)
        self._base = str(self.root / f"v{STORE_VERSION}")
        self.max_bytes = max_bytes
        self._stats = stats
        self._rescan_interval_s = rescan_interval_s
        self._lock = threading.Lock()
        self._estimate: int | None = None  # bytes under root, as of the last scan plus our writes
        self._scanned_at = 0.0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def path_for(self, key: str, tokenizer_fingerprint: str) -> str:
        """The entry's file (a plain string: this is on every miss's path, so no ``Path`` work)."""
        return f"{self._base}/{tokenizer_fingerprint[:16]}/{key[:2]}/{key}{SUFFIX}"

    def read(self, path: str | Path) -> bytes | None:
        """The entry's bytes, or None when there is none; a hit refreshes its LRU time."""
        try:
            fd = os.open(path, os.O_RDONLY)  # no buffered file object: misses are the hot path
        except OSError:
            return None  # absent, or unreadable (permissions, I/O error): a miss, recompiled
        try:
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
        except OSError:
            return None
        finally:
            os.close(fd)
        data = b"".join(chunks)
        try:
            os.utime(path)
        except OSError:
            pass  # evicted meanwhile, or a read-only cache: the hit still counts
        return data

    def discard(self, path: str | Path) -> None:
        """Remove an entry found corrupt so that the recompiled one replaces it."""
        try:
            os.unlink(path)
        except OSError:
            pass

    # -- writes and eviction -------------------------------------------------------------------

    def write(self, path: str | Path, data: bytes) -> bool:
        """Store atomically; False when the entry exceeds the whole budget or the write failed."""
        path = Path(path)
        if not self.enabled or len(data) > self.max_bytes:
            self._stats.inc("disk_write_skipped")
            return False
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}{_TMP_SUFFIX}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "xb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError:
            self._stats.inc("disk_write_errors")
            _unlink_quietly(tmp)
            return False
        self._stats.inc("disk_writes")
        self._account(len(data))
        return True

    def _account(self, added: int) -> None:
        with self._lock:
            stale = time.monotonic() - self._scanned_at > self._rescan_interval_s
            if self._estimate is None or stale:
                self._rescan_locked()
            else:
                self._estimate += added
            if self._estimate > self.max_bytes:
                self._rescan_locked()  # count what other processes wrote before deleting
                if self._estimate > self.max_bytes:
                    self._evict_locked()

    def _rescan_locked(self) -> None:
        self._estimate = sum(size for _, size, _ in self._scan_files())
        self._scanned_at = time.monotonic()

    def _evict_locked(self) -> None:
        files = sorted(self._scan_files())  # oldest mtime first
        total = sum(size for _, size, _ in files)
        target = int(self.max_bytes * _LOW_WATER)
        for _mtime, size, path in files:
            if total <= target:
                break
            if _unlink_quietly(path):
                self._stats.inc("evictions_disk")
            total -= size  # gone either way: we deleted it, or another process did
        self._estimate = total
        self._scanned_at = time.monotonic()

    def _scan_files(self) -> list[tuple[float, int, str]]:
        """(mtime, size, path) of every entry under root; removes temp files of dead writers."""
        out: list[tuple[float, int, str]] = []
        now = time.time()
        for path in _walk(self.root):
            try:
                st = os.stat(path)
            except OSError:
                continue
            if path.endswith(_TMP_SUFFIX):
                if now - st.st_mtime > _STALE_TMP_S:
                    _unlink_quietly(path)
                continue
            if path.endswith(SUFFIX):
                out.append((st.st_mtime, st.st_size, path))
        return out

    # -- whole-cache operations (CLI) ----------------------------------------------------------

    def usage(self) -> DiskUsage:
        """Entries and bytes in all, and per tokenizer folder (``v<N>/<fingerprint[:16]>``)."""
        usage = DiskUsage()
        for _mtime, size, path in self._scan_files():
            tok = os.path.relpath(path, self.root).split(os.sep)[:2]
            slot = usage.per_tokenizer.setdefault("/".join(tok), {"entries": 0, "bytes": 0})
            slot["entries"] += 1
            slot["bytes"] += size
            usage.entries += 1
            usage.bytes += size
        return usage

    def bytes_estimate(self) -> int:
        with self._lock:
            if self._estimate is None:
                self._rescan_locked()
            return self._estimate or 0

    def clear(self) -> int:
        """Delete every entry folder (``v*``) under root; returns how many entries were removed.

        Only folders this store creates are removed, so a mistyped root cannot wipe other files.
        """
        removed = len(self._scan_files())
        with self._lock:
            if self.root.is_dir():
                for child in self.root.iterdir():
                    if child.is_dir() and child.name.startswith("v") and child.name[1:].isdigit():
                        shutil.rmtree(child, ignore_errors=True)
            self._estimate = 0
            self._scanned_at = time.monotonic()
        return removed


def _walk(root: Path) -> list[str]:
    """Every file three folders below ``root/v*`` (the entry layout), without following links."""
    found: list[str] = []
    stack = [str(root)]
    depth = {str(root): 0}
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for e in entries:
            d = depth[folder] + 1
            if e.is_dir(follow_symlinks=False) and d <= 3:
                if d == 1 and not (e.name.startswith("v") and e.name[1:].isdigit()):
                    continue
                depth[e.path] = d
                stack.append(e.path)
            elif d == 4 and e.is_file(follow_symlinks=False):
                found.append(e.path)
    return found


def _unlink_quietly(path: Path | str) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:
        return False
