"""transformers' own Qwen2.5-Omni as the tests' reference: its processor without video, and ``generate``.

* :func:`reference_processor`, :func:`reference_inputs` and the media helpers (:func:`clip`, :func:`picture`,
  :func:`wav`, :func:`png`, :func:`pcm16`) are :mod:`toys.qwen2_5_omni_reference`'s, which the benches share;
* :func:`reference_answer`: ``Qwen2_5OmniForConditionalGeneration.generate(return_audio=True)`` greedy (thinker
  and talker), recording the talker's codes as ``generate`` hands them to token2wav;
* the fixtures ``tiny`` (a tiny checkpoint, written once per test session: :func:`tiny_checkpoint`),
  ``model`` (transformers' model of it: :func:`reference_model`) and ``processor`` (its processor:
  :func:`tiny_processor`): a test module imports the functions;
* :data:`DEVICE`: where a pipeline test places every model stage; the reference stays on the CPU.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

from schedulers.qwen2_5_omni.tiny import write_checkpoint
from toys.qwen2_5_omni_reference import clip as clip
from toys.qwen2_5_omni_reference import pcm16 as pcm16
from toys.qwen2_5_omni_reference import picture as picture
from toys.qwen2_5_omni_reference import png as png
from toys.qwen2_5_omni_reference import reference_inputs as reference_inputs
from toys.qwen2_5_omni_reference import reference_processor as reference_processor
from toys.qwen2_5_omni_reference import wav as wav
from toys.release_processor import media as media

DEVICE = os.environ.get("OMNITRIO_QWEN2_5_OMNI_DEVICE", "cpu")
"""Where a pipeline test places every model stage (``load(..., device=DEVICE)``): ``cpu`` unless
``OMNITRIO_QWEN2_5_OMNI_DEVICE`` says otherwise.  bench/gpu/omni.sh sets ``cuda`` (float32, no TF32) and
runs every ``tests/test_qwen2_5_omni_*.py`` that uses it."""


@pytest.fixture(scope="session", name="tiny")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2.5-Omni checkpoint (read only: tests never change it)."""
    return write_checkpoint(tmp_path_factory.mktemp("qwen2_5_omni") / "tiny")


@pytest.fixture(scope="session", name="model")
def reference_model(tiny: Path) -> Any:
    """``Qwen2_5OmniForConditionalGeneration.from_pretrained(tiny)``, float32, eval, one torch thread."""
    from transformers import Qwen2_5OmniForConditionalGeneration

    torch.set_num_threads(1)
    return Qwen2_5OmniForConditionalGeneration.from_pretrained(tiny).eval()


@pytest.fixture(scope="session", name="processor")
def tiny_processor(tiny: Path) -> Any:
    """:func:`reference_processor` of the tiny checkpoint."""
    return reference_processor(tiny)


@contextmanager
def talker_codes(model: Any) -> Iterator[list[torch.Tensor]]:
    """A list that, while the block runs, gets the new codes (``Long[n]``, the prompt cut off) of each call of
    ``model.talker.generate``."""
    codes: list[torch.Tensor] = []
    generate = model.talker.generate

    def recorded(*args: Any, **kwargs: Any) -> torch.Tensor:
        out = generate(*args, **kwargs)
        codes.append(out[0, kwargs["input_ids"].shape[1] :])
        return out

    model.talker.generate = recorded
    try:
        yield codes
    finally:
        del model.talker.generate


@pytest.fixture(scope="session", name="talker")
def talker_model(tiny: Path) -> Any:
    """The tiny checkpoint's talker (:class:`~schedulers.qwen2_5_omni.talker.model.TalkerModel`)."""
    from schedulers.qwen2_5_omni.talker.model import TalkerModel

    return TalkerModel.from_checkpoint(tiny)


def user(*parts: dict[str, Any]) -> list[dict[str, Any]]:
    """One user turn of transformers-style chat ``parts``."""
    return [{"role": "user", "content": list(parts)}]


def text(words: str) -> dict[str, Any]:
    """A text part."""
    return {"type": "text", "text": words}


