"""The front of the Qwen2.5-Omni graph run by the runtime (preprocess → encoders → aggregate), inline and with
one process per stage.

The pipeline here ends at ``aggregate``: its result is the thinker's input
(:class:`~schedulers.front.handoffs.ThinkerInput`), compared with what transformers' own processor
and thinker encoders make of the same messages under the model's system prompt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import trio

from omnitrio import open_pipeline
from omnitrio.config_loading import load
from omnitrio.errors import BadRequest
from schedulers.front.handoffs import ThinkerInput
from schedulers.qwen2_5_omni.front.preprocess import SYSTEM_PROMPT
from tests.qwen2_5_omni_reference import (  # noqa: F401  (fixtures model, tiny)
    DEVICE,
    clip,
    pcm16,
    picture,
    png,
    reference_inputs,
    reference_model,
    reference_processor,
    tiny_checkpoint,
    wav,
)

pytestmark = pytest.mark.timeout(600)
# The encoders' embeddings against the reference's on the CPU: CUDA's float32 kernels round differently.
TOLERANCE = 1e-5 if DEVICE == "cpu" else 1e-4

G = "schedulers.qwen2_5_omni.graph"
STAGES = {
    "preprocess": f"""factory_path = "schedulers.qwen2_5_omni.front.preprocess.create_preprocess_stage"
next = ["audio_encoder", "image_encoder", "aggregate"]
route_fn = "schedulers.graph.front.route_preprocess"
[stages.project_payload]
audio_encoder = "{G}:EDGES.project_to_audio_encoder"
image_encoder = "{G}:EDGES.project_to_image_encoder"
aggregate = "{G}:EDGES.project_to_aggregate"
""",
    "audio_encoder": """factory_path = "schedulers.qwen2_5_omni.front.encoders.create_audio_encoder_stage"
next = "aggregate"
""",
    "image_encoder": """factory_path = "schedulers.qwen2_5_omni.front.encoders.create_image_encoder_stage"
next = "aggregate"
""",
    "aggregate": f"""factory_path = "schedulers.front.stages.create_aggregate_stage"
wait_for = ["preprocess", "audio_encoder", "image_encoder"]
wait_for_fn = "schedulers.graph.front.wait_for_aggregate"
merge_fn = "{G}:EDGES.merge_aggregate"
terminal = true
""",
}
MODEL_ARGS = ["preprocess", "audio_encoder", "image_encoder"]


def front_config(tmp_path: Path, *, processes: bool) -> Path:
    """The front as a pipeline file; with ``processes`` each stage in its own process."""
    args = ", ".join(f'"{stage}.factory.model_dir"' for stage in MODEL_ARGS)
    text = f'name = "qwen2.5-omni-front"\nmodel_args = [{args}]\n'
    for name, body in STAGES.items():
        where = f'process = "{name}"\n' if processes else ""
        text += f'\n[[stages]]\nname = "{name}"\n{where}{body}'
    path = tmp_path / "front.toml"
    path.write_text(text)
    return path


SOUND, OTHER_SOUND, IMAGE = clip(440, 1.2), clip(250, 0.7), picture(4, 56, 42)
PROMPTS: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {
    # name: (the chat request's parts, the same parts as transformers reads them)
    "text": ([{"type": "text", "text": "Hello there"}], [{"type": "text", "text": "Hello there"}]),
    "audio": (
        [
            {"type": "input_audio", "input_audio": {"data": wav(SOUND), "format": "wav"}},
            {"type": "text", "text": "Hm?"},
        ],
        [{"type": "audio", "audio": pcm16(SOUND)}, {"type": "text", "text": "Hm?"}],
    ),
    "image": (
        [{"type": "image_url", "image_url": {"url": png(IMAGE)}}, {"type": "text", "text": "What is it?"}],
        [{"type": "image", "image": IMAGE}, {"type": "text", "text": "What is it?"}],
    ),
    "two clips and an image": (
        [
            {"type": "input_audio", "input_audio": {"data": wav(OTHER_SOUND), "format": "wav"}},
            {"type": "image_url", "image_url": {"url": png(IMAGE)}},
            {"type": "input_audio", "input_audio": {"data": wav(SOUND), "format": "wav"}},
        ],
        [
            {"type": "audio", "audio": pcm16(OTHER_SOUND)},
            {"type": "image", "image": IMAGE},
            {"type": "audio", "audio": pcm16(SOUND)},
        ],
    ),
}


def chat(parts: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"task": "chat", "messages": [{"role": "user", "content": parts}], **extra}


def expected_input(model: Any, processor: Any, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """What transformers makes of ``parts`` under the model's system prompt: the processor's ids and the
    thinker's own encoders' embeddings."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": parts}]
    inputs = reference_inputs(processor, messages)
    found: dict[str, Any] = {"input_ids": inputs["input_ids"][0]}
    with torch.inference_mode():
        if "input_features" in inputs:
            mask = inputs["feature_attention_mask"]
            audio = model.thinker.get_audio_features(inputs["input_features"], feature_attention_mask=mask)
            found["audio_embeds"], found["audio_feature_lengths"] = audio.last_hidden_state, mask.sum(-1)
        if "pixel_values" in inputs:
            image = model.thinker.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])
            found["image_embeds"], found["image_grid_thw"] = torch.cat(image.pooler_output), inputs["image_grid_thw"]
    return found


