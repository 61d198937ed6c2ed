"""The fair order (pure): deficit round robin over flows (model, API key) inside the priority levels."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.queue import QUEUES, FairQueue, FcfsQueue, PriorityQueue, QueuedRequest, queue_of
from shared.settings import Settings
from tests.unit.test_queue import fill, ids


@dataclass(frozen=True)
class Key:
    model: str


def queued(
    id: str, owner: str = "", model: str = "m", priority: int = 0, deadline: float | None = None
) -> QueuedRequest:
    return QueuedRequest(
        id=id,
        entry_id=f"e-{id}",
        key=Key(model),
        arrived_at=0.0,
        priority=priority,
        deadline=deadline,
        owner=owner,
    )


def test_the_settings_name_the_fair_queue() -> None:
    queue = QUEUES[Settings(scheduling_policy="fair").scheduling_policy]()
    assert isinstance(queue, FairQueue) and isinstance(queue, PriorityQueue)


def test_one_flow_is_fifo() -> None:
    queue = fill(FairQueue(), *(queued(f"r{i}", "a") for i in range(6)))
    assert ids(queue) == [f"r{i}" for i in range(6)]


def test_a_flood_does_not_hold_back_another_key() -> None:
    queue = fill(FairQueue(), *(queued(f"a{i}", "a") for i in range(5)), queued("b0", "b"), queued("b1", "b"))
    assert ids(queue) == ["a0", "b0", "a1", "b1", "a2", "a3", "a4"]
    # the same requests under the priority order: the flood first
    assert ids(fill(PriorityQueue(), *(queued(r.id, r.owner) for r in queue.head(100)))) == ids(queue)
    assert ids(fill(PriorityQueue(), *(queued(f"a{i}", "a") for i in range(5)), queued("b0", "b")))[-1] == "b0"


def test_flows_are_models_too() -> None:
    queue = fill(FairQueue(), *(queued(f"x{i}", model="x") for i in range(3)), queued("y0", model="y"))
    assert ids(queue) == ["x0", "y0", "x1", "x2"]


def test_flows_interleave_by_their_weights() -> None:
    shares = {"a": 2.0, "b": 1.0}
    queue = fill(
        FairQueue(lambda model, owner: shares[owner]),
        *(queued(f"a{i}", "a") for i in range(6)),
        *(queued(f"b{i}", "b") for i in range(3)),
    )
    assert ids(queue) == ["a0", "b0", "a1", "a2", "b1", "a3", "a4", "b2", "a5"]


def test_priorities_stay_strict() -> None:
    queue = fill(
        FairQueue(),
        *(queued(f"a{i}", "a", priority=1) for i in range(3)),
        queued("b0", "b"),
        queued("h", "b", priority=2),
    )
    assert ids(queue) == ["h", "a0", "a1", "a2", "b0"]


def test_requeued_requests_go_first_by_arrival() -> None:
    queue = fill(FairQueue(), queued("a0", "a"), queued("b0", "b"))
    late = QueuedRequest(id="r1", entry_id="e-r1", key=Key("m"), arrived_at=0.0, owner="a", arrival=(5, 0))
    early = QueuedRequest(id="r0", entry_id="e-r0", key=Key("m"), arrived_at=0.0, owner="b", arrival=(1, 0))
    queue.add(late, front=True)
    queue.add(early, front=True)
    assert ids(queue) == ["r0", "r1", "a0", "b0"]
    queue.remove("r0")
    assert ids(queue) == ["r1", "a0", "b0"]


def test_an_idle_flow_banks_no_credit() -> None:
    queue = fill(FairQueue(), *(queued(f"a{i}", "a") for i in range(4)))
    for served in ("a0", "a1", "a2"):  # b is idle meanwhile: it gets no lead for those rounds
        queue.remove(served)
    fill(queue, *(queued(f"b{i}", "b") for i in range(3)))
    assert ids(queue) == ["b0", "a3", "b1", "b2"]


def test_a_flow_that_empties_starts_again_at_the_current_round() -> None:
    queue = fill(FairQueue(), *(queued(f"a{i}", "a") for i in range(4)), queued("b0", "b"))
    queue.remove("a0")
    queue.remove("b0")  # b leaves (served): its state goes
    queue.remove("a1")
    fill(queue, queued("b1", "b"), queued("b2", "b"))
    assert ids(queue) == ["b1", "a2", "b2", "a3"]  # b joins at the round served last


def test_aborting_a_far_request_does_not_move_the_round() -> None:
    shares = {"slow": 0.01, "a": 1.0, "b": 1.0}
    queue = fill(
        FairQueue(lambda model, owner: shares[owner]),
        queued("s0", "slow"),
        queued("s1", "slow"),  # stamped 100 rounds ahead
        *(queued(f"a{i}", "a") for i in range(3)),
    )
    queue.remove("s0")  # served
    queue.remove("s1")  # aborted far ahead: the round stays
    fill(queue, queued("b0", "b"), queued("b1", "b"), queued("b2", "b"))
    assert ids(queue) == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_deadlines_still_expire() -> None:
    queue = fill(
        FairQueue(),
        queued("a0", "a", deadline=5.0),
        queued("a1", "a"),
        queued("b0", "b", deadline=3.0),
        queued("b1", "b", deadline=9.0),
    )
    assert queue.next_deadline() == 3.0
    assert [r.id for r in queue.pop_expired(6.0)] == ["b0", "a0"]
    assert ids(queue) == ["a1", "b1"]
    assert queue.next_deadline() == 9.0 and len(queue) == 2


def test_replacing_and_clearing() -> None:
    queue = fill(FairQueue(), queued("a0", "a"), queued("a1", "a"), queued("b0", "b"))
    queue.add(queued("a0", "a"))  # added again: replaced, behind a1
    assert ids(queue) == ["b0", "a1", "a0"]
    queue.clear()
    assert ids(queue) == [] and len(queue) == 0
    fill(queue, queued("b1", "b"), queued("a2", "a"))
    assert ids(queue) == ["b1", "a2"]


def test_the_head_window_is_a_prefix_of_the_service_order() -> None:
    queue = fill(FairQueue(), *(queued(f"{o}{i}", o) for i in range(20) for o in "abc"))
    order = ids(queue, 1000)
    assert ids(queue, 7) == order[:7] and len(order) == 60


def test_the_settings_weigh_each_model_by_its_share() -> None:
    settings = Settings(scheduling_policy="fair", model_batching={"demo": {"share": 3.0}})
    queue = queue_of(settings)
    assert isinstance(queue, FairQueue)
    fill(queue, *(queued(f"d{i}", model="demo") for i in range(4)), *(queued(f"o{i}", model="other") for i in range(2)))
    assert ids(queue) == ["d0", "o0", "d1", "d2", "d3", "o1"]
    assert isinstance(queue_of(Settings(scheduling_policy="fcfs")), FcfsQueue)


def test_a_keys_share_weighs_its_requests() -> None:
    heavy = [
        QueuedRequest(id=f"a{i}", entry_id=f"e-a{i}", key=Key("m"), arrived_at=0.0, owner="a", share=2.0)
        for i in range(4)
    ]
    queue = fill(FairQueue(), *heavy, *(queued(f"b{i}", "b") for i in range(2)))
    assert ids(queue) == ["a0", "b0", "a1", "a2", "b1", "a3"]
