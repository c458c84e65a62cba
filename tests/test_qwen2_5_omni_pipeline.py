"""configs/qwen2.5-omni.toml through the runtime on a tiny checkpoint: many spoken requests at once, and an abort.

Eight concurrent spoken requests (text, audio and image prompts, each its own seed, both voices) each get
the answer they get alone: the same text ids (``generate``'s) and the same audio, to within 1 LSB of pcm16
(token2wav runs their windows in shared DiT forwards, and a row's float rounding moves with its
neighbours; a wrong noise, speaker or code would change whole frames), while the thinker, the talker and
token2wav each held at least two of them at once (the pipeline's own event timeline says so).

An abort in the middle of the audio (the caller leaves the stream after an audio chunk, the talker held to
a long answer), inline and with the config's processes (there once an audio chunk crossed from token2wav's
process through shared memory): token2wav was still decoding it when the abort came, then no stage and
not the coordinator holds any request, the same request id asked again at once gets ``generate``'s whole
answer, and once the pipeline is closed none of its segments is left in /dev/shm.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from omnitrio import open_pipeline
from omnitrio.config import PipelineConfig
from omnitrio.config_loading import load
from omnitrio.events import EVENT_DIR_ENV, STAGE_ABORTED
from omnitrio.trace import load as load_events
from omnitrio.transport.relay import DEFAULT_INLINE_LIMIT
from tests import qwen2_5_omni_reference as ref
from tests.pipelines import leave_after_audio, most_held_at_once, our_shm, settled, streamed_answer
from tests.qwen2_5_omni_reference import reference_model, tiny_checkpoint, tiny_processor  # noqa: F401  (fixtures)
from tests.test_qwen2_5_omni_speech import MIN_STREAMED_SNR_DB, assert_equal_audio, reference
from tests.test_qwen2_5_omni_thinker_stage import CONFIG, PROMPTS, generated
from toys.qwen3_omni_requests import pcm16

pytestmark = pytest.mark.timeout(600)

TOKENS = 24  # answer tokens: speech of several token2wav chunks
NAMES = list(PROMPTS)
VOICES = ("Chelsie", "Ethan")
GREEDY_TALKER = "talker.factory.do_sample=false"
# Codes the talker says, neither fewer nor more: token2wav's chunks grow past the relay's inline limit long
# before the speech ends.
LONG_TALK = 200


def spoken(name: str, *, seed: int = 0, voice: str = "Chelsie") -> dict[str, Any]:
    """The pipeline's raw chat inputs for prompt ``name``, spoken, greedy thinker (as the HTTP layer hands them)."""
    return {
        "task": "chat",
        "messages": [{"role": "user", "content": PROMPTS[name][0]}],
        "modalities": ["text", "audio"],
        "audio": {"voice": voice, "format": "pcm16"},
        "max_tokens": TOKENS,
        "temperature": 0.0,
        "seed": seed,
    }


def config_of(tiny: Path, *overrides: str) -> PipelineConfig:
    return load(CONFIG, [GREEDY_TALKER, *overrides], model=tiny, device=ref.DEVICE)


@pytest.fixture(scope="module")
def greedy(model: Any, processor: Any) -> dict[str, list[int]]:
    """``generate``'s greedy answer ids per prompt, :data:`TOKENS` long."""
    return {name: generated(model, processor, name, tokens=TOKENS) for name in PROMPTS}


def lsb_apart(a: np.ndarray, b: np.ndarray) -> int:
    """The largest difference of two float signals of one length, in pcm16 steps."""
    return int(np.abs(pcm16(a).astype(np.int32) - pcm16(b)).max())


def ids_of(got: dict[str, Any]) -> list[int]:
    return list(got["results"]["decode"]["token_ids"])


async def test_eight_concurrent_spoken_requests_each_answer_as_they_answer_alone(
    tiny: Path, greedy: dict[str, list[int]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(EVENT_DIR_ENV, str(tmp_path))
    names = {f"r{i}": NAMES[i % len(NAMES)] for i in range(8)}
    asked = {rid: spoken(name, seed=i, voice=VOICES[i % 2]) for i, (rid, name) in enumerate(names.items())}
    together: dict[str, dict[str, Any]] = {}
    async with open_pipeline(config_of(tiny), inline=True) as pipeline:
        alone = {rid: await streamed_answer(pipeline, f"alone-{rid}", inputs) for rid, inputs in asked.items()}

        async def one(rid: str, inputs: dict[str, Any]) -> None:
            together[rid] = await streamed_answer(pipeline, rid, inputs)

        async with trio.open_nursery() as nursery:
            for rid, inputs in asked.items():
                nursery.start_soon(one, rid, inputs)
    for rid, name in names.items():
        solo, got = alone[rid], together[rid]
        assert ids_of(got) == ids_of(solo) == greedy[name], rid
        assert len(got["pcm"]) == len(solo["pcm"]) > 0, rid
        assert lsb_apart(got["pcm"], solo["pcm"]) <= 1, rid
    first, *others = (alone[rid]["pcm"] for rid in ("r0", "r3", "r6"))  # one prompt; other seeds, voices
    assert all(len(first) != len(other) or lsb_apart(first, other) > 1 for other in others)
    events = load_events([tmp_path])
    held = {stage: most_held_at_once(events, stage) for stage in ("thinker", "talker", "token2wav")}
    assert min(held.values()) >= 2, held


@pytest.fixture(scope="module")
def long_answer(model: Any, processor: Any) -> ref.Answer:
    """``generate``'s answer to the abort test's request, its talker saying exactly :data:`LONG_TALK` codes."""
    caps = {"talker_min_new_tokens": LONG_TALK, "talker_max_new_tokens": LONG_TALK}
    return reference(model, processor, PROMPTS["audio"][1], speaker="Ethan", seed=7, max_new_tokens=TOKENS, **caps)


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "processes"])
async def test_abort_in_the_middle_of_the_audio_frees_every_stage(
    tiny: Path, long_answer: ref.Answer, inline: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(EVENT_DIR_ENV, str(tmp_path))
    caps = [f"talker.factory.min_new_tokens={LONG_TALK}", f"talker.factory.max_new_tokens={LONG_TALK}"]
    inputs = spoken("audio", seed=7, voice="Ethan")
    before = our_shm()
    async with open_pipeline(config_of(tiny, *caps), inline=inline) as pipeline:
        # with processes, leave once a chunk came through shared memory: the /dev/shm check then proves something
        made = await leave_after_audio(pipeline, "a", inputs, over_bytes=0 if inline else DEFAULT_INLINE_LIMIT)
        await settled(pipeline, 30)
        again = await streamed_answer(pipeline, "a", inputs)
        await settled(pipeline, 30)
    aborted = {e.stage for e in load_events([tmp_path]) if e.request_id == "a" and e.event == STAGE_ABORTED}
    assert "token2wav" in aborted  # the abort landed while it was still decoding the speech
    assert ids_of(again) == long_answer.ids and again["results"]["token2wav"]["num_codes"] == LONG_TALK
    assert_equal_audio(long_answer, pcm16(again["pcm"]), MIN_STREAMED_SNR_DB)
    assert inline or made - before, "no segment of the pipeline's processes was seen: the check below proves nothing"
    assert not our_shm() & made and our_shm() <= before  # no segment of this pipeline's processes is left
