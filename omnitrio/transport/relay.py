"""Pack any payload for another process on this host: tensors through shared memory, the rest pickled.

:meth:`ShmPool.pack` pickles an object (protocol 5) with a pickler that replaces every
``torch.Tensor`` and ``numpy.ndarray`` larger than ``inline_limit`` bytes — wherever it
sits: dicts, lists, attrs payloads, dataclasses, any picklable object — by a small ref
to bytes it copied (once) into the sender's shared-memory pool.  The resulting
:class:`Packed` header is small; the caller sends it over its own socket.
:meth:`ShmReader.unpack` in the receiving process rebuilds the object with **zero-copy
views** into the pool and says which leases the object holds.

Ownership, which the runtime must follow:

* The receiver may use (and write into) the views until it returns their lease ids; the
  sender then calls :meth:`ShmPool.release` and the bytes are reused by a later pack.
  A view read after its lease was released shows whatever was packed there next.  A
  receiver that wants to keep data longer copies it (into its own pooled buffer).
* If the receiving process dies, :meth:`ShmPool.release_all_for` frees every lease packed
  for it (``pack(..., peer=...)``).  Releasing twice, or an unknown id, is a no-op.
* :meth:`ShmPool.close` (or :func:`remove_segments`, which the parent runs for every
  process of a pipeline) unlinks everything.

What crosses how:

* exact CPU ``torch.Tensor`` (strided, not quantized) and exact ``numpy.ndarray`` (no
  object dtype): bigger than ``inline_limit`` → shared memory; otherwise raw bytes inline
  in the header (tiny ones as a list of their values: :mod:`omnitrio.transport.tensors`
  says how each form is rebuilt).
  Non-contiguous sources are made contiguous on copy-in, so the receiver always gets a
  C-contiguous tensor of the same dtype, shape and ``requires_grad``.  Aliasing between
  tensors is not kept (each crosses as its own copy); the same tensor object twice in one
  payload crosses once and arrives as one object.
* an exact CUDA tensor (strided, not quantized) is copied from the device straight into
  shared memory (or inline, if small) and the receiver copies it onto the same device
  index: it arrives as a CUDA tensor the receiver owns, not a view.  A receiver without
  that device gets a :class:`RelayError` that says so.
* everything else (tensor subclasses such as ``nn.Parameter``, sparse tensors, numpy
  scalars…) pickles itself; the plain CPU tensors its pickling produces (a Parameter's
  data, a sparse tensor's indices and values) still go through shared memory.

For a peer on another host there is no shared memory: ``pack(..., out_of_band=True)``
keeps every tensor and array bigger than ``inline_limit`` out of the header as a
pickle protocol 5 out-of-band buffer — a view of the object's own bytes, no copy — which
the caller sends as a frame of its own (:attr:`Packed.buffers`); the receiver passes the
frames it got to ``unpack(header, buffers)`` and the tensors are rebuilt on them, again
without a copy.  Such a buffer is read while the transport sends it: like an object
handed to a stage in the same process, it must not be changed after it was output.

torch is never imported here unless a tensor is met: the packer looks for it in
``sys.modules`` and the receiver imports it only to rebuild a tensor.
"""

from __future__ import annotations

import copyreg
import io
import pickle
import struct
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from omnitrio.contract import OmniRequest, StagePayload, StreamItem
from omnitrio.errors import RelayError
from omnitrio.transport.shm import ALIGN, Region, Segment, SlotArena, remove_segments
from omnitrio.transport.tensors import LIST_LIMIT, TensorKinds, cuda_device, inline_tensor, listed_tensor

DEFAULT_SLOT_BYTES = 1 << 20  # allocation granularity; a tensor takes a run of whole slots
DEFAULT_SLOTS = 64  # a 64 MiB pool unless the caller asks for another size (a switchboard asks for 256)
DEFAULT_INLINE_LIMIT = 64 * 1024
_COUNT = struct.Struct("<I")


def _reduce_payload(p: StagePayload) -> Any:
    return StagePayload, (p.request_id, p.request, p.data)


def _reduce_request(r: OmniRequest) -> Any:
    return OmniRequest, (r.inputs, r.params, r.metadata)


