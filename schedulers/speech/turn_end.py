"""Semantic end of turn: at a pause, decide whether to end the turn now or wait, and how long.

OpenAI's ``semantic_vad`` judges at each pause whether what was said is a complete turn; a
complete turn ends after a short silence, an incomplete one waits up to a longer timeout for the
speaker to go on.  Two signals make the judgement, combined by one rule (:func:`judge`):

* the words (:mod:`schedulers.speech.turn_words`): a transcript ending on an article, a
  preposition, a conjunction or a filler is **not over**, whatever the audio says;
* the audio (:mod:`schedulers.speech.turn_model`, Smart Turn v3.2): otherwise the turn is
  complete when the model's probability reaches the eagerness's threshold.

So the words can only veto, and when they veto the model is not run at all.  ``eagerness``
(:func:`policy_for`) sets the threshold and three silences: a complete turn's (short), a turn the
words say is unfinished (OpenAI's maximum timeouts: 8 s, 4 s and 2 s for low, medium and high;
``auto`` is ``medium``), and, between them, a turn whose words do not object but whose audio the
model doubts: the model alone is often unsure of long utterances that are complete, so its doubt
alone never holds a turn open as long as unfinished words do.  A speaker who resumes talking
before the wait is over simply continues the turn; the next pause is judged afresh with the
longer audio and transcript.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

import attrs

from schedulers.speech.turn_words import unfinished_because

Eagerness = Literal["low", "medium", "high", "auto"]
EAGERNESS_LEVELS: tuple[Eagerness, ...] = ("low", "medium", "high", "auto")
# Silences counted from the VAD scorer's edge, which the policies and Smart Turn were tuned on: the
# model hears the turn to SCORE_AT_MS of silence (it expects a short silence after the words), and
# the turn is judged at JUDGE_AT_MS.
SCORE_AT_MS = 100
JUDGE_AT_MS = 200


class CompletionScorer(Protocol):
    """The audio model: how sure it is that the turn (16 kHz mono, newest last) is complete."""

    def probability_complete(self, audio_16k: Any) -> float: ...


@attrs.frozen
class EagernessPolicy:
    """What one eagerness level means: the audio threshold and the two silences, in ms."""

    threshold: float
    complete_silence_ms: int
    incomplete_silence_ms: int  # the words say the turn is unfinished
    doubted_silence_ms: int  # the words do not object, the model doubts the turn is over


def policy_for(eagerness: Any) -> EagernessPolicy:
    """The policy of ``"low" | "medium" | "high" | "auto"``; anything else is a ValueError naming it."""
    match eagerness:
        case "high":
            return EagernessPolicy(0.3, complete_silence_ms=200, incomplete_silence_ms=2000, doubted_silence_ms=500)
        case "medium" | "auto":
            return EagernessPolicy(0.5, complete_silence_ms=250, incomplete_silence_ms=4000, doubted_silence_ms=1000)
        case "low":
            return EagernessPolicy(0.7, complete_silence_ms=500, incomplete_silence_ms=8000, doubted_silence_ms=2000)
        case _:
            raise ValueError(f"eagerness must be one of low, medium, high, auto; got {eagerness!r}")


@attrs.frozen
class TurnJudgement:
    """Whether the turn sounds complete, from what, and the silence it needs before it ends.

    ``probability`` is None when the audio model was not consulted; ``unfinished`` is the
    words' objection (e.g. ``"ends on the article 'the'"``) or None when they had none.
    """

    complete: bool
    end_after_ms: int
    probability: float | None
    unfinished: str | None


def judge(policy: EagernessPolicy, probability: float | None, unfinished: str | None) -> TurnJudgement:
    """The combining rule: complete iff the words do not object and the audio (if heard) agrees.

    Passing ``probability=None`` judges by the words alone; ``unfinished=None`` by the audio alone.
    """
    complete = unfinished is None and (probability is None or probability >= policy.threshold)
    if complete:
        silence = policy.complete_silence_ms
    else:
        silence = policy.incomplete_silence_ms if unfinished is not None else policy.doubted_silence_ms
    return TurnJudgement(complete, silence, probability, unfinished)


@attrs.frozen
class TurnDecision:
    """End the turn now (``end``), or wait ``wait_ms`` more of silence, then end it."""

    end: bool
    wait_ms: int
    judgement: TurnJudgement


class SemanticTurnDetector:
    """Decides at a pause whether a turn is over; stateless between calls, safe to share."""

    def __init__(self, eagerness: Eagerness = "auto", *, model: CompletionScorer | None = None) -> None:
        self.policy = policy_for(eagerness)
        self.eagerness = eagerness
        if model is None:
            from schedulers.speech.turn_model import shared_turn_model

            model = shared_turn_model()
        self.model = model

    def decide(
        self, audio_16k: Any, transcript: str, silence_ms: int, *, probability: float | None = None
    ) -> TurnDecision:
        """The decision for a turn whose audio so far (16 kHz mono, its trailing silence
        included) is ``audio_16k``, whose transcript so far is ``transcript``, and which has been
        silent for ``silence_ms``.  The audio model runs only when the words do not object and
        ``probability`` (the model's answer for this turn, scored already) is not given.
        """
        if isinstance(silence_ms, bool) or not isinstance(silence_ms, int) or silence_ms < 0:
            raise ValueError(f"silence_ms must be a non-negative integer, got {silence_ms!r}")
        if not isinstance(transcript, str):
            raise ValueError(f"transcript must be a string, got {type(transcript).__name__}")
        unfinished = unfinished_because(transcript)
        if unfinished is not None:
            probability = None
        elif probability is None:
            probability = self.model.probability_complete(audio_16k)
        judgement = judge(self.policy, probability, unfinished)
        wait = max(0, judgement.end_after_ms - silence_ms)
        return TurnDecision(end=wait == 0, wait_ms=wait, judgement=judgement)
