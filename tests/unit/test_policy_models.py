"""The batching policy reads a model's own engine args (``model_batching``): its batch size and its wait."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.policy import Dispatch, PolicyConfig, Wait, WaitingRequest, decide
from shared.settings import Settings


@dataclass(frozen=True)
class Key:
    model: str


SETTINGS = Settings(
    models={"sd": "demo:stable-diffusion", "px": "demo:pixart"},
    max_num_seqs=4,
    request_batch_max_wait_ms=100.0,
    model_batching={"px": {"max_num_seqs": 2, "request_batch_max_wait_ms": 0.0}},
)


def _waiting(model: str, count: int) -> list[WaitingRequest]:
    return [WaitingRequest(f"{model}{i}", Key(model), arrived_at=0.0) for i in range(count)]


def test_each_model_batches_by_its_own_max_num_seqs_and_wait() -> None:
    config = PolicyConfig.from_settings(SETTINGS)
    assert config.widest == 4
    px = decide(_waiting("px", 3), free_slots=1, now=0.0, config=config)
    assert isinstance(px, Dispatch) and px.request_ids == ("px0", "px1")  # its cap 2, full at once
    one = decide(_waiting("px", 1), free_slots=1, now=0.0, config=config)
    assert isinstance(one, Dispatch)  # its wait is 0: no admission wait
    sd = decide(_waiting("sd", 3), free_slots=1, now=0.0, config=config)
    assert isinstance(sd, Wait) and sd.until is not None  # the fleet's: room for 4, waits for more
    full = decide(_waiting("sd", 5), free_slots=1, now=0.0, config=config)
    assert isinstance(full, Dispatch) and len(full.request_ids) == 4


def test_a_fleet_without_model_batching_has_one_config() -> None:
    config = PolicyConfig.from_settings(Settings(max_num_seqs=3))
    assert config.by_model == {} and config.of(_waiting("demo", 1)[0]) is config and config.widest == 3
