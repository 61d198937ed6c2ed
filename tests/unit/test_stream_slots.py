"""The event-stream slots of an api process (``api.stream_slots``): the process's cap and each holder's, counted in
one step (concurrent takes never pass either cap), a slot given back once however often it is released."""

from __future__ import annotations

import threading

import pytest

from api.stream_slots import Slot, SlotsRefused, StreamSlots


def test_a_holder_at_its_cap_is_refused_while_another_still_gets_a_slot() -> None:
    slots = StreamSlots(total=5, per_holder=2)
    alice = [slots.take("alice"), slots.take("alice")]
    with pytest.raises(SlotsRefused) as refused:
        slots.take("alice")
    assert refused.value == SlotsRefused("alice", "max_event_streams_per_key", 2)
    bob = slots.take("bob")
    assert (slots.open, slots.held("alice"), slots.held("bob")) == (3, 2, 1)
    alice[0].release()
    alice[0].release()  # once: a second release gives nothing more back
    assert (slots.open, slots.held("alice")) == (2, 1)
    slots.take("alice")
    bob.release()
    assert (slots.open, slots.held("bob")) == (2, 0)


def test_the_process_cap_is_named_first() -> None:
    slots = StreamSlots(total=2, per_holder=2)
    slots.take("alice")
    slots.take("bob")
    with pytest.raises(SlotsRefused) as refused:
        slots.take("carol")
    assert (refused.value.limit, refused.value.cap) == ("max_event_streams", 2)


def test_concurrent_takes_never_pass_either_cap() -> None:
    slots = StreamSlots(total=30, per_holder=8)
    holders = [f"key{i}" for i in range(5)]  # 5 x 8 = 40 wanted, 30 in all
    taken: list[Slot] = []
    refused: list[SlotsRefused] = []
    start = threading.Barrier(20)
    lock = threading.Lock()

    def opener(holder: str) -> None:
        start.wait()
        for _ in range(4):
            try:
                slot = slots.take(holder)
            except SlotsRefused as exc:
                with lock:
                    refused.append(exc)
                continue
            with lock:
                taken.append(slot)

    threads = [threading.Thread(target=opener, args=(holders[i % 5],)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(taken) == 30 and len(refused) == 50  # nothing released meanwhile: no cap was ever passed
    assert all(slots.held(holder) <= 8 for holder in holders) and slots.open == 30
    for slot in taken:
        slot.release()
    assert slots.open == 0 and all(slots.held(holder) == 0 for holder in holders)
