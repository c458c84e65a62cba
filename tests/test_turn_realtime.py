"""Turn-taking in the realtime session on the default pipeline, with synthesized speech.

``semantic_vad`` waits through a pause in an unfinished sentence that ``server_vad`` with a short
silence answers early, and ends a complete sentence after a short silence; speech over an answer
pauses it, and a backchannel resumes it (the client gets all of its audio) while a real
interruption cancels it. The server runs the "repeat" responder, which says the user's words back.
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import openai
import pytest
import trio

from omnitrio.client import RealtimeClient, open_realtime
from tests.test_realtime_voice import pcm16, realtime_url, send_audio, transcript
from toys.speech_text import heard_as

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # serves the speech pipeline
CUT = "I would like to book a table for"
REST = "four people, please."
COMPLETE = "What is the capital of France?"
ANSWER = "The train to Boston leaves from platform seven. The library closes at nine."
RATE = 24_000
TRANSCRIBED = "conversation.item.input_audio_transcription.completed"
PAUSED, RESUMED = "omnitrio.output_audio_buffer.paused", "omnitrio.output_audio_buffer.resumed"


async def set_turn_detection(rt: RealtimeClient, detection: dict[str, Any]) -> dict[str, Any]:
    """Take ``session.created``, set ``detection`` and input transcription; the session as updated."""
    await rt.receive()
    audio = {"input": {"turn_detection": detection, "transcription": {"model": "whisper-1"}}}
    await rt.send({"type": "session.update", "session": {"audio": audio}})
    return (await rt.receive_until("session.updated"))[-1]["session"]  # type: ignore[no-any-return]


async def events_until_all(rt: RealtimeClient, *event_types: str) -> list[dict[str, Any]]:
    """Every event until each of ``event_types`` has come at least once."""
    events: list[dict[str, Any]] = []
    with trio.move_on_after(60):
        while not set(event_types) <= {e["type"] for e in events}:
            events.append(await rt.receive())
        return events
    raise AssertionError(f"only {[e['type'] for e in events]} in 60 s")


def committed_transcripts(events: list[dict[str, Any]]) -> list[str]:
    """The transcripts of the committed user turns, in commit order."""
    order = [e["item_id"] for e in events if e["type"] == "input_audio_buffer.committed"]
    done = {e["item_id"]: e["transcript"] for e in events if e["type"].endswith("input_audio_transcription.completed")}
    return [done[item] for item in order if item in done]


async def test_semantic_vad_waits_through_a_mid_sentence_pause_that_server_vad_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A 1 s pause after "for"; then, as a microphone goes on sending, silence past the longest wait
    # of an unfinished turn (medium eagerness: 4 s), so the turn ends whatever the judgement.  The
    # voice's random variation sometimes ends "for" on a sound Whisper hears as "for it." (a
    # complete sentence): the same samples on every run keep the sentence unfinished as written.
    pause = pcm16(CUT, silence_after=0.8, variation=0.0) + pcm16(REST, silence_after=4.5, variation=0.0)
    async with realtime_url() as url:
        with caplog.at_level(logging.DEBUG, logger="omnitrio.serve.realtime.listen"):
            async with open_realtime(url) as rt:
                session = await set_turn_detection(rt, {"type": "semantic_vad", "eagerness": "medium"})
                await send_audio(rt, pause)
                semantic = await events_until_all(rt, "response.done", TRANSCRIBED)
        judged = "; ".join(r.getMessage() for r in caplog.records if "judged" in r.getMessage())
        async with open_realtime(url) as rt:
            await set_turn_detection(rt, {"type": "server_vad", "silence_duration_ms": 300})
            await send_audio(rt, pause)
            early = await events_until_all(rt, "response.created", TRANSCRIBED)
    detection = session["audio"]["input"]["turn_detection"]
    assert (detection["type"], detection["eagerness"]) == ("semantic_vad", "medium")
    turns = committed_transcripts(semantic)
    assert [e["type"] for e in semantic].count("input_audio_buffer.committed") == 1, f"{turns}; pauses: {judged}"
    assert heard_as(turns[0], f"{CUT} {REST}"), f"{turns}; pauses: {judged}"
    assert heard_as(transcript(semantic), f"{CUT} {REST}")  # the answer is to the whole sentence
    assert heard_as(committed_transcripts(early)[0], CUT)  # server VAD ended the turn at the pause


async def test_semantic_vad_ends_a_complete_sentence_after_a_short_silence_and_answers_it() -> None:
    speech = pcm16(COMPLETE, silence_after=2.5)  # past high eagerness's wait for an unfinished turn
    voiced_end_ms = 200 + 1000 * (len(pcm16(COMPLETE)) // 2 - RATE // 5) // RATE
    async with realtime_url() as url, open_realtime(url) as rt:
        await set_turn_detection(rt, {"type": "semantic_vad", "eagerness": "high"})
        await send_audio(rt, speech)
        events = await events_until_all(rt, "response.done")
    stopped = next(e for e in events if e["type"] == "input_audio_buffer.speech_stopped")
    assert stopped["audio_end_ms"] - voiced_end_ms < 500  # server VAD's default silence alone is 500 ms
    assert events[-1]["response"]["status"] == "completed"
    assert heard_as(transcript(events), COMPLETE)


def sdk_speaks_over_the_answer(url: str, over: bytes) -> list[Any]:
    """With the official SDK's client: a text turn answered with speech; ``over`` is sent at the first
    audio; every event received (parsed by the SDK) until the answer's ``response.done``."""
    client = openai.OpenAI(base_url=url.replace("ws://", "http://").removesuffix("/realtime"), api_key="unused")
    events: list[Any] = []
    with client.realtime.connect(model="omnitrio-speech") as connection:
        connection.recv()
        # A decide window no load can run out: what is judged is the words, not how fast they are heard.
        detection = {"type": "server_vad", "false_interruptions": {"decide_ms": 10_000}}
        session = {"type": "realtime", "omnitrio_events": True, "audio": {"input": {"turn_detection": detection}}}
        connection.session.update(session=session)  # type: ignore[arg-type]
        while connection.recv().type != "session.updated":
            continue
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ANSWER}]}
        connection.conversation.item.create(item=item)  # type: ignore[arg-type]
        connection.response.create()
        while (event := connection.recv()).type != "response.output_audio.delta":
            events.append(event)
        events.append(event)
        for i in range(0, len(over), 4800):
            connection.input_audio_buffer.append(audio=base64.b64encode(over[i : i + 4800]).decode())
        while (event := connection.recv()).type != "response.done":
            events.append(event)
        events.append(event)
        assistant = next(e for e in events if e.type == "response.output_item.added").item.id
        connection.conversation.item.retrieve(item_id=assistant)
        while (event := connection.recv()).type != "conversation.item.retrieved":
            events.append(event)
        events.append(event)
    return events


