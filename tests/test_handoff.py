"""A handoff (schedulers.handoff) crosses a process as a constructor call, its big tensors through shared memory."""

from __future__ import annotations

import pickle
import uuid
from collections.abc import Iterator

import attrs
import pytest
import torch

from omnitrio.transport.relay import ShmPool, ShmReader
from schedulers.front.handoffs import ThinkerInput
from schedulers.handoff import handoff
from schedulers.qwen3_omni.handoffs import Codes, Knobs, TalkerPrompt, TalkerToken


@pytest.fixture
def relay() -> Iterator[tuple[ShmPool, ShmReader]]:
    with ShmPool(f"omnitrio-test-handoff-{uuid.uuid4().hex[:8]}-") as pool, ShmReader() as reader:
        yield pool, reader


def test_a_handoff_pickles_as_a_call_with_its_fields_in_order() -> None:
    token = TalkerToken(7, torch.ones(1, 4))
    reduced = token.__reduce__()
    assert isinstance(reduced, tuple)
    rebuild, args = reduced
    assert rebuild is TalkerToken and args[0] == 7 and args[1] is token.embed
    again = pickle.loads(pickle.dumps(token))
    assert again.token_id == 7 and torch.equal(again.embed, token.embed)
    assert pickle.loads(pickle.dumps(Codes(torch.zeros(2, 3, dtype=torch.long)))).codes.shape == (2, 3)


def test_big_tensors_in_a_handoff_cross_through_shared_memory(relay: tuple[ShmPool, ShmReader]) -> None:
    pool, reader = relay
    prompt = TalkerPrompt(torch.arange(100), torch.randn(100, 256), torch.randn(100, 256), speaker="ethan")
    packed = pool.pack((prompt, {"modality": "thinker"}))
    assert packed.shm_bytes == 2 * prompt.embeds.nbytes  # the two float blocks; the ids ride inline
    (got, metadata), leases = reader.unpack(packed.header)
    assert metadata == {"modality": "thinker"} and leases == packed.leases
    assert isinstance(got, TalkerPrompt) and got.speaker == "ethan"
    assert torch.equal(got.embeds, prompt.embeds) and torch.equal(got.hidden, prompt.hidden)
    assert torch.equal(got.token_ids, prompt.token_ids)
    pool.release(leases)


def test_nested_handoffs_and_defaults_survive_the_relay(relay: tuple[ShmPool, ShmReader]) -> None:
    pool, reader = relay
    given = ThinkerInput(torch.tensor([1, 2, 3]), Knobs(max_new_tokens=4, speaker="aiden", want_audio=True))
    got, leases = reader.unpack(pool.pack(given).header)
    assert got.knobs == given.knobs and got.audio_embeds is None and torch.equal(got.input_ids, given.input_ids)
    assert leases == ()


def test_a_field_that_is_not_a_positional_argument_is_refused() -> None:
    with pytest.raises(TypeError, match="'later' is not a plain positional argument"):

        @handoff
        @attrs.frozen
        class Odd:
            first: int
            later: int = attrs.field(kw_only=True)
