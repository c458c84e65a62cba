"""Shared-memory segments on ``/dev/shm`` and the sending process's slot arena.

A :class:`SlotArena` belongs to one sending process.  On the first lease that needs it, it
creates one pooled segment of ``slots * slot_bytes`` bytes, reserved with
``posix_fallocate`` (so a full ``/dev/shm`` is a clear ``OSError`` then, never a ``SIGBUS``
later) and pre-faulted, so no transfer after it pays for page allocation.
:meth:`SlotArena.allocate` hands out a *lease*: a run of contiguous free slots (first
fit), or — when the bytes exceed the pool or no run is free — a dedicated one-off
segment.  Creating and faulting a fresh one-off segment costs several times the copy
itself, so a released one-off segment is kept as a *spare* and reused by a later lease it can hold,
up to :data:`SPARE_BYTES` in all (oldest unlinked first).  Allocation therefore never
blocks and never fails for lack of slots; a pool that is too small only costs speed.

Lease ids are never reused, so releasing a lease twice, or releasing an id this arena
never issued, is a harmless no-op: it can never free memory another lease holds.  The
arena is thread-safe (one lock around its bookkeeping; copies happen outside it).

Every segment name starts with the caller's prefix, followed by a per-arena token (pid
and random bits), so a restarted process never reuses the name of a segment that a
reader still has mapped, and :func:`remove_segments` removes every leftover of a prefix.

We create segments with ``os.open`` + ``mmap`` rather than
``multiprocessing.shared_memory`` so that the resource tracker neither warns about nor
unlinks segments another process still reads.
"""

from __future__ import annotations

import glob
import mmap
import os
import re
import secrets
import threading
import weakref
from collections.abc import Iterable
from typing import Any

import attrs

SHM_DIR = "/dev/shm"
ALIGN = 64  # every placement starts on a cache line; enough for any dtype
_PREFIX_RE = re.compile(r"[A-Za-z0-9._-]+")
_PREFAULT_CHUNK = 1 << 20
SPARE_BYTES = 256 << 20  # released one-off segments kept for reuse, per arena


def validate_prefix(prefix: str) -> str:
    """Return ``prefix`` if it can start a segment name, else raise ``ValueError`` naming it.

    It must be non-empty and only use ``A-Z a-z 0-9 . _ -``: an empty prefix would make
    :func:`remove_segments` match every segment on the host.
    """
    if not isinstance(prefix, str) or not _PREFIX_RE.fullmatch(prefix) or len(prefix) > 200:
        raise ValueError(f"shared-memory prefix must be 1-200 characters of [A-Za-z0-9._-], got {prefix!r}")
    return prefix


def segment_path(name: str) -> str:
    return os.path.join(SHM_DIR, name)


@attrs.define(eq=False)
class Segment:
    """One mapped file under ``/dev/shm``; the mapping lives as long as something refers to it.

    Views made with ``torch.frombuffer`` / ``numpy.ndarray(buffer=...)`` keep ``mm`` alive,
    so we never ``close()`` it explicitly: dropping the last reference unmaps it.
    """

    name: str
    mm: mmap.mmap
    size: int
    _torch_bytes: Any = None

    @classmethod
    def create(cls, name: str, size: int, *, prefault: bool) -> Segment:
        """Create ``name`` exclusively, reserve ``size`` bytes, map it (optionally pre-faulted)."""
        path = segment_path(name)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | (_MAP_POPULATE if prefault else 0))
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        if prefault and not _MAP_POPULATE:
            _touch(mm, size)
        return cls(name, mm, size)

    @classmethod
    def attach(cls, name: str, *, prefault: bool) -> Segment:
        """Map an existing segment read-write; ``FileNotFoundError`` if it is gone."""
        fd = os.open(segment_path(name), os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | (_MAP_POPULATE if prefault else 0))
        finally:
            os.close(fd)
        return cls(name, mm, size)

    def torch_bytes(self) -> Any:
        """The whole segment as a 1-D ``torch.uint8`` tensor (made once; imports torch)."""
        if self._torch_bytes is None:
            import torch

            self._torch_bytes = torch.frombuffer(self.mm, dtype=torch.uint8)
        return self._torch_bytes


