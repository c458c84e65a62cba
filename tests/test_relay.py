"""The shared-memory relay: what crosses, how it comes out, and that nothing leaks."""

from __future__ import annotations

import dataclasses
import glob
import multiprocessing
import os
import pickle
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import attrs
import numpy as np
import pytest
import torch

from omnitrio.contract import OmniRequest, StagePayload, StreamItem
from omnitrio.transport.relay import RelayError, ShmPool, ShmReader, header_leases, remove_segments
from omnitrio.transport.tensors import LIST_LIMIT

SLOT = 64 * 1024
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def leftovers(prefix: str) -> list[str]:
    return glob.glob(f"/dev/shm/{prefix}*")


@pytest.fixture
def prefix() -> Iterator[str]:
    name = f"omnitrio-test-{uuid.uuid4().hex[:10]}-"
    yield name
    remove_segments(name)


@pytest.fixture
def pool(prefix: str) -> Iterator[ShmPool]:
    with ShmPool(prefix, slot_bytes=SLOT, slots=8) as shm_pool:
        yield shm_pool


@pytest.fixture
def reader() -> Iterator[ShmReader]:
    with ShmReader() as shm_reader:
        yield shm_reader


def round_trip(pool: ShmPool, reader: ShmReader, obj: object, **kwargs: Any) -> tuple[Any, tuple[int, ...]]:
    return reader.unpack(pool.pack(obj, **kwargs).header)


@dataclasses.dataclass
class Features:
    name: str
    values: Any


def sample(dtype: torch.dtype, shape: tuple[int, ...] = (64, 33)) -> torch.Tensor:
    base = torch.arange(int(np.prod(shape)), dtype=torch.float64).reshape(shape)
    if dtype == torch.bool:
        return base % 3 == 0
    if dtype.is_complex:
        return torch.complex(base, -base).to(dtype)
    return (base % 200).to(dtype)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool, torch.uint8, torch.complex64]
)
def test_tensor_of_each_dtype_arrives_equal_through_shared_memory(
    pool: ShmPool, reader: ShmReader, dtype: torch.dtype
) -> None:
    tensor = sample(dtype)
    out, leases = round_trip(pool, reader, tensor, inline_limit=0)
    assert leases and out.dtype == dtype and out.shape == tensor.shape
    assert torch.equal(out, tensor)


@pytest.mark.parametrize("dtype", [np.float64, np.int16, np.bool_, np.complex128, np.dtype(">f4")])
def test_numpy_array_of_each_dtype_arrives_equal_as_numpy(pool: ShmPool, reader: ShmReader, dtype: Any) -> None:
    array = (np.arange(3000) % 7).astype(dtype).reshape(30, 100)
    out, leases = round_trip(pool, reader, array, inline_limit=0)
    assert leases and type(out) is np.ndarray and out.dtype == array.dtype
    np.testing.assert_array_equal(out, array)


def test_non_contiguous_sources_arrive_contiguous_with_the_same_values(pool: ShmPool, reader: ShmReader) -> None:
    tensor = sample(torch.float32, (40, 50))
    array = np.asfortranarray(np.arange(2000.0).reshape(40, 50))
    sources: dict[str, Any] = {
        "t": tensor.t(),
        "step": tensor[:, ::3],
        "conj": sample(torch.complex64).conj(),
        "np": array[::2, 1:],
    }
    out, _ = round_trip(pool, reader, sources, inline_limit=0)
    for key in ("t", "step", "conj"):
        assert out[key].is_contiguous() and torch.equal(out[key], sources[key].resolve_conj())
    assert out["np"].flags.c_contiguous
    np.testing.assert_array_equal(out["np"], sources["np"])


def test_zero_size_tensors_and_arrays_round_trip(pool: ShmPool, reader: ShmReader) -> None:
    obj = [torch.zeros(0), torch.zeros(3, 0, dtype=torch.bfloat16), np.zeros((0, 4), np.int32)]
    out, _ = round_trip(pool, reader, obj, inline_limit=0)
    assert out[0].shape == (0,) and out[1].shape == (3, 0) and out[1].dtype == torch.bfloat16
    assert out[2].shape == (0, 4) and out[2].dtype == np.int32


