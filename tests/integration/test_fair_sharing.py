"""The fair order on a real fleet (real Redis, api, scheduler and worker with the tiny demo model): with
``scheduling_policy = fair`` a key that floods the queue does not hold back another key's requests (under fcfs they
would wait behind the whole flood)."""

from __future__ import annotations

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