def _reduce_stream_item(i: StreamItem) -> Any:
    return StreamItem, (i.chunk_id, i.data, i.from_stage, i.metadata)


# The contract's classes cross on every hop.  attrs' generic __getstate__/__setstate__ run
# Python per object; a constructor call is half the cost.  Exact types only: a subclass
# (with more fields) pickles the generic way.
_CONTRACT_REDUCERS: dict[type, Callable[[Any], Any]] = {
    StagePayload: _reduce_payload,
    OmniRequest: _reduce_request,
    StreamItem: _reduce_stream_item,
}


@attrs.define
class Packed:
    """What :meth:`ShmPool.pack` produced (a plain record: treat it as immutable).

    ``header`` is the bytes to send (the pickled object with refs, plus the lease ids it
    holds); ``leases`` are those ids, for the sender's bookkeeping; ``shm_bytes`` is how
    many tensor bytes went through shared memory; ``buffers`` are the out-of-band
    buffers, in order (with ``out_of_band=True`` only).
    """

    header: bytes
    leases: tuple[int, ...]
    shm_bytes: int
    buffers: tuple[memoryview, ...] = ()


def header_leases(header: bytes | memoryview) -> tuple[int, ...]:
    """The lease ids a header holds, without unpickling it (cheap).

    Layout: pickle body, then the lease ids (little-endian u64 each), then their count (u32).
    """
    if len(header) < _COUNT.size:
        raise RelayError(f"relay header too short ({len(header)} bytes)")
    (count,) = _COUNT.unpack_from(header, len(header) - _COUNT.size)
    start = len(header) - _COUNT.size - 8 * count
    if start < 0:
        raise RelayError(f"relay header is corrupt: it claims {count} leases in {len(header)} bytes")
    return struct.unpack_from(f"<{count}Q", header, start)


class ShmPool:
    """The sending process's shared-memory pool and packer.

    ``prefix`` starts every segment name (e.g. ``omnitrio-<pipeline>-<process>-``).
    ``slots * slot_bytes`` bytes are created and pre-faulted when the first tensor needs
    them (a process that sends none never holds the pool).  A tensor takes a run
    of whole slots (several small tensors of one pack share a run); one that does not fit
    the pool, or finds no free run, gets a one-off segment of its own — pack never blocks
    and never fails for lack of room.  Thread-safe.  Also a context manager (closes).
    """

    def __init__(self, prefix: str, *, slot_bytes: int = DEFAULT_SLOT_BYTES, slots: int = DEFAULT_SLOTS) -> None:
        self._arena = SlotArena(prefix, slot_bytes=slot_bytes, slots=slots)
        self._packers = {False: _Packer(self._arena), True: _Packer(self._arena, out_of_band=True)}
        self._idle = threading.Lock()

    def __enter__(self) -> ShmPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def prefix(self) -> str:
        return self._arena.prefix

    @property
    def outstanding(self) -> int:
        """Leases packed and not yet released."""
        return self._arena.outstanding

    @property
    def free_slots(self) -> int:
        return self._arena.free_slots

    def pack(
        self, obj: object, *, peer: str = "", inline_limit: int = DEFAULT_INLINE_LIMIT, out_of_band: bool = False
    ) -> Packed:
        """Pickle ``obj`` with its big tensors copied into shared memory; see the module doc.

        ``peer`` names the receiver, for :meth:`release_all_for`.  Tensors of at most
        ``inline_limit`` bytes ride inline in the header.  With ``out_of_band`` no shared
        memory is used: bigger ones become :attr:`Packed.buffers`.  If pickling fails,
        every lease taken so far is released before the error propagates.
        """
        if type(inline_limit) is not int or inline_limit < 0:
            raise ValueError(f"inline_limit must be a non-negative int, got {inline_limit!r}")
        if self._arena.closed:
            raise RuntimeError(f"shared-memory pool {self.prefix!r} is closed")
        if not self._idle.acquire(blocking=False):  # another thread is packing: use a pickler of our own
            return _Packer(self._arena, out_of_band=out_of_band).run(obj, peer, inline_limit)
        try:
            return self._packers[out_of_band].run(obj, peer, inline_limit)
        finally:
            self._idle.release()

    def release(self, leases: Iterable[int]) -> int:
        """Free these leases for reuse (unlinking one-off segments); returns how many were live.

        Ids are never reused, so a repeated or unknown id is ignored.
        """
        return self._arena.release(leases)

    def release_all_for(self, peer: str) -> int:
        """Free every lease packed with ``peer=peer``: call it when that receiver is gone."""
        return self._arena.release_all_for(peer)

    def prepare(self) -> None:
        """Create and pre-fault the pool now, not when the first tensor needs it."""
        self._arena.prepare()

    def close(self) -> None:
        """Unlink every segment this pool created; ``pack`` raises afterwards. Idempotent.

        Readers' existing views stay readable (the memory goes with the last mapping).
        """
        self._arena.close()