@pytest.mark.parametrize("inline_limit", [0, 1 << 30], ids=["shared-memory", "inline"])
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.complex32])
def test_dtypes_without_a_numpy_twin_cross_with_their_bytes(
    pool: ShmPool, reader: ShmReader, inline_limit: int, dtype: torch.dtype
) -> None:
    bits = torch.arange(4096, dtype=torch.int32).remainder(120).to(torch.uint8)
    if dtype.itemsize == 4:
        bits = bits.repeat(4)
    tensor = bits.view(dtype).reshape(64, -1)
    packed = pool.pack({"t": tensor, "view": tensor[:10]}, inline_limit=inline_limit)
    assert len(packed.header) < 10_000 or inline_limit > 0  # never torch's whole-storage pickle
    out, _ = reader.unpack(packed.header)
    for key, sent in (("t", tensor), ("view", tensor[:10])):
        assert out[key].dtype == dtype and out[key].shape == sent.shape
        assert torch.equal(out[key].reshape(-1).view(torch.uint8), sent.reshape(-1).view(torch.uint8))


def test_small_tensors_of_every_layout_arrive_inline_with_their_values(pool: ShmPool, reader: ShmReader) -> None:
    grid = sample(torch.float32, (6, 5))
    sources: dict[str, torch.Tensor] = {
        **{str(dtype): sample(dtype, (3, 4)) for dtype in (torch.float16, torch.int8, torch.bool, torch.complex128)},
        "transposed": grid.t(),
        "conj": sample(torch.complex64, (2, 3)).conj(),
        "neg": torch._neg_view(grid),
        "zero-dim": torch.tensor(7, dtype=torch.int64),
        "grad": grid.clone().requires_grad_(),
    }
    packed = pool.pack(sources)
    assert packed.leases == ()
    out, _ = reader.unpack(packed.header)
    for key, sent in sources.items():
        assert out[key].dtype == sent.dtype and out[key].shape == sent.shape, key
        assert torch.equal(out[key].detach(), sent.detach().resolve_conj().resolve_neg()), key
    assert out["grad"].requires_grad and not out["conj"].is_conj()
    sources["transposed"][0, 0] = -1.0  # the receiver's copy is its own
    assert out["transposed"][0, 0] == 0.0


@pytest.mark.parametrize(
    ("dtype", "bits"),
    [
        (torch.float16, torch.int16),
        (torch.bfloat16, torch.int16),
        (torch.float32, torch.int32),
        (torch.float64, torch.int64),
        (torch.int64, torch.int64),
        (torch.uint8, torch.uint8),
    ],
)
@pytest.mark.parametrize("numel", [1, LIST_LIMIT, LIST_LIMIT + 1])
def test_tiny_tensors_keep_every_bit_on_both_sides_of_the_list_limit(
    pool: ShmPool, reader: ShmReader, dtype: torch.dtype, bits: torch.dtype, numel: int
) -> None:
    gen = torch.Generator().manual_seed(numel)
    info = torch.iinfo(bits)
    raw = torch.randint(info.min, info.max, (200, numel), dtype=bits, generator=gen)
    raw[0, 0] = 0 if dtype == torch.uint8 else info.min  # -0.0 for the float dtypes
    sent = raw.view(dtype)
    out, _ = round_trip(pool, reader, list(sent.unbind()))
    got = torch.stack(out)
    assert got.dtype == dtype and got.shape == sent.shape
    nan = torch.isnan(sent) if dtype.is_floating_point else torch.zeros_like(sent, dtype=torch.bool)
    assert torch.equal(got.view(bits)[~nan], raw[~nan])
    assert torch.isnan(got[nan]).all()  # a NaN stays a NaN (its payload bits may not)


def test_small_tensors_ride_inline_and_hold_no_lease(pool: ShmPool, reader: ShmReader) -> None:
    obj: dict[str, Any] = {"t": sample(torch.bfloat16, (8, 8)), "n": np.arange(10), "scalar": torch.tensor(2.5)}
    packed = pool.pack(obj)
    out, leases = reader.unpack(packed.header)
    assert packed.leases == () and leases == () and pool.outstanding == 0
    assert torch.equal(out["t"], obj["t"]) and out["scalar"].item() == 2.5
    np.testing.assert_array_equal(out["n"], obj["n"])


def test_tensors_nested_anywhere_in_a_payload_cross_and_the_rest_is_kept(pool: ShmPool, reader: ShmReader) -> None:
    hidden = sample(torch.float32, (100, 100))
    payload = StagePayload(
        "r1",
        OmniRequest(inputs="hi", params={"stream": True}),
        data={
            "layers": [{"h": hidden, "mask": np.ones((100, 100), bool)}, ("tag", 3)],
            "chunk": StreamItem(0, Features("audio", torch.ones(50_000)), "talker"),
        },
    )
    packed = pool.pack(payload, inline_limit=1024)
    out, leases = reader.unpack(packed.header)
    assert len(packed.header) < 2048 and leases == packed.leases
    assert isinstance(out, StagePayload) and out.request_id == "r1" and out.request.params == {"stream": True}
    assert torch.equal(out.data["layers"][0]["h"], hidden) and out.data["layers"][0]["mask"].all()
    assert out.data["layers"][1] == ("tag", 3)
    assert out.data["chunk"].from_stage == "talker" and torch.equal(out.data["chunk"].data.values, torch.ones(50_000))


