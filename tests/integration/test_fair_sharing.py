"""The fair order on a real fleet (real Redis, api, scheduler and worker with the tiny demo model): with
``scheduling_policy = fair`` a key that floods the queue does not hold back another key's requests (under fcfs they
would wait behind the whole flood)."""

from __future__ import annotations

import time
from pathlib import Path

from shared.api_keys import ApiKey, key_table, token_hash
from tests.integration.conftest import running_fleet
from tests.integration.test_api_keys import SMALL, auth, ended
from tests.support.redis_server import RedisServer

FLOOD = 30


def test_a_flooding_key_does_not_hold_back_another(
    redis_server: RedisServer, model_cache: Path, lora_dir: Path, tmp_path: Path
) -> None:
    keys_file = tmp_path / "keys.toml"
    keys = [ApiKey(name="alice", sha256=token_hash("ff_alice")), ApiKey(name="bob", sha256=token_hash("ff_bob"))]
    keys_file.write_text("".join(key_table(key) for key in keys))
    env = {"FUSEFLEET_API_KEYS_FILE": str(keys_file), "FUSEFLEET_SCHEDULING_POLICY": "fair"}
    with running_fleet(redis_server, model_cache, lora_dir, tmp_path, **env) as fleet:
        flood = [{"prompt": f"flood {i}", **SMALL} for i in range(FLOOD)]
        sent = fleet.http.post("/v1/requests/batch", json={"requests": flood}, headers=auth("alice"))
        assert sent.status_code == 202, sent.text
        floods = sent.json()["ids"]
        bobs = []
        for i in range(3):
            one = fleet.http.post("/v1/requests", json={"prompt": f"bob {i}", **SMALL}, headers=auth("bob"))
            assert one.status_code == 202, one.text
            bobs.append(one.json()["id"])
        for request_id in bobs:
            assert ended(fleet, request_id, "bob")["status"] == "succeeded"
        # bob's last request ended while most of the flood still waited: it was not served behind it
        statuses = [fleet.http.get(f"/v1/requests/{rid}", headers=auth("alice")).json()["status"] for rid in floods]
        assert statuses.count("queued") >= FLOOD // 2, statuses


LONG_STEPS = 60  # 12x the probe's steps: the flood's running requests still run when it ends, however slow a step is


def test_in_step_mode_a_flooded_key_swaps_into_a_full_set_and_does_not_wait_for_it_to_end(
    redis_server: RedisServer, model_cache: Path, lora_dir: Path, tmp_path: Path
) -> None:
    """docs/step_mode.md#fair-sharing-within-a-level: alice's long requests fill the one worker's set (2 rows) and
    more wait; bob's request swaps in for one of hers at a step boundary and ends while her other one still runs;
    hers is requeued."""
    keys_file = tmp_path / "keys.toml"
    keys = [ApiKey(name="alice", sha256=token_hash("ff_alice")), ApiKey(name="bob", sha256=token_hash("ff_bob"))]
    keys_file.write_text("".join(key_table(key) for key in keys))
    env = {
        "FUSEFLEET_API_KEYS_FILE": str(keys_file),
        "FUSEFLEET_SCHEDULING_POLICY": "fair",
        "FUSEFLEET_STEP_MODE": "1",
        "FUSEFLEET_MAX_NUM_SEQS": "2",
        "FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS": "0",
    }
    with running_fleet(redis_server, model_cache, lora_dir, tmp_path, **env) as fleet:
        flood = [{"prompt": f"flood {i}", **SMALL, "num_inference_steps": LONG_STEPS} for i in range(4)]
        sent = fleet.http.post("/v1/requests/batch", json={"requests": flood}, headers=auth("alice"))
        assert sent.status_code == 202, sent.text
        floods = sent.json()["ids"]

        def step(rid: str) -> int:
            return int(fleet.redis.hget(fleet.keys.request(rid), "step") or 0)

        deadline = time.monotonic() + 60
        while sum(step(rid) >= 2 for rid in floods) < 2:  # two of hers run in the full set
            assert time.monotonic() < deadline, fleet.logs_hint()
            time.sleep(0.1)
        running = [rid for rid in floods if step(rid) >= 2]
        one = fleet.http.post("/v1/requests", json={"prompt": "bob", **SMALL}, headers=auth("bob"))
        assert one.status_code == 202, one.text
        assert ended(fleet, one.json()["id"], "bob", timeout=60)["status"] == "succeeded", fleet.logs_hint()
        statuses = {rid: fleet.redis.hget(fleet.keys.request(rid), "status") for rid in floods}
        assert "succeeded" not in statuses.values(), statuses  # bob did not wait for the set to end
        requeued = [
            rid
            for rid in running
            if any(f["event"] == "requeued" for _, f in fleet.redis.xrange(fleet.keys.request_events(rid)))
        ]
        assert len(requeued) == 1, (requeued, fleet.logs_hint())
