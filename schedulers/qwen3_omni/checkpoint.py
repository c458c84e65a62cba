# TEMPORARY dev stub (untracked) until omni-front's checkpoint.py is merged.
import torch


def load_config(model_dir):
    from transformers import Qwen3OmniMoeConfig

    return Qwen3OmniMoeConfig.from_pretrained(model_dir)


def load_weights(model_dir, prefix, module):
    from transformers import Qwen3OmniMoeForConditionalGeneration

    full = Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32)
    module.load_state_dict(full.talker.state_dict())
