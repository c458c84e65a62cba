"""The tiny Qwen2.5-Omni checkpoints: transformers loads them offline, they answer like a model, and the
checkpoint reader names what is wrong with a broken one.

A checkpoint the writer makes loads with ``Qwen2_5OmniForConditionalGeneration.from_pretrained``;
``generate(return_audio=True)`` answers text, audio and image prompts; the answer changes with the prompt,
the audio's content, the image, the speaker and the seed.  Prompts are built from the checkpoint's own
processor parts as ``Qwen2_5OmniProcessor`` builds them (that class needs torchvision, which the CPU
install lacks; where it is installed the test compares the two).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from schedulers.checkpoints import CheckpointError
from schedulers.qwen2_5_omni.checkpoint import check_checkpoint, load_config, load_weights, speakers
from schedulers.qwen2_5_omni.tiny import SPEAKERS, write_checkpoint
from tests.qwen2_5_omni_reference import (  # noqa: F401  (fixtures model, tiny)
    reference_model,
    talker_codes,
    tiny_checkpoint,
)

SAMPLES_PER_CODE = 480  # two mel frames per code, 240 samples per mel frame


class Prompts:
    """``Qwen2_5OmniProcessor``'s inputs for one user turn, from the checkpoint's tokenizer, Whisper feature
    extractor, image processor and chat template (placeholders expanded as the processor expands them)."""

    def __init__(self, directory: Path) -> None:
        from transformers import Qwen2Tokenizer, WhisperFeatureExtractor
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        self.tokenizer = Qwen2Tokenizer.from_pretrained(directory)
        self.features = WhisperFeatureExtractor.from_pretrained(directory)
        self.images = Qwen2VLImageProcessorPil.from_pretrained(directory)
        self.template = json.loads((directory / "chat_template.json").read_text())["chat_template"]

    def text(self, content: list[dict[str, Any]]) -> str:
        messages = [{"role": "user", "content": content}]
        return self.tokenizer.apply_chat_template(
            messages, chat_template=self.template, add_generation_prompt=True, tokenize=False
        )

    def __call__(self, content: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import _get_feat_extract_output_lengths

        text, inputs = self.text(content), {}
        clips = [part["audio"] for part in content if part["type"] == "audio"]
        pictures = [part["image"] for part in content if part["type"] == "image"]
        if clips:
            features = self.features(
                clips, sampling_rate=16_000, return_attention_mask=True, padding="max_length", return_tensors="pt"
            )
            inputs["input_features"] = features["input_features"]
            inputs["feature_attention_mask"] = features["attention_mask"]
            counts = _get_feat_extract_output_lengths(features["attention_mask"].sum(-1)).tolist()
            text = _expand(text, self.tokenizer.audio_token, counts)
        if pictures:
            images = self.images(pictures, return_tensors="pt")
            inputs["thinker_pixel_values"] = images["pixel_values"]  # generate crashes on "pixel_values"
            inputs["image_grid_thw"] = images["image_grid_thw"]
            merge = self.images.merge_size**2
            text = _expand(text, self.tokenizer.image_token, [int(g.prod()) // merge for g in images["image_grid_thw"]])
        encoded = self.tokenizer(text, return_tensors="pt")
        return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"], **inputs}


def _expand(text: str, token: str, counts: list[int]) -> str:
    pieces = text.split(token)
    assert len(pieces) == len(counts) + 1
    return pieces[0] + "".join(token * count + piece for count, piece in zip(counts, pieces[1:], strict=True))


@pytest.fixture(scope="module")
def prompts(tiny: Path) -> Prompts:
    return Prompts(tiny)


def tone(frequency: float, seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(16_000 * seconds)) / 16_000
    return (0.3 * np.sin(2 * np.pi * frequency * t) * np.sin(2 * np.pi * 3 * t)).astype(np.float32)


def picture(seed: int) -> Any:
    from PIL import Image

    return Image.fromarray((np.random.RandomState(seed).rand(56, 56, 3) * 255).astype(np.uint8))


def answer(
    model: Any,
    prompts: Prompts,
    content: list[dict[str, Any]],
    *,
    speaker: str = "Chelsie",
    seed: int = 0,
    tokens: int = 8,
) -> tuple[list[int], torch.Tensor]:
    """``generate(return_audio=True)`` greedy: the answer's ids and its waveform."""
    inputs = prompts(content)
    torch.manual_seed(seed)
    ids, wav = model.generate(
        **inputs, speaker=speaker, thinker_max_new_tokens=tokens, thinker_do_sample=False, talker_do_sample=False
    )
    return ids[0, inputs["input_ids"].shape[1] :].tolist(), wav