_MAP_POPULATE: int = getattr(mmap, "MAP_POPULATE", 0)


def _touch(mm: mmap.mmap, size: int) -> None:
    zeros = bytes(_PREFAULT_CHUNK)
    for start in range(0, size, _PREFAULT_CHUNK):
        end = min(start + _PREFAULT_CHUNK, size)
        mm[start:end] = zeros[: end - start]


def _unlink_quietly(names: Iterable[str], owner_pid: int | None = None) -> None:
    if owner_pid is not None and os.getpid() != owner_pid:
        return  # a forked child inherited the arena: the segments are its parent's
    for name in list(names):
        try:
            os.unlink(segment_path(name))
        except FileNotFoundError:
            pass


@attrs.frozen
class Region:
    """Bytes ``[start, end)`` of ``segment`` that belong to lease ``lease_id``.

    ``oneoff`` says the segment was made for this lease alone (readers should not cache it).
    """

    lease_id: int
    segment: Segment
    start: int
    end: int
    oneoff: bool


@attrs.frozen
class _Lease:
    peer: str
    first_slot: int  # -1 for a one-off segment
    slot_count: int
    oneoff: Segment | None


class SlotArena:
    """The sender's pooled segment plus its one-off segments, handed out as leases."""

    def __init__(self, prefix: str, *, slot_bytes: int, slots: int) -> None:
        validate_prefix(prefix)
        if not isinstance(slot_bytes, int) or slot_bytes <= 0 or slot_bytes % ALIGN:
            raise ValueError(f"slot_bytes must be a positive multiple of {ALIGN}, got {slot_bytes!r}")
        if not isinstance(slots, int) or slots < 0:
            raise ValueError(f"slots must be a non-negative int, got {slots!r}")
        if not os.path.isdir(SHM_DIR):
            raise OSError(f"{SHM_DIR} does not exist: the shared-memory relay needs Linux tmpfs")
        self.prefix = prefix
        self.slot_bytes = slot_bytes
        self.slots = slots
        self._stem = f"{prefix}{os.getpid():x}-{secrets.token_hex(4)}-"
        self._lock = threading.Lock()
        self._next_id = 1
        self._oneoff_seq = 0
        self._leases: dict[int, _Lease] = {}
        self._by_peer: dict[str, set[int]] = {}
        self._used = bytearray(slots)  # 0 free, 1 used; bytearray.find does first fit in C
        self._names: set[str] = set()  # every segment we created and have not unlinked
        self._finalizer = weakref.finalize(self, _unlink_quietly, self._names, os.getpid())
        self._pool: Segment | None = None
        self._spares: list[Segment] = []  # released one-off segments, oldest first
        self.closed = False

    def _ensure_pool(self) -> Segment:
        """Create and pre-fault the pooled segment on the first lease that needs it.

        A process that never sends a big tensor never pays for (or holds) the pool.
        Called with ``_lock`` held.
        """
        if self._pool is None:
            name = self._stem + "pool"
            self._names.add(name)
            self._pool = Segment.create(name, self.slots * self.slot_bytes, prefault=True)
        return self._pool

    def prepare(self) -> None:
        """Create and pre-fault the pooled segment now rather than on the first lease that needs it (a
        process that will send tensors pays for it at start-up, not on its first request)."""
        with self._lock:
            if not self.closed and self.slots:
                self._ensure_pool()

    @property
    def outstanding(self) -> int:
        """Leases handed out and not yet released."""
        return len(self._leases)

    @property
    def free_slots(self) -> int:
        return self.slots - sum(self._used)

    def allocate(self, nbytes: int, peer: str) -> Region:
        """Lease at least ``nbytes`` bytes (rounded up to whole slots, or a one-off segment)."""
        count = -(-nbytes // self.slot_bytes)
        with self._lock:
            if self.closed:
                raise RuntimeError(f"shared-memory pool {self.prefix!r} is closed")
            lease_id = self._next_id
            self._next_id += 1
            first = self._used.find(b"\x00" * count) if 0 < count <= self.slots else -1
            if first >= 0:
                pool = self._ensure_pool()
                self._used[first : first + count] = b"\x01" * count
                self._remember(lease_id, _Lease(peer, first, count, None))
                start = first * self.slot_bytes
                return Region(lease_id, pool, start, start + count * self.slot_bytes, False)
            spare = self._take_spare(nbytes)
            if spare is not None:
                self._remember(lease_id, _Lease(peer, -1, 0, spare))
                return Region(lease_id, spare, 0, spare.size, True)
            self._oneoff_seq += 1
            name = f"{self._stem}x{self._oneoff_seq}"
            self._names.add(name)
        # Creating and faulting a one-off segment takes a while: do it outside the lock.
        try:
            segment = Segment.create(name, max(nbytes, 1), prefault=True)
        except BaseException:
            with self._lock:
                self._names.discard(name)
            raise
        with self._lock:
            self._remember(lease_id, _Lease(peer, -1, 0, segment))
            if self.closed:  # closed while we were creating it
                self._forget(lease_id)
                raise RuntimeError(f"shared-memory pool {self.prefix!r} is closed")
        return Region(lease_id, segment, 0, segment.size, True)

    def release(self, lease_ids: Iterable[int]) -> int:
        """Free these leases; unknown or already-released ids are ignored. Returns how many were freed."""
        with self._lock:
            return sum(self._forget(lease_id) for lease_id in lease_ids)

    def release_all_for(self, peer: str) -> int:
        """Free every lease allocated for ``peer`` (e.g. when that process died)."""
        with self._lock:
            return sum(self._forget(lease_id) for lease_id in list(self._by_peer.get(peer, ())))

    def close(self) -> None:
        """Unlink every segment this arena created; later ``allocate`` calls raise. Idempotent."""
        with self._lock:
            self.closed = True
            self._leases.clear()
            self._by_peer.clear()
            self._pool = None
            self._spares.clear()
            self._finalizer()

    def _remember(self, lease_id: int, lease: _Lease) -> None:
        self._leases[lease_id] = lease
        self._by_peer.setdefault(lease.peer, set()).add(lease_id)

    def _forget(self, lease_id: int) -> bool:
        lease = self._leases.pop(lease_id, None)
        if lease is None:
            return False
        peer_leases = self._by_peer[lease.peer]
        peer_leases.discard(lease_id)
        if not peer_leases:
            del self._by_peer[lease.peer]
        match lease.oneoff:
            case None:
                self._used[lease.first_slot : lease.first_slot + lease.slot_count] = bytes(lease.slot_count)
            case segment:
                self._keep_spare(segment)
        return True

    def _take_spare(self, nbytes: int) -> Segment | None:
        """The smallest spare that holds ``nbytes``, taken out of the spares (lock held)."""
        best = min((s for s in self._spares if s.size >= nbytes), key=lambda s: s.size, default=None)
        if best is not None:
            self._spares.remove(best)
        return best

    def _keep_spare(self, segment: Segment) -> None:
        """Keep a released one-off segment for reuse; unlink what exceeds the budget (lock held).

        A segment bigger than the whole budget, or released after close, is unlinked at once.
        """
        if self.closed or segment.size > SPARE_BYTES:
            self._unlink(segment)
            return
        self._spares.append(segment)
        while sum(spare.size for spare in self._spares) > SPARE_BYTES:
            self._unlink(self._spares.pop(0))

    def _unlink(self, segment: Segment) -> None:
        self._names.discard(segment.name)
        _unlink_quietly([segment.name])


def remove_segments(prefix: str) -> int:
    """Unlink every segment under ``/dev/shm`` whose name starts with ``prefix``; return the count.

    For the runner after a process died or at shutdown.  Readers that still map a removed
    segment keep their views valid; the memory is freed when the last mapping goes.
    """
    validate_prefix(prefix)
    removed = 0
    for path in glob.glob(segment_path(glob.escape(prefix)) + "*"):
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        removed += 1
    return removed