@attrs.frozen
class Answer:
    """What ``generate`` answered: the thinker's new ids, the talker's codes, the waveform, and the thinker's
    last hidden state and input embeddings per forward (prompt first, ``[1, n, H]`` each)."""

    ids: list[int]
    codes: list[int]
    wav: torch.Tensor
    hidden: list[torch.Tensor]
    embeds: list[torch.Tensor]


def reference_answer(
    model: Any,
    processor: Any,
    messages: list[dict[str, Any]],
    *,
    speaker: str = "Chelsie",
    seed: int = 0,
    max_new_tokens: int = 8,
    talker_min_new_tokens: int = 0,
    talker_max_new_tokens: int | None = None,
) -> Answer:
    """``model.generate(return_audio=True)`` on ``messages`` with thinker and talker greedy (the talker held
    from its end codes for ``talker_min_new_tokens`` codes, cut at ``talker_max_new_tokens`` when given)."""
    inputs = reference_inputs(processor, messages)
    if "pixel_values" in inputs:  # transformers 5.23's generate crashes on pixel_values, not on this name
        inputs["thinker_pixel_values"] = inputs.pop("pixel_values")
    codes: list[torch.Tensor] = []
    states: list[Any] = []
    talker_generate, thinker_generate = model.talker.generate, model.thinker.generate

    def talker(*args: Any, **kwargs: Any) -> torch.Tensor:
        out = talker_generate(*args, **kwargs)
        codes.append(out[0, kwargs["input_ids"].shape[1] :])
        return out

    def thinker(*args: Any, **kwargs: Any) -> Any:
        out = thinker_generate(*args, **kwargs)
        states.append(out.hidden_states)
        return out

    model.talker.generate, model.thinker.generate = talker, thinker
    try:
        torch.manual_seed(seed)
        with torch.inference_mode():
            sequences, wav = model.generate(
                **inputs,
                speaker=speaker,
                thinker_max_new_tokens=max_new_tokens,
                thinker_do_sample=False,
                talker_do_sample=False,
                **({"talker_min_new_tokens": talker_min_new_tokens} if talker_min_new_tokens else {}),
                **({"talker_max_new_tokens": talker_max_new_tokens} if talker_max_new_tokens else {}),
            )
    finally:
        del model.talker.generate, model.thinker.generate
    found = codes[0].tolist()
    ends = [i for i, code in enumerate(found) if code in (model.talker.codec_pad_token, model.talker.codec_eos_token)]
    return Answer(
        ids=sequences[0, inputs["input_ids"].shape[1] :].tolist(),
        codes=found[: ends[0]] if ends else found,
        wav=wav,
        hidden=[step[-1] for step in states[0]],
        embeds=[step[0] for step in states[0]],
    )


def left_padded(caches: list[Any]) -> tuple[Any, torch.Tensor]:
    """One transformers ``DynamicCache`` holding the batch-1 ``caches`` as rows, each right-aligned (left
    padding), and the ``[B, width]`` attention mask that hides the padding: a stand-in for the kit's KV
    batch in tests of the model wrappers."""
    from transformers.cache_utils import DynamicCache

    lengths = [cache.get_seq_length() for cache in caches]
    width = max(lengths)
    batch = DynamicCache()
    for layer in range(len(caches[0].layers)):
        keys, values = [], []
        for cache in caches:
            k, v = cache.layers[layer].keys, cache.layers[layer].values
            pad = width - k.shape[-2]
            keys.append(torch.nn.functional.pad(k, (0, 0, pad, 0)))
            values.append(torch.nn.functional.pad(v, (0, 0, pad, 0)))
        batch.update(torch.cat(keys), torch.cat(values), layer)
    mask = (torch.arange(width)[None] >= torch.tensor([width - n for n in lengths])[:, None]).long()
    return batch, mask


TALKER_PROMPTS = {
    "text": user(text("Hello, how are you?")),
    "audio": user({"type": "audio", "audio": clip(440)}, text("What is said?")),
    "image": user({"type": "image", "image": picture(0)}, text("Describe it.")),
    "ends by eos": user(text("leaf morning hill")),  # the tiny thinker says <|im_end|> at its 29th token
}
"""Prompts whose answers the talker tests voice."""