def text(words: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": words}]


def test_checkpoint_has_the_release_layout_and_passes_check(tiny: Path, model: Any) -> None:
    files = {path.name for path in tiny.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors.index.json", "spk_dict.pt"} <= files
    assert {"tokenizer.json", "tokenizer_config.json", "preprocessor_config.json", "chat_template.json"} <= files
    assert len([name for name in files if name.startswith("model-") and name.endswith(".safetensors")]) >= 2
    assert json.loads((tiny / "config.json").read_text())["model_type"] == "qwen2_5_omni"
    check_checkpoint(tiny)
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    assert list(model.speaker_map) == list(SPEAKERS) == ["Chelsie", "Ethan"]


def test_processor_parts_load_offline_with_the_released_token_names(tiny: Path, prompts: Prompts) -> None:
    tokenizer = prompts.tokenizer
    assert (tokenizer.audio_token, tokenizer.image_token, tokenizer.video_token) == (
        "<|AUDIO|>",
        "<|IMAGE|>",
        "<|VIDEO|>",
    )
    assert (tokenizer.audio_bos_token, tokenizer.vision_bos_token) == ("<|audio_bos|>", "<|vision_bos|>")
    rendered = prompts.text([{"type": "audio", "audio": tone(440)}, *text("Hi")])
    assert rendered.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n")
    assert rendered.endswith("<|audio_bos|><|AUDIO|><|audio_eos|>Hi<|im_end|>\n<|im_start|>assistant\n")
    config = load_config(tiny)
    assert config.thinker_config.audio_token_index == tokenizer.convert_tokens_to_ids("<|AUDIO|>")


def test_processor_class_builds_the_same_inputs(tiny: Path, prompts: Prompts) -> None:
    from transformers import AutoImageProcessor, AutoTokenizer, Qwen2_5OmniProcessor, WhisperFeatureExtractor

    class WithoutVideo(Qwen2_5OmniProcessor):
        """The release processor less its video part, whose class needs torchvision; audio and images never call it."""

        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    processor = WithoutVideo(
        image_processor=AutoImageProcessor.from_pretrained(tiny),
        feature_extractor=WhisperFeatureExtractor.from_pretrained(tiny),
        tokenizer=AutoTokenizer.from_pretrained(tiny),
        chat_template=json.loads((tiny / "chat_template.json").read_text())["chat_template"],
    )
    content: list[dict[str, Any]] = [
        {"type": "audio", "audio": tone(440)},
        {"type": "image", "image": picture(0)},
        *text("Hi"),
    ]
    messages: Any = [{"role": "user", "content": content}]
    rendered = processor.apply_chat_template(messages, add_generation_prompt=True)
    theirs = processor(text=rendered, audio=[tone(440)], images=[picture(0)], return_tensors="pt")
    ours = prompts(content)
    assert torch.equal(theirs["input_ids"], ours["input_ids"])
    assert torch.equal(theirs["input_features"], ours["input_features"])
    assert torch.equal(theirs["pixel_values"], ours["thinker_pixel_values"])


@pytest.mark.parametrize(
    "content",
    [
        text("Hello, how are you?"),
        [{"type": "audio", "audio": tone(440)}, *text("What is said?")],
        [{"type": "image", "image": picture(0)}, *text("Describe the image.")],
    ],
    ids=["text", "audio", "image"],
)
def test_generate_answers_with_audio_one_code_per_token(model: Any, prompts: Prompts, content: list[Any]) -> None:
    ids, wav = answer(model, prompts, content, tokens=8)
    assert len(ids) == 8 and model.thinker.generation_config.eos_token_id not in ids
    # the talker ends on the first <tts_pad> after the answer: one code per answer token
    assert wav.shape == (8 * SAMPLES_PER_CODE,)
    assert 0.01 < float(wav.std()) and float(wav.abs().max()) < 1.0  # neither silent nor clipped


def test_the_answer_depends_on_the_prompt(model: Any, prompts: Prompts) -> None:
    assert (
        answer(model, prompts, text("Hello, how are you?"))[0] != answer(model, prompts, text("Describe the river."))[0]
    )


def test_the_answer_depends_on_the_audio(model: Any, prompts: Prompts) -> None:
    first = answer(model, prompts, [{"type": "audio", "audio": tone(440)}, *text("What is said?")], tokens=12)
    second = answer(model, prompts, [{"type": "audio", "audio": tone(220)}, *text("What is said?")], tokens=12)
    assert first[0] != second[0]


def test_the_answer_depends_on_the_image(model: Any, prompts: Prompts) -> None:
    first = answer(model, prompts, [{"type": "image", "image": picture(0)}, *text("Describe it.")], tokens=12)
    second = answer(model, prompts, [{"type": "image", "image": picture(1)}, *text("Describe it.")], tokens=12)
    assert first[0] != second[0]


def test_the_speaker_changes_the_codes_and_the_audio(model: Any, prompts: Prompts) -> None:
    with talker_codes(model) as codes:
        chelsie = answer(model, prompts, text("Hello, how are you?"), speaker="Chelsie", tokens=16)
        ethan = answer(model, prompts, text("Hello, how are you?"), speaker="Ethan", tokens=16)
    assert chelsie[0] == ethan[0]
    assert not torch.equal(codes[0], codes[1])
    assert not torch.equal(chelsie[1], ethan[1])


def test_the_seed_changes_the_audio_and_only_the_audio(model: Any, prompts: Prompts) -> None:
    first, again, other = (answer(model, prompts, text("Hello, how are you?"), seed=seed) for seed in (0, 0, 1))
    assert first[0] == other[0] and torch.equal(first[1], again[1])
    assert first[1].shape == other[1].shape and not torch.equal(first[1], other[1])


def test_the_same_size_and_seed_write_the_same_weights(tiny: Path, tmp_path: Path) -> None:
    again = write_checkpoint(tmp_path / "again")
    other = write_checkpoint(tmp_path / "other", seed=1)
    shards = sorted(path.name for path in tiny.glob("model-*.safetensors"))
    assert shards == sorted(path.name for path in again.glob("model-*.safetensors"))
    assert all((tiny / name).read_bytes() == (again / name).read_bytes() for name in shards)
    assert any((tiny / name).read_bytes() != (other / name).read_bytes() for name in shards)


def test_load_weights_reads_only_the_shards_of_its_part(
    tiny: Path, model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import safetensors
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniToken2WavModel

    index = json.loads((tiny / "model.safetensors.index.json").read_text())["weight_map"]
    needed = {shard for key, shard in index.items() if key.startswith("token2wav.")}
    assert needed != set(index.values())  # the part lives in some of the shards only
    opened: list[str] = []
    real_open = safetensors.safe_open

    def spy(path: str, *args: Any, **kwargs: Any) -> Any:
        opened.append(Path(path).name)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(safetensors, "safe_open", spy)
    part = Qwen2_5OmniToken2WavModel._from_config(load_config(tiny).token2wav_config)
    load_weights(tiny, "token2wav.", part)
    assert set(opened) == needed
    theirs = model.token2wav.state_dict()
    assert all(torch.equal(tensor, theirs[name]) for name, tensor in part.state_dict().items())


def test_speakers_are_named_as_the_file_names_them(tiny: Path, model: Any) -> None:
    found = speakers(tiny)
    assert found.names == ("Chelsie", "Ethan")
    assert found.lookup("chelsie") is found["Chelsie"] and found.lookup("ETHAN") is found["Ethan"]
    assert "chelsie" not in found
    for name, speaker in found.items():
        assert speaker.bos_token == model.speaker_map[name]["bos_token"]
        assert torch.equal(speaker.ref_mel, model.speaker_map[name]["ref_mel"])
    with pytest.raises(KeyError, match="Chelsie, Ethan"):
        found.lookup("alloy")


def _broken(tiny: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "broken"
    shutil.copytree(tiny, copy)
    return copy


def _shards(checkpoint: Path) -> list[str]:
    return sorted(set(json.loads((checkpoint / "model.safetensors.index.json").read_text())["weight_map"].values()))


def test_check_names_a_missing_shard(tiny: Path, tmp_path: Path) -> None:
    broken = _broken(tiny, tmp_path)
    second = _shards(broken)[1]
    (broken / second).unlink()
    with pytest.raises(CheckpointError, match=rf"{re.escape(second)}: missing"):
        check_checkpoint(broken)


def test_check_names_another_models_type(tiny: Path, tmp_path: Path) -> None:
    broken = _broken(tiny, tmp_path)
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "model_type": "qwen3_omni_moe"}))
    with pytest.raises(CheckpointError, match=r"config.json: model_type is 'qwen3_omni_moe', not 'qwen2_5_omni'"):
        check_checkpoint(broken)


def test_check_names_a_shard_that_lacks_what_the_index_puts_in_it(tiny: Path, tmp_path: Path) -> None:
    broken = _broken(tiny, tmp_path)
    first = _shards(broken)[0]
    index = json.loads((broken / "model.safetensors.index.json").read_text())
    key = next(key for key, shard in index["weight_map"].items() if shard != first)
    index["weight_map"][key] = first
    (broken / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=rf"{re.escape(first)}: the index .* does not hold"):
        check_checkpoint(broken)


def test_check_names_a_missing_speaker_file(tiny: Path, tmp_path: Path) -> None:
    broken = _broken(tiny, tmp_path)
    (broken / "spk_dict.pt").unlink()
    with pytest.raises(CheckpointError, match=r"spk_dict\.pt: missing"):
        check_checkpoint(broken)
