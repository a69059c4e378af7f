"""Sealed entries: what the disk and Redis tiers store carries an HMAC under the operator's key.

Anyone who can write to the cache folder or to Redis could otherwise put a permissive grammar
under a strict schema's address, or flip a header field (``unenforced``, ``distinct_keys``),
and every replica would serve it. So the bytes those tiers hold are a *sealed frame* around
the entry (``CompiledConstraint.to_bytes``, which stays key-agnostic)::

    b"CORRALSE" | version (1 byte) | key id (8) | entry length (<Q) | HMAC-SHA256 (32) | entry

The MAC covers the frame's fields, the entry's address (its ``entry_key``, with a prefix
naming what it is: an entry or the constraint published beside it) and every byte of the
entry, header and body: an entry moved to another address, cut short, or changed anywhere
fails it. The key id (a hash of the key, which says nothing about it) tells an entry sealed
under another key from a tampered one. It is checked with ``hmac.compare_digest``.

A frame that fails is *rejected*: a miss, recompiled and sealed again, never served; counted
by tier and reason (``REASONS``) and logged once per tier and reason (:class:`Sealer`).

The key: a file the operator names (``CacheConfig.key_file``; ``corral serve
--cache-key-file``), required for the Redis tier, which replicas share. Without one, a process
uses the key in its cache folder (``KEY_FILE_NAME``), generated on first use with mode 0600
and created atomically, so processes sharing the folder share it; an entry sealed under any
other key is a miss there. Memory entries are in-process objects and carry no MAC.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
import struct
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

KEY_FILE_NAME = "seal.key"  # the generated key, in the cache folder (``CacheConfig.root``)
MIN_KEY_BYTES = 32
_MAGIC = b"CORRALSE"
_VERSION = 1
_FRAME = struct.Struct("<8sB8sQ32s")  # magic, version, key id, entry length, MAC
_GENERATED_BYTES = 32  # written as 64 hex digits
_TOO_OPEN = stat.S_IRWXO | stat.S_IWGRP  # others may not read or write it; the group not write

#: Why a stored frame was rejected (the ``reason`` label of the metric).
REASONS = {
    "unsealed": "it carries no MAC (written by an older Corral, or by hand)",
    "truncated": "it is shorter than its frame says",
    "malformed": "its frame is not one this Corral writes",
    "wrong_key": "it was sealed under another key",
    "bad_mac": "its MAC does not match its bytes: changed after it was sealed",
    "invalid": "it is sealed, but its header does not fit its address or does not load here",
}
TIERS = ("disk", "redis")  # where a rejected frame was found (the ``tier`` label)


class KeyFileError(ValueError):
    """A key file that is missing, unreadable, too short or readable by others."""


@dataclass(frozen=True, eq=False)
class SealKey:
    """The secret entries are sealed under, and where it came from (for messages)."""

    secret: bytes = field(repr=False)
    origin: str

    @property
    def key_id(self) -> bytes:
        """8 bytes that name the key in each frame without revealing it."""
        return hashlib.sha256(b"corral cache key id\0" + self.secret).digest()[:8]


class Rejected(Exception):
    """A frame that may not be served; ``reason`` is one of ``REASONS``."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"{reason}: {REASONS[reason]}")
        self.reason = reason


def seal(key: SealKey, address: str, entry: bytes) -> bytes:
    """``entry`` in a frame whose MAC binds it to ``address`` under ``key``."""
    mac = _mac(key, address, key.key_id, entry)
    return _FRAME.pack(_MAGIC, _VERSION, key.key_id, len(entry), mac) + entry


def unseal(key: SealKey, address: str, data: bytes) -> bytes:
    """The entry inside a frame :func:`seal` made for ``address`` under ``key``; raises
    :class:`Rejected` for anything else."""
    if not data.startswith(_MAGIC):
        raise Rejected("unsealed")
    if len(data) < _FRAME.size:
        raise Rejected("truncated")
    _, version, key_id, length, mac = _FRAME.unpack_from(data)
    entry = data[_FRAME.size :]
    if version != _VERSION:
        raise Rejected("malformed")
    if not hmac.compare_digest(key_id, key.key_id):
        raise Rejected("wrong_key")
    if len(entry) < length:
        raise Rejected("truncated")
    if len(entry) > length:
        raise Rejected("malformed")
    if not hmac.compare_digest(mac, _mac(key, address, key_id, entry)):
        raise Rejected("bad_mac")
    return entry


