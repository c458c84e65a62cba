"""FairQueue: per-request order kept, requests served one message per round."""

from __future__ import annotations

from omnitrio.fairqueue import FairQueue


def filled(**items: int) -> FairQueue[str]:
    queue: FairQueue[str] = FairQueue()
    for key, n in items.items():
        for i in range(n):
            queue.put(key, f"{key}{i}")
    return queue


def test_one_key_comes_out_in_order() -> None:
    queue = filled(a=4)
    assert queue.take() == ["a0", "a1", "a2", "a3"] and len(queue) == 0


def test_keys_take_turns_one_item_per_round_oldest_key_first() -> None:
    queue = filled(hog=5, late=2)
    assert queue.take(6) == ["hog0", "late0", "hog1", "late1", "hog2", "hog3"]
    assert queue.take() == ["hog4"] and len(queue) == 0


def test_a_new_key_is_served_in_the_next_round_whatever_the_others_hold() -> None:
    queue = filled(hog=1000)
    queue.take(10)
    queue.put("late", "late0")
    assert queue.take(2) == ["hog10", "late0"]


def test_small_takes_still_reach_every_key_in_turn() -> None:
    queue = filled(a=100, b=100, c=100, d=100)
    served = [item[0] for _ in range(8) for item in queue.take(1)]
    assert served == ["a", "b", "c", "d", "a", "b", "c", "d"]
    queue.put("e", "e0")  # a newcomer waits for one round at most
    assert [item[0] for item in queue.take(5)] == ["a", "b", "c", "d", "e"]


def test_drop_forgets_only_that_key() -> None:
    queue = filled(a=3, b=2)
    assert queue.drop("a") == 3 and queue.drop("missing") == 0
    assert len(queue) == 2 and queue.take() == ["b0", "b1"]


def test_take_zero_or_from_empty_gives_nothing() -> None:
    queue = filled(a=2)
    assert queue.take(0) == [] and len(queue) == 2
    assert FairQueue[str]().take() == []
