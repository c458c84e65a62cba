"""TrioZmqSocket: order, no lost wake-ups under concurrent send+recv, cancellation and close semantics."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest
import trio
import trio.testing
import zmq

from omnitrio.transport.zmq import TrioZmqSocket, bind, connect

N = 100_000
STALL_S = 20  # hang guard: a lost wake-up shows as a receiver that gets nothing for this long


def frame(i: int) -> bytes:
    return i.to_bytes(4, "little")


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    yield context
    leaked = [s for s in context._sockets if not s.closed]  # pyzmq's own registry, the one destroy() uses
    context.destroy(linger=0)
    assert not leaked, f"test left {len(leaked)} zmq socket(s) open"


@pytest.fixture
def ipc_dir() -> Iterator[str]:
    # Short path under /tmp: ipc endpoints must fit in sun_path (about 107 bytes).
    path = tempfile.mkdtemp(prefix="ot-zmq-")
    yield path
    shutil.rmtree(path)


@pytest.fixture(params=["ipc", "tcp"])
def endpoint(request: pytest.FixtureRequest, ipc_dir: str) -> str:
    return f"ipc://{ipc_dir}/s" if request.param == "ipc" else "tcp://127.0.0.1:*"


def inproc_pair(ctx: zmq.Context[Any], name: str, hwm: int = 1000) -> tuple[TrioZmqSocket, TrioZmqSocket]:
    """(push, pull) over inproc, where a sent message is readable as soon as send returns."""
    pull, resolved = bind(ctx, zmq.PULL, f"inproc://{name}", options={zmq.RCVHWM: hwm})
    return connect(ctx, zmq.PUSH, resolved, options={zmq.SNDHWM: hwm}), pull


@pytest.mark.parametrize("n", [5_000, pytest.param(N, marks=[pytest.mark.slow, pytest.mark.timeout(600)])])
async def test_concurrent_send_and_recv_on_one_socket_keep_order_both_ways(
    ctx: zmq.Context[Any], endpoint: str, n: int
) -> None:
    # Low HWMs make senders block often while the receiver on the same socket consumes the FD's edges:
    # the lost wake-up a wrapper without the EVENTS re-check hangs on.
    options = {zmq.SNDHWM: 50, zmq.RCVHWM: 50}
    a, resolved = bind(ctx, zmq.DEALER, endpoint, options=options)
    b = connect(ctx, zmq.DEALER, resolved, options=options)
    expected = [frame(i) for i in range(n)]
    got: dict[str, list[bytes]] = {"a": [], "b": []}

    async def send_one_by_one(sock: TrioZmqSocket) -> None:
        for f in expected:
            await sock.send(f)

    async def send_in_batches(sock: TrioZmqSocket) -> None:
        for start in range(0, n, 100):
            await sock.send_batch(expected[start : start + 100])

    async def receive(sock: TrioZmqSocket, into: list[bytes]) -> None:
        while len(into) < n:
            with trio.fail_after(STALL_S):
                into.extend(await sock.recv_batch())

    async with a, b, trio.open_nursery() as nursery:
        nursery.start_soon(send_one_by_one, a)
        nursery.start_soon(receive, a, got["a"])
        nursery.start_soon(send_in_batches, b)
        nursery.start_soon(receive, b, got["b"])
    assert got["b"] == expected
    assert got["a"] == expected


async def test_push_pull_batches_keep_order(ctx: zmq.Context[Any], endpoint: str) -> None:
    pull, resolved = bind(ctx, zmq.PULL, endpoint)
    push = connect(ctx, zmq.PUSH, resolved)
    expected = [frame(i) for i in range(N)]
    got: list[bytes] = []

    async def send() -> None:
        for start in range(0, N, 1000):
            await push.send_batch(expected[start : start + 1000])

    async with push, pull, trio.open_nursery() as nursery:
        nursery.start_soon(send)
        while len(got) < N:
            with trio.fail_after(STALL_S):
                got.extend(await pull.recv_batch(max_messages=4096))
    assert got == expected


async def test_recv_batch_returns_every_available_message(ctx: zmq.Context[Any]) -> None:
    push, pull = inproc_pair(ctx, "drain")
    async with push, pull:
        await push.send_batch([frame(i) for i in range(10)])
        assert await pull.recv_batch() == [frame(i) for i in range(10)]


async def test_recv_batch_stops_at_max_messages(ctx: zmq.Context[Any]) -> None:
    push, pull = inproc_pair(ctx, "max")
    async with push, pull:
        await push.send_batch([frame(i) for i in range(10)])
        assert await pull.recv_batch(max_messages=4) == [frame(i) for i in range(4)]
        assert await pull.recv_batch() == [frame(i) for i in range(4, 10)]


async def test_multipart_messages_arrive_whole(ctx: zmq.Context[Any]) -> None:
    push, pull = inproc_pair(ctx, "multipart")
    async with push, pull:
        await push.send([b"head", b"body"])
        await push.send_batch([[b"x", b"1"], [b"y", b"2", b"3"]])
        assert await pull.recv_multipart() == [b"head", b"body"]
        assert await pull.recv_multipart_batch() == [[b"x", b"1"], [b"y", b"2", b"3"]]


async def test_cancelled_recv_leaves_socket_usable(ctx: zmq.Context[Any]) -> None:
    push, pull = inproc_pair(ctx, "cancel-recv")
    async with push, pull:
        with trio.CancelScope() as scope:
            scope.deadline = trio.current_time() + 0.05
            await pull.recv()
        assert scope.cancelled_caught
        await push.send(b"after")
        with trio.fail_after(5):
            assert await pull.recv() == b"after"


async def test_cancelling_the_waiting_fd_owner_hands_the_fd_to_the_other_waiter(ctx: zmq.Context[Any]) -> None:
    push, pull = inproc_pair(ctx, "handoff")
    received: list[bytes] = []

    async def recv_one() -> None:
        received.append(await pull.recv())

    async with push, pull:
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                owner = trio.CancelScope()

                async def recv_until_cancelled() -> None:
                    with owner:
                        await recv_one()

                nursery.start_soon(recv_until_cancelled)  # first waiter: owns wait_readable(FD)
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(recv_one)  # second waiter: parks
                await trio.testing.wait_all_tasks_blocked()
                owner.cancel()
                await trio.testing.wait_all_tasks_blocked()
                await push.send(b"only")
    assert received == [b"only"]


def inproc_dealers(ctx: zmq.Context[Any], name: str) -> tuple[TrioZmqSocket, TrioZmqSocket]:
    a, resolved = bind(ctx, zmq.DEALER, f"inproc://{name}", options={zmq.SNDHWM: 1, zmq.RCVHWM: 1})
    return a, connect(ctx, zmq.DEALER, resolved, options={zmq.SNDHWM: 1, zmq.RCVHWM: 1})


async def test_a_send_that_consumes_the_fd_signal_still_wakes_a_receiver_on_that_socket(
    ctx: zmq.Context[Any],
) -> None:
    a, b = inproc_dealers(ctx, "send-eats-signal")
    received: list[bytes] = []

    async def receive() -> None:
        received.append(await a.recv())

    async with a, b, trio.open_nursery() as nursery:
        nursery.start_soon(receive)  # owns a's FD, waiting for POLLIN
        await trio.testing.wait_all_tasks_blocked()
        b.socket.send(b"to a")  # signals a's FD
        time.sleep(0.005)  # no yield; lets a's next send process commands (libzmq does that at most once per ms)
        await a.send(b"to b")  # processes a's commands: consumes the signal the receiver waits for
        await trio.testing.wait_all_tasks_blocked()
        assert received == [b"to a"]


async def test_a_receive_that_consumes_the_fd_signal_still_wakes_a_sender_on_that_socket(
    ctx: zmq.Context[Any],
) -> None:
    a, b = inproc_dealers(ctx, "recv-eats-signal")
    sent = 0

    async def send_forever() -> None:
        nonlocal sent
        while True:
            await a.send(frame(sent))
            sent += 1

    async with a, b, trio.open_nursery() as nursery:
        b.socket.send(b"to a")
        nursery.start_soon(send_forever)  # blocks on the HWM, owning a's FD and waiting for POLLOUT
        await trio.testing.wait_all_tasks_blocked()
        blocked_at = sent
        while b.socket.poll(0):
            b.socket.recv()  # frees room: signals a's FD
        await a.recv_batch()  # drains to EAGAIN, which processes a's commands: consumes that signal
        await trio.testing.wait_all_tasks_blocked()
        assert sent > blocked_at
        nursery.cancel_scope.cancel()


async def test_cancelled_send_sent_the_whole_message_or_nothing(ctx: zmq.Context[Any]) -> None:
    push, pull = inproc_pair(ctx, "cancel-send", hwm=2)
    sent: list[list[bytes]] = []

    async def cancel_once_blocked(scope: trio.CancelScope) -> None:
        await trio.testing.wait_all_tasks_blocked()
        scope.cancel()

    async with push, pull:
        for i in range(1000):  # fill the queue until a send blocks on the HWM, then cancel that send
            message = [b"part-a", frame(i), b"part-c"]
            with trio.CancelScope() as blocked:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(cancel_once_blocked, blocked)
                    await push.send(message)
                    sent.append(message)
                    nursery.cancel_scope.cancel()
            if blocked.cancelled_caught:
                break
        assert len(sent) < 1000, "no send ever blocked on the HWM"
        assert await pull.recv_multipart_batch() == sent
        await push.send([b"still", b"usable"])
        assert await pull.recv_multipart() == [b"still", b"usable"]


async def test_try_send_never_waits_and_says_whether_zmq_took_the_message(ctx: zmq.Context[Any]) -> None:
    push, pull = inproc_pair(ctx, "try-send", hwm=2)
    async with push, pull:
        accepted = [m for m in ([b"m", frame(i)] for i in range(100)) if push.try_send(m)]
        assert 0 < len(accepted) < 100
        assert await pull.recv_multipart_batch() == accepted


async def test_close_wakes_every_pending_task_with_closed_resource_error(ctx: zmq.Context[Any]) -> None:
    push, pull = inproc_pair(ctx, "close")
    errors: list[BaseException] = []

    async def recv() -> None:
        try:
            await pull.recv()
        except trio.ClosedResourceError as e:
            errors.append(e)

    with trio.fail_after(5):
        async with push, trio.open_nursery() as nursery:
            nursery.start_soon(recv)  # owns the FD
            nursery.start_soon(recv)  # parked
            await trio.testing.wait_all_tasks_blocked()
            pull.close()
    assert len(errors) == 2


async def test_calls_after_close_raise_closed_resource_error(ctx: zmq.Context[Any]) -> None:
    push, pull = inproc_pair(ctx, "closed")
    push.close()
    pull.close()
    pull.close()  # idempotent
    with pytest.raises(trio.ClosedResourceError):
        await push.send(b"x")
    with pytest.raises(trio.ClosedResourceError):
        await pull.recv_batch()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts fds through /proc")
async def test_sockets_closed_under_cancellation_leave_no_open_fds(ipc_dir: str) -> None:
    before = len(os.listdir("/proc/self/fd"))
    context: zmq.Context[Any] = zmq.Context()
    pull, resolved = bind(context, zmq.PULL, f"ipc://{ipc_dir}/s")
    push = connect(context, zmq.PUSH, resolved, options={zmq.SNDHWM: 1})
    with trio.move_on_after(0.2):
        async with push, pull, trio.open_nursery() as nursery:
            nursery.start_soon(pull.recv_multipart)
            nursery.start_soon(push.send_batch, [frame(i) for i in range(100_000)])  # blocks on the HWM
    context.term()  # returns only because every socket is closed
    assert len(os.listdir("/proc/self/fd")) == before


async def test_closing_a_bound_ipc_socket_removes_its_file(ipc_dir: str) -> None:
    context: zmq.Context[Any] = zmq.Context()
    sock, resolved = bind(context, zmq.PULL, f"ipc://{ipc_dir}/s")
    assert resolved == f"ipc://{ipc_dir}/s"
    assert os.listdir(ipc_dir) == ["s"]
    sock.close()
    context.term()
    assert os.listdir(ipc_dir) == []


async def test_bind_resolves_a_wildcard_tcp_port(ctx: zmq.Context[Any]) -> None:
    pull, resolved = bind(ctx, zmq.PULL, "tcp://127.0.0.1:*")
    assert resolved.startswith("tcp://127.0.0.1:") and int(resolved.rsplit(":", 1)[1]) > 0
    async with pull, connect(ctx, zmq.PUSH, resolved) as push:
        await push.send(b"hello")
        with trio.fail_after(5):
            assert await pull.recv() == b"hello"


async def test_bind_failure_names_the_endpoint(ctx: zmq.Context[Any]) -> None:
    with pytest.raises(OSError, match=r"tcp://127\.0\.0\.1:notaport"):
        bind(ctx, zmq.PULL, "tcp://127.0.0.1:notaport")


async def test_bad_arguments_are_rejected_with_a_clear_error(ctx: zmq.Context[Any]) -> None:
    push, pull = inproc_pair(ctx, "bad")
    async with push, pull:
        with pytest.raises(ValueError, match="max_messages must be at least 1"):
            await pull.recv_batch(max_messages=0)
        with pytest.raises(ValueError, match="at least one frame"):
            await push.send([])
        with pytest.raises(TypeError, match="got str"):
            await push.send("text")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"needs a zmq\.Socket"):
        TrioZmqSocket("not a socket")  # type: ignore[arg-type]
