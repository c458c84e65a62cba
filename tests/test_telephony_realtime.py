"""Telephony audio in the realtime session: ``audio/pcmu`` and ``audio/pcma`` (G.711, 8 kHz) in and out.

The session's formats are checked as OpenAI's GA session defines them (and the beta spellings);
then a sentence spoken down a phone line is answered down the phone line (the "repeat" responder
says it back) and Whisper hears the sentence in what came back.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest

from omnitrio.client import open_realtime
from omnitrio.serve.realtime.formats import EdgeAudio
from omnitrio.serve.realtime.g711 import decode, encode
from omnitrio.serve.realtime.protocol import EventError, beta_session
from omnitrio.serve.realtime.session_config import default_session, updated_session
from tests.test_realtime_voice import pcm16, realtime_url, send_audio
from toys.speech_text import heard_as

SENTENCE = "Turn left at the second traffic light."

pytestmark = pytest.mark.timeout(600)  # serves the speech pipeline: past the global 120 s when busy


def formats(update: dict[str, Any]) -> tuple[str, str]:
    session = updated_session(default_session("sess", "m"), update)
    return session["audio"]["input"]["format"]["type"], session["audio"]["output"]["format"]["type"]


def test_g711_formats_are_taken_in_the_ga_shape_and_the_beta_one() -> None:
    ga = {"audio": {"input": {"format": {"type": "audio/pcmu"}}, "output": {"format": {"type": "audio/pcma"}}}}
    assert formats(ga) == ("audio/pcmu", "audio/pcma")
    assert formats({"input_audio_format": "g711_alaw", "output_audio_format": "g711_ulaw"}) == (
        "audio/pcma",
        "audio/pcmu",
    )
    session = updated_session(default_session("sess", "m"), ga)
    assert (beta_session(session)["input_audio_format"], beta_session(session)["output_audio_format"]) == (
        "g711_ulaw",
        "g711_alaw",
    )
    assert formats({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 24_000}}}})[0] == "audio/pcm"


@pytest.mark.parametrize(
    ("update", "param"),
    [
        ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16_000}}}}, "session.audio.input.format"),
        ({"audio": {"output": {"format": {"type": "audio/opus"}}}}, "session.audio.output.format"),
        ({"audio": {"input": {"format": {"type": "audio/pcmu", "rate": 16_000}}}}, "session.audio.input.format"),
        ({"input_audio_format": "g722"}, "session.input_audio_format"),
    ],
)
def test_an_unsupported_format_is_an_error_naming_its_param(update: dict[str, Any], param: str) -> None:
    with pytest.raises(EventError) as error:
        updated_session(default_session("sess", "m"), update)
    assert error.value.param == param


def test_the_edge_converts_g711_appends_and_deltas_and_leaves_pcm_alone() -> None:
    edge = EdgeAudio()
    pcm = (np.sin(np.arange(4800) / 10) * 8000).astype("<i2").tobytes()
    append = {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()}
    assert edge.incoming(append) == pcm
    session = updated_session(
        default_session("sess", "m"),
        {"audio": {"input": {"format": {"type": "audio/pcmu"}}, "output": {"format": {"type": "audio/pcma"}}}},
    )
    edge.configure(session)
    line = encode(np.frombuffer(pcm, "<i2")[::3].copy(), "pcmu")  # 100 ms at 8 kHz
    odd = {"type": "input_audio_buffer.append", "audio": base64.b64encode(line[:-1]).decode()}  # any byte count
    assert 0 < len(edge.incoming(odd)) <= 2 * 3 * len(line)
    delta = {"type": "response.output_audio.delta", "response_id": "r", "delta": append["audio"]}
    sent = edge.outgoing(delta, session)
    assert sent is not None and 0 < len(base64.b64decode(sent["delta"])) <= len(pcm) // 6
    assert edge.outgoing(delta, None) is delta  # an event of no response passes unchanged


async def spoken_down_the_line(law: str) -> tuple[dict[str, Any], bytes]:
    """A sentence sent as G.711 ``law`` with server VAD; the session as updated and the answer's G.711 audio."""
    from schedulers.speech.audio import float_to_pcm16, resample

    speech = np.frombuffer(pcm16(SENTENCE, silence_after=1.0), "<i2").astype(np.float32) / 32768
    line = encode(float_to_pcm16(resample(speech, 24_000, 8_000)), law.removeprefix("audio/"))  # type: ignore[arg-type]
    kind = {"type": law}
    async with realtime_url() as url:
        async with open_realtime(url) as rt:
            await rt.receive()
            update = {"audio": {"input": {"format": kind}, "output": {"format": kind}}}
            await rt.send({"type": "session.update", "session": update})
            session = (await rt.receive_until("session.updated"))[-1]["session"]
            await send_audio(rt, line, chunk_ms=50)
            events = await rt.receive_until("response.done")
    answer = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
    return session, answer


@pytest.mark.slow
@pytest.mark.parametrize("law", ["audio/pcmu", "audio/pcma"])
async def test_a_phone_call_is_heard_and_answered_in_g711(law: str) -> None:
    from schedulers.speech.asr import shared_recognizer
    from schedulers.speech.audio import resample

    session, answer = await spoken_down_the_line(law)
    assert session["audio"]["input"]["format"] == {"type": law} == session["audio"]["output"]["format"]
    assert len(answer) > 8_000  # over a second of speech, one byte a sample at 8 kHz
    audio = decode(answer, law.removeprefix("audio/")).astype(np.float32) / 32768  # type: ignore[arg-type]
    recognizer = shared_recognizer("auto", compute_type="int8", cpu_threads=2, beam_size=1)
    assert heard_as(recognizer.transcribe(resample(audio, 8_000, 16_000)), SENTENCE)
