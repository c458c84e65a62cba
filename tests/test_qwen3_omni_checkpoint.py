"""The random Qwen3-Omni checkpoints tests write, and reading them (schedulers.qwen3_omni.checkpoint).

A checkpoint the maker writes loads with transformers' ``from_pretrained``, answers deterministically, and
depends on what it is given (silence vs a tone, two speakers); a broken directory is refused at
:func:`check_checkpoint` with the file named; :func:`load_weights` loads one part exactly.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from schedulers.qwen3_omni.checkpoint import CheckpointError, check_checkpoint, load_config, load_weights
from schedulers.qwen3_omni.tiny import write_checkpoint
from toys.qwen3_omni_reference import (
    load_reference_model,
    reference_generate,
    reference_processor,
    sample_messages,
    talker_margins,
    thinker_margins,
)

FRAMES = 12  # talker frames per reference generate: enough to tell two waveforms apart, quick on CPU
TOKENS = 8


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return write_checkpoint(tmp_path_factory.mktemp("qwen3-omni") / "tiny", size="tiny", seed=0)


@pytest.fixture(scope="module")
def loaded(tiny: Path) -> tuple[Any, Any]:
    return load_reference_model(tiny), reference_processor(tiny)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _generate(loaded: tuple[Any, Any], name: str, **kwargs: Any) -> Any:
    model, processor = loaded
    return reference_generate(
        model, processor, sample_messages()[name], max_new_tokens=TOKENS, talker_max_new_tokens=FRAMES, **kwargs
    )


def test_written_checkpoint_is_sharded_like_a_release(tiny: Path) -> None:
    index = json.loads((tiny / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 2
    assert all((tiny / shard).is_file() for shard in shards)
    for name in ("config.json", "tokenizer.json", "preprocessor_config.json", "chat_template.json"):
        assert (tiny / name).is_file(), name


def test_checkpoint_loads_with_from_pretrained_and_passes_check(tiny: Path, loaded: tuple[Any, Any]) -> None:
    check_checkpoint(tiny)
    model, _ = loaded
    assert type(model).__name__ == "Qwen3OmniMoeForConditionalGeneration"
    assert load_config(tiny).talker_config.num_code_groups == model.config.talker_config.num_code_groups


def test_same_seed_writes_the_same_weights(tiny: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    again = write_checkpoint(tmp_path / "again", size="tiny", seed=0)
    index = json.loads((tiny / "model.safetensors.index.json").read_text())
    for shard in sorted(set(index["weight_map"].values())):
        first, second = load_file(tiny / shard), load_file(again / shard)
        assert first.keys() == second.keys()
        assert all(torch.equal(first[k], second[k]) for k in first), shard


def test_generate_is_deterministic_across_two_loads(tiny: Path, loaded: tuple[Any, Any]) -> None:
    first = _generate(loaded, "tone")
    second = _generate((load_reference_model(tiny), loaded[1]), "tone")
    assert first.token_ids == second.token_ids
    assert torch.equal(first.codes, second.codes)
    assert np.array_equal(first.waveform, second.waveform)


def test_silence_and_a_tone_give_different_answers(loaded: tuple[Any, Any]) -> None:
    assert _generate(loaded, "silence").token_ids != _generate(loaded, "tone").token_ids


def test_two_speakers_give_two_waveforms(loaded: tuple[Any, Any]) -> None:
    ethan, chelsie = _generate(loaded, "text", speaker="ethan"), _generate(loaded, "text", speaker="chelsie")
    assert ethan.token_ids == chelsie.token_ids
    assert ethan.codes.shape != chelsie.codes.shape or not torch.equal(ethan.codes, chelsie.codes)
    n = min(len(ethan.waveform), len(chelsie.waveform))
    assert np.abs(ethan.waveform[:n] - chelsie.waveform[:n]).max() > 0.01


def test_waveform_is_audible_and_unclipped(loaded: tuple[Any, Any]) -> None:
    wav = _generate(loaded, "text").waveform
    rms = float(np.sqrt(np.mean(wav**2)))
    assert 0.005 < rms < 0.5
    assert np.mean(np.abs(wav) >= 0.999) < 0.01


@pytest.mark.parametrize("name", ["text", "silence", "tone", "image"])
def test_greedy_margins_are_wide_on_the_sample_prompts(loaded: tuple[Any, Any], name: str) -> None:
    model, processor = loaded
    margins = thinker_margins(model, processor, sample_messages()[name], max_new_tokens=16)
    assert min(margins) > 0.05, margins


@pytest.mark.parametrize("name", ["text", "tone"])
def test_talker_and_code_predictor_margins_are_wide_on_the_sample_prompts(loaded: tuple[Any, Any], name: str) -> None:
    model, processor = loaded
    margins = talker_margins(model, processor, sample_messages()[name], frames=FRAMES)
    assert min(margins["talker"]) > 0.05, margins["talker"]
    assert min(margins["code_predictor"]) > 0.05, margins["code_predictor"]


def test_load_weights_loads_one_part_as_from_pretrained_does(tiny: Path, loaded: tuple[Any, Any]) -> None:
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    model, _ = loaded
    config = load_config(tiny)
    code2wav = Qwen3OmniMoeCode2Wav._from_config(config.code2wav_config)
    load_weights(tiny, "code2wav.", code2wav)
    expected = model.code2wav.state_dict()
    assert code2wav.state_dict().keys() == expected.keys()
    assert all(torch.equal(code2wav.state_dict()[k], expected[k]) for k in expected)


def test_load_weights_refuses_a_module_of_another_part(tiny: Path) -> None:
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    code2wav = Qwen3OmniMoeCode2Wav._from_config(load_config(tiny).code2wav_config)
    with pytest.raises(CheckpointError, match=r"thinker\.audio_tower\."):
        load_weights(tiny, "thinker.audio_tower.", code2wav)


def test_check_names_a_missing_shard(tiny: Path, tmp_path: Path) -> None:
    broken = _copy(tiny, tmp_path / "ckpt")
    (broken / "model-00002-of-00004.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"model-00002-of-00004\.safetensors: missing"):
        check_checkpoint(broken)


def test_check_names_the_config_of_another_model(tiny: Path, tmp_path: Path) -> None:
    broken = _copy(tiny, tmp_path / "ckpt")
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "model_type": "qwen2_5_omni"}))
    with pytest.raises(CheckpointError, match=r"config\.json: model_type is 'qwen2_5_omni'"):
        check_checkpoint(broken)


def test_check_names_a_shard_that_disagrees_with_the_index(tiny: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    broken = _copy(tiny, tmp_path / "ckpt")
    shard = broken / "model-00001-of-00004.safetensors"
    tensors = load_file(shard)
    dropped = sorted(tensors)[0]
    del tensors[dropped]
    save_file(tensors, shard, metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=rf"model-00001-of-00004\.safetensors: .*{dropped}"):
        check_checkpoint(broken)


def test_check_names_inconsistent_part_sizes(tiny: Path, tmp_path: Path) -> None:
    broken = _copy(tiny, tmp_path / "ckpt")
    config = json.loads((broken / "config.json").read_text())
    config["code2wav_config"]["num_quantizers"] += 1
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"code2wav_config\.num_quantizers"):
        load_config(broken)


def test_load_weights_fuses_moe_experts_into_a_module_built_on_meta(tiny: Path, loaded: tuple[Any, Any]) -> None:
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeThinkerTextModel

    model, _ = loaded
    with torch.device("meta"):
        text = Qwen3OmniMoeThinkerTextModel._from_config(load_config(tiny).thinker_config.text_config)
    load_weights(tiny, "thinker.model.", text)
    expected = model.thinker.model.language_model.state_dict()  # checkpoint "thinker.model." (release names)
    got = text.state_dict()
    assert any(".experts.gate_up_proj" in k for k in expected)
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in expected)