@pytest.mark.parametrize("processes", [False, True], ids=["inline", "one process per stage"])
async def test_the_thinker_gets_what_transformers_makes_of_the_request(
    tiny: Path, model: Any, tmp_path: Path, processes: bool
) -> None:
    config = load(front_config(tmp_path, processes=processes), model=tiny, device=DEVICE)
    got: dict[str, ThinkerInput] = {}
    async with open_pipeline(config, inline=not processes) as pipeline:

        async def ask(name: str) -> None:
            got[name] = await pipeline.submit(name, chat(PROMPTS[name][0], max_tokens=9, temperature=0, seed=5))

        async with trio.open_nursery() as nursery:  # together: the encoders may batch them
            for name in PROMPTS:
                nursery.start_soon(ask, name)
    processor = reference_processor(tiny)
    for name, (_, parts) in PROMPTS.items():
        result, expected = got[name], expected_input(model, processor, parts)
        assert isinstance(result, ThinkerInput), name
        assert torch.equal(result.input_ids, expected["input_ids"]), name
        for field in ("audio_embeds", "image_embeds"):
            if field in expected:
                torch.testing.assert_close(getattr(result, field), expected[field], rtol=TOLERANCE, atol=TOLERANCE)
            else:
                assert getattr(result, field) is None, (name, field)
        for field in ("audio_feature_lengths", "image_grid_thw"):
            if field in expected:
                assert torch.equal(getattr(result, field), expected[field]), (name, field)
            else:
                assert getattr(result, field) is None, (name, field)
        knobs = result.knobs
        assert (knobs.max_new_tokens, knobs.temperature, knobs.seed, knobs.want_audio) == (9, 0.0, 5, False), name


async def test_the_knobs_carry_the_voice_and_the_stream_flag(tiny: Path, tmp_path: Path) -> None:
    text = [{"type": "text", "text": "Hi"}]
    async with open_pipeline(load(front_config(tmp_path, processes=False), model=tiny), inline=True) as pipeline:
        spoken = await pipeline.submit("r1", chat(text, modalities=["text", "audio"], audio={"voice": "ethan"}))
        whole = await pipeline.submit("r2", chat(text, modalities=["text", "audio"], stream=False))
    assert (spoken.knobs.want_audio, spoken.knobs.speaker, spoken.knobs.stream) == (True, "Ethan", True)
    assert (whole.knobs.speaker, whole.knobs.stream) == ("Chelsie", False)


async def test_video_and_an_unknown_voice_are_the_clients_mistakes(tiny: Path, tmp_path: Path) -> None:
    video = chat([{"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}])
    bob = chat([{"type": "text", "text": "Hi"}], modalities=["text", "audio"], audio={"voice": "bob"})
    async with open_pipeline(load(front_config(tmp_path, processes=False), model=tiny), inline=True) as pipeline:
        with pytest.raises(BadRequest) as refused_video:
            await pipeline.submit("v", video)
        with pytest.raises(BadRequest) as refused_voice:
            await pipeline.submit("b", bob)
    assert refused_video.value.param == "messages[0].content[0]"
    assert "video input is not supported" in str(refused_video.value)
    assert refused_voice.value.param == "audio.voice"
    assert "'bob' is not a voice of this model; use one of Chelsie, Ethan" in str(refused_voice.value)
