"""The CPU engine's tiny random Llama and trained tokenizer, saved as a Hugging Face model directory.

:func:`save_tiny_llama` writes ``config.json`` (``LlamaForCausalLM``), ``model.safetensors`` and the
tokenizer files, so SGLang (or transformers) loads the very weights that
:func:`schedulers.ar.scheduler.build_tiny_engine` builds from the same arguments: a test can compare
the two engines token for token.  The model's parameters map one to one onto Llama's (same RoPE
layout: rotate-half over ``head_dim``, same RMSNorm, SwiGLU, no biases, untied head).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from schedulers.ar.model import ModelConfig, TinyLlama, build_model
from schedulers.ar.tokenizer import EOS, BPETokenizer, load_tokenizer

_NAMES = {
    "embed.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "lm_head.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.wq.weight": "self_attn.q_proj.weight",
    "attn.wk.weight": "self_attn.k_proj.weight",
    "attn.wv.weight": "self_attn.v_proj.weight",
    "attn.wo.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn.w_gate.weight": "mlp.gate_proj.weight",
    "ffn.w_up.weight": "mlp.up_proj.weight",
    "ffn.w_down.weight": "mlp.down_proj.weight",
}


def tiny_config(tokenizer: BPETokenizer, **shape: Any) -> ModelConfig:
    """The :class:`ModelConfig` ``build_tiny_engine(tokenizer, **shape)`` uses (same ``ffn_dim`` rule)."""
    dim = shape["dim"]
    return ModelConfig(vocab_size=tokenizer.vocab_size, ffn_dim=(dim * 8 // 3 + 63) // 64 * 64, **shape)


def hf_name(name: str) -> str:
    """The Llama checkpoint name of a :class:`TinyLlama` parameter."""
    if name in _NAMES:
        return _NAMES[name]
    _, index, rest = name.split(".", 2)
    return f"model.layers.{index}.{_LAYER_NAMES[rest]}"


def hf_config(config: ModelConfig, eos_token_id: int) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.dim,
        "intermediate_size": config.ffn_dim,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_seq_len,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": eos_token_id,
        "eos_token_id": eos_token_id,
        "torch_dtype": "float32",
    }


def save_tiny_llama(directory: Path, *, tokenizer_vocab_size: int = 2048, **shape: Any) -> TinyLlama:
    """Write the model ``build_tiny_engine`` builds for ``shape`` (seed, dim, ...) into ``directory``."""
    from safetensors.torch import save_file

    tokenizer = load_tokenizer(tokenizer_vocab_size)
    if not isinstance(tokenizer, BPETokenizer):
        raise RuntimeError("save_tiny_llama needs the `tokenizers` package (the byte fallback has no files)")
    config = tiny_config(tokenizer, **shape)
    model = build_model(config)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {hf_name(name): param.detach().contiguous() for name, param in model.named_parameters()}
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(hf_config(config, tokenizer.eos_token_id), indent=1))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": tokenizer.eos_token_id}))
    (directory / "tokenizer.json").write_text(tokenizer.to_json())
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS,
        "bos_token": None,
        "pad_token": EOS,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": config.max_seq_len,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))
    return model
