"""How one request picks its next token: OpenAI's sampling knobs as a llama.cpp sampler chain.

The chain applies, in order: ``logit_bias`` (added to the logits, OpenAI's meaning: -100 bans a
token, +100 forces it), the penalties (``frequency_penalty`` × how often a token was generated so
far + ``presence_penalty`` if it was, subtracted from its logit; ``repeat_penalty`` divides a
generated token's positive logit), a ``grammar`` (GBNF, rule ``root``: only tokens it accepts, and the
end-of-turn token only once it is complete), then either the most likely token (``temperature == 0``) or
``temperature``, ``top_p`` and a draw from the request's own generator (seeded with ``seed``).

Only generated tokens count for the penalties (the chain accepts each token it samples, not the
prompt's).  A chain belongs to one request; :meth:`TokenSampler.close` frees it.
"""

from __future__ import annotations

import ctypes
from typing import Any

import attrs


@attrs.frozen
class Sampling:
    """One request's knobs (OpenAI's names and ranges; the defaults change nothing)."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repeat_penalty: float = 1.0
    logit_bias: dict[int, float] = attrs.field(factory=dict)
    grammar: str | None = None

    def check(self, n_vocab: int) -> str | None:
        """What is wrong with these knobs for a vocabulary of ``n_vocab`` tokens, or None."""
        if self.temperature < 0:
            return f"temperature={self.temperature} must be >= 0"
        if not 0 < self.top_p <= 1:
            return f"top_p={self.top_p} must be in (0, 1]"
        if self.repeat_penalty <= 0:
            return f"repeat_penalty={self.repeat_penalty} must be > 0"
        bad = [t for t in self.logit_bias if not 0 <= t < n_vocab]
        if bad:
            return f"logit_bias: token id {bad[0]} is not in the vocabulary [0, {n_vocab})"
        return None


class TokenSampler:
    """A llama.cpp sampler chain for one request (see the module docstring)."""

    def __init__(self, llama: Any, vocab: Any, sampling: Sampling, *, window: int, seed: int) -> None:
        """A chain for ``vocab`` (a ``llama_vocab`` pointer); a grammar llama.cpp cannot parse is a ``ValueError``."""
        self._llama = llama
        n_vocab = llama.llama_vocab_n_tokens(vocab)
        chain = llama.llama_sampler_chain_init(llama.llama_sampler_chain_default_params())
        self._chain = chain
        if sampling.logit_bias:
            biases = (llama.llama_logit_bias * len(sampling.logit_bias))()
            for i, (token, bias) in enumerate(sampling.logit_bias.items()):
                biases[i].token, biases[i].bias = token, bias
            llama.llama_sampler_chain_add(
                chain, llama.llama_sampler_init_logit_bias(n_vocab, len(sampling.logit_bias), biases)
            )
        if sampling.frequency_penalty or sampling.presence_penalty or sampling.repeat_penalty != 1.0:
            penalties = llama.llama_sampler_init_penalties(
                n_vocab, window, sampling.repeat_penalty, sampling.frequency_penalty, sampling.presence_penalty
            )
            llama.llama_sampler_chain_add(chain, penalties)
        if sampling.grammar is not None:
            grammar = llama.llama_sampler_init_grammar(vocab, sampling.grammar.encode(), b"root")
            if not grammar:
                self.close()
                raise ValueError("grammar: llama.cpp cannot parse it")
            llama.llama_sampler_chain_add(chain, grammar)
        if sampling.temperature == 0:
            llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_greedy())
        else:
            llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_temp(sampling.temperature))
            if sampling.top_p < 1:
                llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_top_p(sampling.top_p, 1))
            draw = seed if sampling.seed is None else sampling.seed
            llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_dist(ctypes.c_uint32(draw).value))

    def sample(self, ctx: Any, row: int) -> int:
        """The token picked from output row ``row`` of the last decode (and counted for the penalties)."""
        return int(self._llama.llama_sampler_sample(self._chain, ctx, row))

    def close(self) -> None:
        if self._chain is not None:
            self._llama.llama_sampler_free(self._chain)
            self._chain = None
