"""Fleet metrics and JSON logs on a real fleet (real Redis, api, scheduler and a worker with the tiny demo model):
after a known workload one scrape of the api's ``/metrics`` shows exact counts for the whole fleet, ``fusefleet
status`` shows the same, and every log line of every service is JSON naming the batch and worker it concerns."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Fleet, running_fleet
from tests.support import prometheus
from tests.support.processes import REPO_ROOT, wait_for
from tests.support.redis_server import RedisServer
from tests.support.runners import EXPLODE_MARKER


@pytest.fixture(scope="module")
def fleet(
    redis_server: RedisServer, model_cache: Path, lora_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    logs = tmp_path_factory.mktemp("metrics-fleet-logs")
    with running_fleet(redis_server, model_cache, lora_dir, logs, FUSEFLEET_LOG_FORMAT="json") as one:
        yield one


def scrape(fleet: Fleet) -> dict[str, float]:
    response = fleet.http.get("/metrics")
    assert response.status_code == 200, response.text
    return prometheus.samples(response.text)


@pytest.fixture(scope="module")
def workload(fleet: Fleet) -> dict[str, Any]:
    """A known workload: a long request aborted while running, one aborted while queued behind it, then four
    submitted together: three fused into one batch, and one (other steps: another batch) whose forward raises; and
    one request refused (422)."""
    seen: dict[str, Any] = {}
    long = fleet.submit(prompt="long", num_inference_steps=900)
    fleet.wait_running(long, min_step=1)
    queued = fleet.submit(prompt="behind it")  # the only slot is busy: it waits in the stream
    wait_for(lambda: scrape(fleet)["fusefleet_queue_depth"] == 1, 10, "the second request to wait in the queue")
    seen["busy"] = scrape(fleet)
    assert fleet.http.post(f"/v1/requests/{queued}/abort").json()["status"] == "aborted"
    assert fleet.http.post(f"/v1/requests/{long}/abort").status_code == 200
    assert fleet.wait_done([long, queued])[long]["status"] == "aborted"
    fused = [{"prompt": p, "width": 64, "height": 64, "num_inference_steps": 4} for p in ("a fox", "a whale", "a frog")]
    exploding = {"prompt": f"please {EXPLODE_MARKER}", "width": 64, "height": 64, "num_inference_steps": 3}
    *ids, culprit = fleet.submit_batch([*fused, exploding])
    seen["batch"] = fleet.wait_done(ids)
    seen["culprit"] = fleet.wait_done([culprit])[culprit]
    seen["ids"] = ids
    assert fleet.http.post("/v1/requests", json={"prompt": "too wide", "width": 100_000}).status_code == 422
    seen["after"] = scrape(fleet)
    return seen


def test_while_busy_the_queue_and_slots_show_it(workload: dict[str, Any]) -> None:
    busy = workload["busy"]
    assert busy["fusefleet_up"] == 1
    assert busy["fusefleet_queue_depth"] == 1 and 0 < busy["fusefleet_oldest_waiting_seconds"] < 30
    assert busy["fusefleet_workers_live"] == 1 and busy["fusefleet_worker_slots_busy"] == 1
    assert busy["fusefleet_batches_in_flight"] == 1


def test_metrics_after_a_known_workload(workload: dict[str, Any]) -> None:
    states = workload["batch"]
    assert [state["status"] for state in states.values()] == ["succeeded"] * 3
    assert len({state["batch_id"] for state in states.values()}) == 1  # one fused batch of three
    assert workload["culprit"]["status"] == "failed" and workload["culprit"]["batch_size"] == 1
    after = workload["after"]
    assert after["fusefleet_requests_accepted_total"] == 6
    assert after["fusefleet_api_requests_submitted_total"] == 6
    assert after["fusefleet_api_requests_refused_total{reason=invalid}"] == 1
    for status, count in {"succeeded": 3, "failed": 1, "aborted": 2}.items():
        assert after[f"fusefleet_requests_finished_total{{status={status}}}"] == count, status
    assert after["fusefleet_request_failures_total{type=ValueError}"] == 1  # what the exploding runner raises
    assert [name for name in after if name.startswith("fusefleet_request_failures_total")] == [
        "fusefleet_request_failures_total{type=ValueError}"
    ]
    for stage, count in {"queued": 1, "scheduled": 0, "running": 1}.items():
        assert after[f"fusefleet_aborts_total{{stage={stage}}}"] == count, stage
    # batches: the long request alone, the three, the culprit alone (the aborted queued one never joined one)
    assert after["fusefleet_batch_size_count"] == 3 and after["fusefleet_batch_size_sum"] == 5
    assert after["fusefleet_batch_size_bucket{le=1.0}"] == 2
    assert after["fusefleet_batch_size_bucket{le=2.0}"] == 2
    assert after["fusefleet_batch_size_bucket{le=3.0}"] == 3
    assert after["fusefleet_batch_size_bucket{le=+Inf}"] == 3
    assert after["fusefleet_admission_wait_seconds_count"] == 5
    assert after["fusefleet_admission_wait_seconds_bucket{le=+Inf}"] == 5
    assert 0 < after["fusefleet_admission_wait_seconds_sum"] < 30
    assert after["fusefleet_queue_depth"] == 0 and after["fusefleet_worker_slots_busy"] == 0


def test_worker_metrics_after_a_known_workload(fleet: Fleet, workload: dict[str, Any]) -> None:
    def written() -> dict[str, float] | None:
        samples = scrape(fleet)
        return samples if samples["fusefleet_images_total"] >= 3 else None

    samples = wait_for(written, 2, "the worker's metrics")
    assert isinstance(samples, dict)
    assert samples["fusefleet_forward_seconds_count{batch_size=3}"] == 1  # the fused three (the culprit raised)
    assert samples["fusefleet_step_seconds_count"] >= 1
    assert "throughput: 0.00 images/s" not in status_text(fleet)


def status_text(fleet: Fleet) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "fusefleet", "status"],
        env={**fleet.env, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def test_fusefleet_status_shows_the_same(fleet: Fleet, workload: dict[str, Any]) -> None:
    text = status_text(fleet)
    assert "queue: 0 waiting" in text
    assert "requests: 6 accepted; 2 aborted, 1 failed, 3 succeeded" in text
    assert "failures: ValueError 1" in text
    assert "images/s over the last 60 s" in text
    node = fleet.workers[0].env["FUSEFLEET_WORKER_NAME"]
    assert f"{node}: live, idle" in text


def json_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a service's log, parsed: each must be one JSON object."""
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            out.append(json.loads(line))
        except ValueError:
            pytest.fail(f"{path.name}:{number} is not JSON: {line!r}")
    return out