@attrs.define(eq=False)
class TaggedPayload(StagePayload):
    tag: str = ""


def test_contract_objects_keep_every_field_and_subclasses_keep_theirs(pool: ShmPool, reader: ShmReader) -> None:
    request = OmniRequest(inputs=[1, 2], params={"stream": True}, metadata={"trace": "t1"})
    item = StreamItem(7, b"pcm", "talker", {"modality": "audio"})
    out, _ = round_trip(pool, reader, [StagePayload("r1", request, item), TaggedPayload("r2", request, None, "x")])
    plain, tagged = out
    assert (plain.request.inputs, plain.request.params, plain.request.metadata) == (
        [1, 2],
        {"stream": True},
        {"trace": "t1"},
    )
    assert (plain.data.chunk_id, plain.data.data, plain.data.from_stage, plain.data.metadata) == (
        7,
        b"pcm",
        "talker",
        {"modality": "audio"},
    )
    assert type(tagged) is TaggedPayload and tagged.tag == "x" and tagged.request is plain.request


def test_a_payload_that_contains_itself_still_crosses(pool: ShmPool, reader: ShmReader) -> None:
    payload = StagePayload("r1", OmniRequest(inputs="hi"))
    payload.data = (payload, sample(torch.float32, (300, 300)))  # a tuple is built after its items
    out, leases = round_trip(pool, reader, payload, inline_limit=1024)
    assert out.data[0] is out and torch.equal(out.data[1], payload.data[1])
    assert len(leases) == 1  # the attempt that failed gave its lease back
    assert pool.release(leases) == 1


def test_sparse_tensors_and_parameters_keep_their_type(pool: ShmPool, reader: ShmReader) -> None:
    sparse = torch.eye(300).to_sparse()
    parameter = torch.nn.Parameter(torch.ones(20_000))
    out, _ = round_trip(pool, reader, {"sparse": sparse, "param": parameter})
    assert out["sparse"].is_sparse and torch.equal(out["sparse"].to_dense(), torch.eye(300))
    assert isinstance(out["param"], torch.nn.Parameter) and torch.equal(out["param"], parameter)


def test_requires_grad_is_kept(pool: ShmPool, reader: ShmReader) -> None:
    out, _ = round_trip(pool, reader, [torch.ones(4, requires_grad=True), torch.ones(20_000, requires_grad=True)])
    assert out[0].requires_grad and out[1].requires_grad


def test_the_same_tensor_twice_crosses_once_and_arrives_as_one_object(pool: ShmPool, reader: ShmReader) -> None:
    tensor = sample(torch.float32, (100, 100))
    packed = pool.pack([tensor, tensor], inline_limit=0)
    out, _ = reader.unpack(packed.header)
    assert out[0] is out[1] and packed.shm_bytes == tensor.nbytes


def test_tensor_larger_than_the_pool_gets_a_segment_that_later_big_tensors_reuse(
    prefix: str, pool: ShmPool, reader: ShmReader
) -> None:
    big = sample(torch.float32, (1000, 1000))  # 4 MB > 8 slots of 64 KiB
    before = set(leftovers(prefix))
    out, leases = round_trip(pool, reader, big)
    (segment,) = set(leftovers(prefix)) - before
    assert torch.equal(out, big)
    pool.release(leases)
    held, _ = round_trip(pool, reader, big[:500])  # smaller: fits the released segment
    assert set(leftovers(prefix)) - before == {segment} and torch.equal(held, big[:500])
    second, _ = round_trip(pool, reader, big.neg())  # the first is still leased: a new segment
    assert len(set(leftovers(prefix)) - before) == 2
    assert torch.equal(second, big.neg()) and torch.equal(held, big[:500])
    pool.close()
    assert leftovers(prefix) == []