async def speak_over_the_answer(said: str) -> tuple[list[Any], list[str]]:
    """``said`` (with 0.6 s of silence after it) over an answer; the SDK's events and their types."""
    over = pcm16(said, silence_after=0.6)
    async with realtime_url() as url:
        with trio.fail_after(60):
            events = await trio.to_thread.run_sync(sdk_speaks_over_the_answer, url, over, abandon_on_cancel=True)
    return events, [e.type for e in events]


def audio_deltas(events: list[Any]) -> list[bytes]:
    return [base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta"]


async def test_a_backchannel_over_the_answer_pauses_it_then_it_resumes_with_all_its_audio() -> None:
    events, types = await speak_over_the_answer("Okay.")
    paused, resumed = types.index(PAUSED), types.index(RESUMED)
    assert types.index("input_audio_buffer.speech_started") < paused < resumed
    assert "response.output_audio.delta" not in types[paused:resumed]
    assert events[resumed].reason == "backchannel" and heard_as(events[resumed].transcript, "Okay.")
    assert "input_audio_buffer.committed" not in types  # the backchannel is no turn
    done = events[types.index("response.done")].response
    assert done.status == "completed"
    retrieved = json.loads(events[-1].to_json())["item"]
    sent = base64.b64decode(retrieved["content"][0]["audio"])
    assert b"".join(audio_deltas(events)) == sent  # every piece of the answer reached the client


async def test_a_real_interruption_over_the_answer_cancels_it() -> None:
    events, types = await speak_over_the_answer("Wait, when does the next train leave?")
    paused = types.index(PAUSED)
    assert RESUMED not in types
    assert "response.output_audio.delta" not in types[paused:]
    done = events[types.index("response.done")].response
    assert (done.status, done.status_details.reason) == ("cancelled", "turn_detected")