def _mac(key: SealKey, address: str, key_id: bytes, entry: bytes) -> bytes:
    """HMAC-SHA256 over the frame's fields (the MAC's own left as zeros), the address and the
    entry; the entry's length is in the frame, so the address cannot borrow its bytes."""
    h = hmac.new(key.secret, digestmod=hashlib.sha256)
    h.update(_FRAME.pack(_MAGIC, _VERSION, key_id, len(entry), b"\0" * 32))
    h.update(address.encode() + b"\0")
    h.update(entry)
    return h.digest()


# -- keys -------------------------------------------------------------------------------------


def read_key_file(path: str | Path) -> SealKey:
    """The key in ``path`` (its bytes, surrounding whitespace stripped, at least 32); raises
    :class:`KeyFileError` saying what is wrong and what to do."""
    path = Path(path).expanduser()
    make = f"create one with: (umask 077; openssl rand -hex 32 > {path})"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise KeyFileError(f"cache key file {path} does not exist; {make}") from None
    except OSError as e:
        raise KeyFileError(f"cache key file {path} cannot be read: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise KeyFileError(f"cache key file {path} is not a regular file")
    if st.st_mode & _TOO_OPEN:
        raise KeyFileError(
            f"cache key file {path} has mode {stat.S_IMODE(st.st_mode):04o}: other users could "
            f"read or replace the key and forge cache entries; run chmod 600 {path}"
        )
    try:
        secret = path.read_bytes().strip()
    except OSError as e:
        raise KeyFileError(f"cache key file {path} cannot be read: {e.strerror}") from None
    if len(secret) < MIN_KEY_BYTES:
        raise KeyFileError(
            f"cache key file {path} holds {len(secret)} bytes; a key needs at least "
            f"{MIN_KEY_BYTES}: {make}"
        )
    return SealKey(secret, f"key file {path}")


def folder_key(root: str | Path) -> SealKey:
    """The key in ``root / KEY_FILE_NAME``, generated there first when there is none (mode
    0600; written to a temporary file and linked into place, so processes racing to create it
    all end up with the one that won). Raises :class:`KeyFileError` or OSError when it can be
    neither read nor made."""
    root = Path(root)
    path = root / KEY_FILE_NAME
    if not path.exists():
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".{KEY_FILE_NAME}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), 0o600)
                f.write(secrets.token_hex(_GENERATED_BYTES).encode() + b"\n")
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)  # atomic, and never replaces a key another process made
            except FileExistsError:
                pass
        finally:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    key = read_key_file(path)
    return SealKey(key.secret, f"generated key {path}")


# -- the service's side -----------------------------------------------------------------------


class Sealer:
    """Seals and opens one service's stored entries under its key; counts and logs rejections
    (each tier and reason logged once, then only counted)."""

    def __init__(self, key: SealKey, count: Callable[[str, str], None]) -> None:
        """``count(tier, reason)`` is called for each rejection (``CacheStats.reject``)."""
        self.key = key
        self._count = count
        self._lock = threading.Lock()
        self._logged: set[tuple[str, str]] = set()

    def _open(self, tier: str, address: str, data: bytes) -> bytes | None:
        """What ``data`` seals, or None when the frame is rejected (counted, logged)."""
        try:
            return unseal(self.key, address, data)
        except Rejected as e:
            self.reject(tier, e.reason)
            return None

    def reject(self, tier: str, reason: str) -> None:
        """Count (and the first time, log) a ``tier`` entry rejected for ``reason``."""
        self._count(tier, reason)
        with self._lock:
            first = (tier, reason) not in self._logged
            self._logged.add((tier, reason))
        if first:
            log.warning(
                "compiled-constraint cache: rejected a %s entry (%s: %s); it is recompiled and "
                "sealed again under the %s. Further %s rejections of this kind are only counted "
                "(corral_constraint_cache_rejected_entries_total)",
                tier,
                reason,
                REASONS[reason],
                self.key.origin,
                tier,
            )

    # Addresses: an entry and the constraint published beside it are sealed apart, so that
    # neither can stand in for the other.

    def seal_entry(self, key: str, entry: bytes) -> bytes:
        """The frame stored for ``key``'s compiled entry."""
        return seal(self.key, "entry:" + key, entry)

    def open_entry(self, tier: str, key: str, data: bytes) -> bytes | None:
        """``key``'s entry from a stored frame, or None (rejected: counted, logged)."""
        return self._open(tier, "entry:" + key, data)

    def seal_spec(self, key: str, spec: bytes) -> bytes:
        """The frame stored beside ``key``'s entry for the constraint it was compiled from."""
        return seal(self.key, "spec:" + key, spec)

    def open_spec(self, key: str, data: bytes | None) -> bytes | None:
        """The constraint published beside ``key``'s entry in Redis, or None (none, or
        rejected: counted, logged)."""
        return None if data is None else self._open("redis", "spec:" + key, data)
