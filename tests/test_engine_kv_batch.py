"""The engine's KV batch: stepping any subset of rows equals stepping each row alone, on a transformers model."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from schedulers.engine.kv_batch import KVBatch

PROMPTS = {"a": [5, 9, 2], "b": [7, 1, 4, 4, 8, 3], "c": [11], "d": [2, 3, 5, 7, 11, 13, 17, 19]}


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, attn_implementation="sdpa",
    )  # fmt: skip
    return LlamaForCausalLM(config).to(torch.float64).eval()


class Alone:
    """Each request decoded by itself with transformers' own cache: the reference."""

    def __init__(self, model: LlamaForCausalLM) -> None:
        self.model = model
        self.caches: dict[str, DynamicCache] = {}

    def prefill(self, rid: str, ids: list[int]) -> torch.Tensor:
        self.caches[rid] = DynamicCache(config=self.model.config)
        return self.forward(rid, ids)

    def forward(self, rid: str, ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            out = self.model(torch.tensor([ids]), past_key_values=self.caches[rid], use_cache=True)
        return out.logits[0, -1]


def batch_prefill(model: LlamaForCausalLM, kv: KVBatch, rid: str, ids: list[int], *, in_place: bool) -> torch.Tensor:
    """Prefill into the batch: in place into an empty row, or batch-1 into transformers' cache, then copied in."""
    with torch.inference_mode():
        if in_place:
            kv.add(rid)
            step = kv.step([rid], tokens=len(ids))
            out = model(torch.tensor([ids]), past_key_values=step.cache, attention_mask=step.attention_mask())
        else:
            cache = DynamicCache(config=model.config)
            out = model(torch.tensor([ids]), past_key_values=cache, use_cache=True)
            kv.add(rid, cache)
    return out.logits[0, -1]


def batch_decode(model: LlamaForCausalLM, kv: KVBatch, tokens: dict[str, int]) -> dict[str, torch.Tensor]:
    rids = list(tokens)
    step = kv.step(rids)
    positions = torch.tensor(step.lengths).unsqueeze(1)
    with torch.inference_mode():
        out = model(
            torch.tensor([[tokens[r]] for r in rids]),
            past_key_values=step.cache,
            attention_mask=step.padding_mask(),
            position_ids=positions,
        )
    return {rid: out.logits[i, -1] for i, rid in enumerate(rids)}


def test_any_subset_of_rows_steps_as_each_row_alone(model: LlamaForCausalLM) -> None:
    alone, kv = Alone(model), KVBatch(model.config.num_hidden_layers)
    last: dict[str, int] = {}
    for i, (rid, ids) in enumerate(PROMPTS.items()):
        want = alone.prefill(rid, ids)
        got = batch_prefill(model, kv, rid, ids, in_place=i % 2 == 0)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
        last[rid] = int(want.argmax())
    subsets = [["a", "b", "c", "d"], ["b", "c"], ["a", "c", "d"], ["d", "a"], ["c"], ["a", "b", "c", "d"], ["b", "d"]]
    for subset in subsets:
        got = batch_decode(model, kv, {rid: last[rid] for rid in subset})
        for rid in subset:
            want = alone.forward(rid, [last[rid]])
            torch.testing.assert_close(got[rid], want, rtol=0, atol=1e-12)
            last[rid] = int(want.argmax())
    assert kv.lengths == [alone.caches[rid].get_seq_length() for rid in kv.rows]


def test_rows_of_one_length_step_without_a_mask_as_each_row_alone(model: LlamaForCausalLM) -> None:
    alone, kv = Alone(model), KVBatch(model.config.num_hidden_layers)
    prompts = {"x": PROMPTS["a"], "y": [9, 9, 1], "z": PROMPTS["b"]}
    last = {rid: int(batch_prefill(model, kv, rid, ids, in_place=True).argmax()) for rid, ids in prompts.items()}
    for rid, ids in prompts.items():
        alone.prefill(rid, ids)
    step = kv.step(["x", "y"])
    assert step.padding_mask() is None  # one length: nothing to mask
    with torch.inference_mode():
        out = model(torch.tensor([[last["x"]], [last["y"]]]), past_key_values=step.cache, attention_mask=None)
    for i, rid in enumerate(("x", "y")):
        torch.testing.assert_close(out.logits[i, -1], alone.forward(rid, [last[rid]]), rtol=0, atol=1e-12)
    assert kv.step(["x", "z"]).padding_mask() is not None


def test_rows_join_and_leave_between_steps_without_changing_the_others(model: LlamaForCausalLM) -> None:
    alone, kv = Alone(model), KVBatch(model.config.num_hidden_layers)
    last: dict[str, int] = {}

    def join(rid: str) -> None:
        alone.prefill(rid, PROMPTS[rid])
        last[rid] = int(batch_prefill(model, kv, rid, PROMPTS[rid], in_place=True).argmax())

    def everyone_steps() -> None:
        got = batch_decode(model, kv, {rid: last[rid] for rid in kv.rows})
        for rid, logits in got.items():
            torch.testing.assert_close(logits, alone.forward(rid, [last[rid]]), rtol=0, atol=1e-12)
            last[rid] = int(logits.argmax())

    for rid in "abc":
        join(rid)
    everyone_steps()
    assert kv.remove("a") and not kv.remove("a")
    assert kv.rows == ["c", "b"]  # the last row moved into the gap
    everyone_steps()
    join("d")
    everyone_steps()
    for rid in kv.rows:
        kv.remove(rid)
    assert len(kv) == 0 and kv.nbytes() == 0


def test_rows_that_sit_out_are_neither_read_nor_copied(model: LlamaForCausalLM) -> None:
    kv = KVBatch(model.config.num_hidden_layers)
    for rid in "abcd":
        batch_prefill(model, kv, rid, PROMPTS[rid], in_place=True)
    storage = kv._layers[0].data
    assert storage is not None
    new = torch.ones(2, 2, 1, 8, dtype=torch.float64)
    with torch.inference_mode():
        before = storage.clone()
        step = kv.step(kv.order(["c", "a"]))  # rows 0 and 2: gathered, rows 1 and 3 sit out
        keys, _ = step.cache.update(new, new, 0)
        assert keys.shape == (2, 2, max(len(PROMPTS["a"]), len(PROMPTS["c"])) + 1, 8)
        assert keys.untyped_storage().data_ptr() != storage.untyped_storage().data_ptr()
        assert torch.equal(storage[:, 1], before[:, 1]) and torch.equal(storage[:, 3], before[:, 3])
        step = kv.step(["b", "c"])  # rows 1 and 2: a contiguous range is read in place
        keys, _ = step.cache.update(new, new, 0)
        assert keys.untyped_storage().data_ptr() == storage.untyped_storage().data_ptr()
        assert torch.equal(storage[:, 3], before[:, 3])


def test_a_multi_token_step_needs_rows_of_one_length(model: LlamaForCausalLM) -> None:
    kv = KVBatch(model.config.num_hidden_layers)
    for rid in "ab":
        batch_prefill(model, kv, rid, PROMPTS[rid], in_place=False)
    with pytest.raises(ValueError, match="one length"):
        kv.step(["a", "b"], tokens=2)
    with pytest.raises(ValueError, match="has no row"):
        kv.step(["zz"])
    with pytest.raises(ValueError, match="already has a row"):
        kv.add("a")