def test_released_big_segments_beyond_the_spare_budget_are_unlinked(
    prefix: str, pool: ShmPool, reader: ShmReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    from omnitrio.transport import shm

    monkeypatch.setattr(shm, "SPARE_BYTES", 3 << 20)
    packs = [pool.pack(torch.ones(1 << 19)) for _ in range(4)]  # 2 MB each, all leased at once
    assert len(leftovers(prefix)) == 4
    for packed in packs:
        pool.release(packed.leases)
    assert len(leftovers(prefix)) == 1  # one 2 MB spare fits the 3 MB budget
    huge = pool.pack(torch.ones(1 << 20))  # 4 MB: more than the whole budget
    pool.release(huge.leases)
    assert len(leftovers(prefix)) == 1  # unlinked at once; the spare it could never replace stays


def test_more_tensors_than_free_slots_all_arrive_intact(pool: ShmPool, reader: ShmReader) -> None:
    tensors = [torch.full((SLOT // 4,), float(i)) for i in range(12)]  # one slot each; the pool has 8
    outs = [round_trip(pool, reader, tensor, inline_limit=0)[0] for tensor in tensors]
    assert pool.free_slots == 0 and pool.outstanding == 12
    assert all(torch.equal(out, tensor) for out, tensor in zip(outs, tensors, strict=True))


def test_release_frees_the_memory_for_the_next_pack(pool: ShmPool, reader: ShmReader) -> None:
    first, leases = round_trip(pool, reader, torch.ones(1000), inline_limit=0)
    pool.release(leases)
    second, _ = round_trip(pool, reader, torch.zeros(1000), inline_limit=0)
    assert second.data_ptr() == first.data_ptr() and pool.free_slots == 7


def test_a_view_stays_correct_while_its_lease_is_held(pool: ShmPool, reader: ShmReader) -> None:
    view, _ = round_trip(pool, reader, torch.full((1000,), 7.0), inline_limit=0)
    for value in range(20):
        packed = pool.pack(torch.full((1000,), float(value)), inline_limit=0)
        pool.release(packed.leases)
    assert torch.equal(view, torch.full((1000,), 7.0))


def test_packs_from_two_threads_at_once_do_not_share_memory(pool: ShmPool, reader: ShmReader) -> None:
    results: dict[int, list[bytes]] = {0: [], 1: []}

    def pack_many(worker: int) -> None:
        for step in range(30):
            results[worker].append(pool.pack(torch.full((5000,), float(worker * 100 + step)), inline_limit=0).header)

    threads = [threading.Thread(target=pack_many, args=(worker,)) for worker in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for worker, headers in results.items():
        for step, header in enumerate(headers):
            assert torch.equal(reader.unpack(header)[0], torch.full((5000,), float(worker * 100 + step)))


def test_releasing_a_lease_twice_is_a_no_op(pool: ShmPool) -> None:
    packed = pool.pack(torch.ones(20_000))
    assert pool.release(packed.leases) == 1
    assert pool.release(packed.leases) == 0 and pool.release([10**9]) == 0
    assert pool.free_slots == 8


def test_release_all_for_a_peer_frees_only_its_leases(pool: ShmPool) -> None:
    pool.pack(torch.ones(20_000), peer="dead")
    pool.pack(torch.ones(SLOT), peer="dead")  # a one-off segment too
    kept = pool.pack(torch.ones(20_000), peer="alive")
    assert pool.release_all_for("dead") == 2
    assert pool.outstanding == 1 and pool.release(kept.leases) == 1


def test_a_pack_that_fails_releases_what_it_took(pool: ShmPool) -> None:
    with pytest.raises((pickle.PicklingError, AttributeError)):
        pool.pack([torch.ones(20_000), lambda: None])
    assert pool.outstanding == 0 and pool.free_slots == 8


def test_close_unlinks_every_segment_including_unreleased_ones(prefix: str) -> None:
    pool = ShmPool(prefix, slot_bytes=SLOT, slots=2)
    pool.pack(torch.ones(SLOT))  # a one-off, never released
    pool.pack(torch.ones(1000), inline_limit=0)
    assert len(leftovers(prefix)) == 2
    pool.close()
    assert leftovers(prefix) == []
    with pytest.raises(RuntimeError, match="closed"):
        pool.pack({})


def test_remove_segments_removes_every_leftover_of_a_prefix(prefix: str) -> None:
    pools = [ShmPool(prefix, slot_bytes=SLOT, slots=1) for _ in range(2)]
    assert leftovers(prefix) == []  # a pool's segment is created by its first lease
    for pool in pools:
        pool.pack(torch.ones(SLOT // 4), inline_limit=0)  # fits a slot: creates the segment
    pools[0].pack(torch.ones(SLOT))  # larger than the pool: a one-off segment
    assert remove_segments(prefix) == 3
    assert leftovers(prefix) == []
    for pool in pools:
        pool.close()


def test_unpacking_after_the_segment_is_gone_raises_with_the_leases(
    prefix: str, pool: ShmPool, reader: ShmReader
) -> None:
    packed = pool.pack(torch.ones(SLOT))  # one-off segment
    remove_segments(prefix)
    with pytest.raises(RelayError, match="is gone") as caught:
        reader.unpack(packed.header)
    assert caught.value.leases == packed.leases == header_leases(packed.header)


def test_bad_prefixes_are_rejected_by_name() -> None:
    for bad in ["", "a/b", "../x", "space here"]:
        with pytest.raises(ValueError, match="prefix"):
            remove_segments(bad)
    with pytest.raises(ValueError, match="prefix"):
        ShmPool("")


def test_packing_without_torch_never_imports_torch(prefix: str) -> None:
    code = f"""
import sys, numpy as np
from omnitrio.transport.relay import ShmPool, ShmReader
with ShmPool({prefix!r}, slot_bytes=65536, slots=2) as pool, ShmReader() as reader:
    out, leases = reader.unpack(pool.pack({{"a": np.arange(100000), "s": "x"}}).header)
    assert out["a"].sum() == np.arange(100000).sum() and leases
    pool.release(leases)
assert "torch" not in sys.modules, "torch was imported"
"""
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


def _child_unpack(header: bytes, conn: Any) -> None:
    with ShmReader() as reader:
        obj, leases = reader.unpack(header)
        summary = {key: (str(t.dtype), tuple(t.shape), t.double().sum().item()) for key, t in obj.data.items()}
        obj.data["f32"][0] = -1.0  # the views are shared memory: the sender's slot sees it
        conn.send((summary, leases))
    conn.close()


def summarize(tensors: dict[str, torch.Tensor]) -> dict[str, tuple[str, tuple[int, ...], float]]:
    return {key: (str(t.dtype), tuple(t.shape), t.double().sum().item()) for key, t in tensors.items()}


@pytest.mark.slow
def test_a_spawned_process_unpacks_the_values_that_were_packed(pool: ShmPool) -> None:
    tensors = {name: sample(dtype, (128, 129)) for name, dtype in [("f32", torch.float32), ("bf16", torch.bfloat16)]}
    packed = pool.pack(StagePayload("r", OmniRequest(), tensors), peer="child", inline_limit=0)
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child_unpack, args=(packed.header, send))
    child.start()
    try:
        summary, leases = receive.recv()
    finally:
        child.join(30)
    assert child.exitcode == 0
    assert summary == summarize(tensors) and leases == packed.leases
    with ShmReader() as reader:  # written by the child, read back through the same slot
        assert reader.unpack(packed.header)[0].data["f32"][0].eq(-1.0).all()
    assert pool.release_all_for("child") == len(packed.leases)


def cuda_or_skip() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")


@pytest.mark.gpu
@pytest.mark.parametrize("inline_limit", [0, 1 << 30], ids=["shared-memory", "inline"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_cuda_tensors_arrive_on_their_device_with_their_values(
    pool: ShmPool, reader: ShmReader, inline_limit: int, dtype: torch.dtype
) -> None:
    cuda_or_skip()
    source = sample(dtype, (96, 40)).cuda()
    payload = {
        "plain": source,
        "strided": source.t()[::2],
        "empty": source[:0],
        "grad": source.clone().float().requires_grad_(),
    }
    packed = pool.pack(payload, inline_limit=inline_limit)
    assert (packed.shm_bytes > 0) == (inline_limit == 0)
    out, leases = reader.unpack(packed.header)
    pool.release(leases)  # the receiver owns its device copies: the slots may be reused at once
    pool.pack({"overwrite": torch.full((96, 40), 7, dtype=dtype)}, inline_limit=0)
    for key, sent in payload.items():
        got = out[key]
        assert got.device == sent.device and got.dtype == sent.dtype and got.shape == sent.shape, key
        assert torch.equal(got.detach(), sent.detach()), key
    assert out["grad"].requires_grad and not out["plain"].requires_grad


def test_a_cuda_tensor_for_a_process_without_cuda_is_refused_by_name(reader: ShmReader) -> None:
    if torch.cuda.is_available():
        pytest.skip("this process has CUDA")
    from omnitrio.transport import relay, tensors

    class FromTheGpu:  # what a sender with a GPU packs for a small cuda:0 tensor
        def __reduce__(self) -> Any:
            return tensors.inline_tensor, (bytearray(8), "float32", (2,), False, 0)

    header = pickle.dumps(FromTheGpu(), protocol=5) + relay._NO_LEASES
    with pytest.raises(RelayError, match=r"tensor on cuda:0, but this process sees no CUDA device"):
        reader.unpack(header)