def test_every_log_line_is_json_naming_its_batch_and_worker(fleet: Fleet, workload: dict[str, Any]) -> None:
    batch_id = next(iter(workload["batch"].values()))["batch_id"]
    node = fleet.workers[0].env["FUSEFLEET_WORKER_NAME"]
    scheduler = json_lines(fleet.scheduler.log_path)
    published = [line for line in scheduler if line.get("batch_id") == batch_id]
    assert published and published[0]["message"].startswith(f"published batch {batch_id}")
    assert sorted(published[0]["request_ids"]) == sorted(workload["ids"])
    assert {line["service"] for line in scheduler} == {"scheduler"}
    worker = json_lines(fleet.workers[0].log_path)
    assert {line["service"] for line in worker} == {"worker"}
    assert all(line["worker"] == node for line in worker if "batch_id" in line)
    about_the_batch = [line for line in worker if line.get("batch_id") == batch_id]
    assert any(line["message"].endswith(f"[{batch_id}] received") for line in about_the_batch), about_the_batch
    culprit = workload["culprit"]
    about_the_culprit = [line for line in worker if line.get("batch_id") == culprit["batch_id"]]
    assert any(f"request {culprit['id']} failed: ValueError" in line["message"] for line in about_the_culprit)
    api = json_lines(fleet.api.log_path)
    assert api and {line["service"] for line in api} == {"api"}
    for line in scheduler + worker + api:
        assert {"time", "level", "logger", "message"} <= set(line), line