_NO_LEASES = _COUNT.pack(0)


@attrs.frozen
class _Sink:
    """The pickler's output file: it keeps the chunks, so no BytesIO copy is made."""

    write: Callable[[bytes], object]


class _Packer(pickle.Pickler):
    """Pickler that moves big tensors to the arena as it meets them (one pass, one copy).

    Reused across packs (building a pickler costs more than pickling a small dict).
    ``out_of_band``: no shared memory; big buffers are collected for frames of their own.
    """

    def __init__(self, arena: SlotArena, *, out_of_band: bool = False) -> None:
        self.chunks: list[bytes] = []
        callback = self._buffer if out_of_band else None
        super().__init__(_Sink(self.chunks.append), protocol=5, buffer_callback=callback)
        self.arena = arena
        self.peer = ""
        self.inline_limit = 0
        self.buffers: list[memoryview] | None = [] if out_of_band else None
        """Out-of-band buffers of the current pack (None: in-band packer)."""
        self.band_limit = 0
        """Buffers of at most this many bytes still go in-band."""
        self.leases: list[int] = []
        self.shm_bytes = 0
        self.region: Region | None = None
        self.cursor = 0
        self._table: dict[type, Any] = {}
        self._table_key: tuple[bool, bool, bool, int] | None = None
        self._tensor: TensorKinds | None = None

    def run(self, obj: object, peer: str, inline_limit: int) -> Packed:
        if self.buffers is None:
            return self._run_reducing(obj, peer, inline_limit)
        self.band_limit = inline_limit
        try:
            packed = self._run_reducing(obj, peer, sys.maxsize)
            return attrs.evolve(packed, buffers=tuple(self.buffers))
        finally:
            self.buffers.clear()

    def _run_reducing(self, obj: object, peer: str, inline_limit: int) -> Packed:
        try:
            return self._run(obj, peer, inline_limit, _CONTRACT_REDUCERS)
        except RecursionError:
            # A contract object inside its own arguments (payload.data = payload): a constructor
            # call cannot build that; the generic reduction (object first, then its state) can.
            if self.buffers:
                self.buffers.clear()
            return self._run(obj, peer, inline_limit, {})

    def _buffer(self, buffer: pickle.PickleBuffer) -> bool:
        """In-band (True) unless the buffer is big."""
        assert self.buffers is not None
        raw = buffer.raw()
        if raw.nbytes <= self.band_limit:
            return True
        self.buffers.append(raw)
        return False

    def _dispatch_table(self, reducers: dict[type, Any]) -> dict[type, Any]:
        """Exact-type reducers: a C dict lookup per object, not a Python call per object (as
        reducer_override would be).  A module never imported cannot have instances in the
        object, so torch and numpy join the table once imported; it is rebuilt only then."""
        torch, numpy = sys.modules.get("torch"), sys.modules.get("numpy")
        key = (reducers is _CONTRACT_REDUCERS, torch is not None, numpy is not None, len(copyreg.dispatch_table))
        if key != self._table_key:
            table = {**copyreg.dispatch_table, **reducers}
            if torch is not None:
                table[torch.Tensor] = self._reduce_tensor
                self._tensor = TensorKinds(torch)
            if numpy is not None:
                table[numpy.ndarray] = self._reduce_ndarray
            self._table, self._table_key = table, key
        return self._table

    def _run(self, obj: object, peer: str, inline_limit: int, reducers: dict[type, Any]) -> Packed:
        self.dispatch_table = self._dispatch_table(reducers)
        self.peer = peer
        self.inline_limit = inline_limit
        leases: list[int] = []
        self.leases = leases
        self.shm_bytes = 0
        chunks = self.chunks
        try:
            self.dump(obj)
            if leases:
                chunks.append(struct.pack(f"<{len(leases)}QI", *leases, len(leases)))
                return Packed(b"".join(chunks), tuple(leases), self.shm_bytes)
            chunks.append(_NO_LEASES)
            return Packed(b"".join(chunks), (), 0)
        except BaseException:
            self.arena.release(leases)
            raise
        finally:
            self.clear_memo()  # the memo holds references to everything pickled
            self.region = None
            chunks.clear()

    def _place(self, nbytes: int) -> tuple[Region, int]:
        """Room for ``nbytes``: the rest of this pack's current lease, or a new lease."""
        region = self.region
        if region is None or self.cursor + nbytes > region.end:
            region = self.region = self.arena.allocate(nbytes, self.peer)
            self.leases.append(region.lease_id)
            self.cursor = region.start
        offset = self.cursor
        self.cursor += -(-nbytes // ALIGN) * ALIGN
        self.shm_bytes += nbytes
        return region, offset

    def _reduce_tensor(self, t: Any) -> Any:
        kinds = self._tensor
        assert kinds is not None  # set with the dispatch table that routes tensors here
        dtype = kinds.names.get(t.dtype) or kinds.name(t)
        if dtype is None or t.layout is not kinds.strided or not (t.is_cpu or t.is_cuda):
            return t.__reduce_ex__(5)
        nbytes = t.nbytes
        if nbytes <= self.inline_limit and t.is_cpu and 0 < t.numel() <= LIST_LIMIT and t.dtype in kinds.listable:
            # Tiny tensors (a step's codes, a token id) cross as their values: no torch call
            # that releases the GIL on either side (see omnitrio.transport.tensors).
            return listed_tensor, (t.tolist(), dtype, t.requires_grad)
        shape = tuple(t.shape)
        src = t.detach()
        # A CUDA tensor is copied device → shared memory directly and rebuilt on the same
        # device index by the receiver: one copy each way, no pickled bytes in between.
        cuda = t.device.index if t.is_cuda else None
        # Plain bytes in memory order: crosses as they are, no torch op needed.
        as_bytes = cuda is None and src.is_contiguous() and not (src.is_conj() or src.is_neg())
        if nbytes <= self.inline_limit:
            # Small tensors (stream chunks, token ids) are the common case: keep it to a few calls.
            if as_bytes and t.dtype in kinds.numpy_ok:
                data = src.numpy()
            else:
                data = src.resolve_conj().resolve_neg().contiguous().reshape(-1).view(kinds.uint8).cpu().numpy()
            return inline_tensor, (pickle.PickleBuffer(data), dtype, shape, t.requires_grad, cuda)
        region, offset = self._place(nbytes)
        dst = region.segment.torch_bytes()[offset : offset + nbytes]
        if as_bytes:
            # A plain byte copy: numpy's runs at memcpy speed; torch's copy_ on one thread
            # (stage processes run torch on one) is a third slower for big tensors.
            import numpy

            numpy.copyto(dst.numpy(), src.reshape(-1).view(kinds.uint8).numpy())
        else:
            dst.view(t.dtype).view(shape).copy_(src)
        return _ref("t" if cuda is None else f"cuda:{cuda}", region, offset, dtype, shape, t.requires_grad)

    def _reduce_ndarray(self, a: Any) -> Any:
        if a.nbytes <= self.inline_limit or a.dtype.hasobject:
            return a.__reduce_ex__(5)
        import numpy

        region, offset = self._place(a.nbytes)
        dst = numpy.ndarray(a.shape, dtype=a.dtype, buffer=region.segment.mm, offset=offset)
        numpy.copyto(dst, a, casting="no")
        del dst  # release the buffer export at once
        return _ref("n", region, offset, a.dtype, a.shape, False)


def _ref(kind: str, region: Region, offset: int, dtype: Any, shape: tuple[int, ...], grad: bool) -> Any:
    """The reduce tuple that stands for a tensor in shared memory (the header stays small)."""
    return _shm_ref, (kind, region.segment.name, region.oneoff, offset, dtype, shape, grad, region.lease_id)


def _shm_ref(*ref: Any) -> Any:
    """Placeholder the packer pickles for a tensor in shared memory; only ShmReader resolves it."""
    raise RelayError("this header holds shared-memory tensors: unpack it with ShmReader.unpack, not pickle.loads")


class ShmReader:
    """The receiving side: attaches senders' segments by name and makes zero-copy views.

    Pool segments are mapped once and cached (pre-faulted at first attach); one-off
    segments are mapped per unpack and unmapped when their views are gone.  Not
    thread-safe: use one reader per thread.  Also a context manager (closes).
    """

    def __init__(self) -> None:
        self._segments: dict[str, Segment] = {}

    def __enter__(self) -> ShmReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def unpack(self, header: bytes | memoryview, buffers: Sequence[Any] = ()) -> tuple[Any, tuple[int, ...]]:
        """Rebuild the packed object; return it and the lease ids to send back when done.

        Tensors that crossed through shared memory are views into the sender's segment,
        valid until those leases are released; ``buffers`` are the out-of-band buffers
        the header was packed with (the tensors are rebuilt on them).  Raises :class:`RelayError` (carrying the
        leases) when a segment is gone or the header is corrupt.
        """
        leases = header_leases(header)
        body = memoryview(header)[: len(header) - _COUNT.size - 8 * len(leases)]
        try:
            if not leases:
                return pickle.loads(body, buffers=buffers), ()
            return _Unpacker(io.BytesIO(body), self, buffers).load(), leases
        except RelayError as error:
            error.leases = leases
            raise
        except FileNotFoundError as error:
            raise RelayError(
                f"shared-memory segment {error.filename!r} is gone (released early, or its sender exited)", leases
            ) from error
        except Exception as error:
            raise RelayError(f"cannot unpack relay header: {type(error).__name__}: {error}", leases) from error

    def close(self) -> None:
        """Drop every cached mapping; views already handed out stay valid until they are freed."""
        self._segments.clear()

    def _view(self, kind: str, name: str, oneoff: bool, offset: int, dtype: Any, shape: Any, grad: bool, _: int) -> Any:
        # A one-off segment is mapped lazily (a CPU reader may touch only part of it), except
        # for a device copy, which reads every page: populating the mapping is faster.
        segment = Segment.attach(name, prefault=kind.startswith("cuda:")) if oneoff else self._cached(name)
        if kind == "n":
            import numpy

            return numpy.ndarray(shape, dtype=dtype, buffer=segment.mm, offset=offset)
        if kind != "t" and not kind.startswith("cuda:"):
            raise RelayError(f"unknown tensor kind {kind!r} in relay header")
        import torch

        torch_dtype = getattr(torch, dtype)
        numel = 1
        for dim in shape:
            numel *= dim
        t = torch.frombuffer(segment.mm, dtype=torch_dtype, count=numel, offset=offset).view(shape)
        if kind != "t":
            # Host → device copy; the view's bytes may be reused once the lease is released.
            t = t.to(cuda_device(torch, kind))
        return t.requires_grad_(True) if grad else t

    def _cached(self, name: str) -> Segment:
        # A sender's pool is mapped once and kept; mapped lazily, its pages are faulted in as messages
        # first touch them, not all at once by the first message from that sender.
        segment = self._segments.get(name)
        if segment is None:
            segment = self._segments[name] = Segment.attach(name, prefault=False)
        return segment


class _Unpacker(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, reader: ShmReader, buffers: Sequence[Any]) -> None:
        super().__init__(file, buffers=buffers)
        self.reader = reader

    def find_class(self, module: str, name: str) -> Any:
        if module == __name__ and name == "_shm_ref":
            return self.reader._view
        return super().find_class(module, name)


__all__ = [
    "DEFAULT_INLINE_LIMIT",
    "DEFAULT_SLOTS",
    "DEFAULT_SLOT_BYTES",
    "Packed",
    "RelayError",
    "ShmPool",
    "ShmReader",
    "header_leases",
    "remove_segments",
]
