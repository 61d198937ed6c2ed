"""Keeps docker-compose.yml honest where docker cannot run: its fusefleet services' exact commands and
environments are run here against a test Redis, and a request submitted through that api must succeed.

Only what is host-specific is replaced: the Redis address (the compose ``redis`` service), the folders of the
model cache and LoRA volumes, and the api's published port (a free one). Everything else is taken as written.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.processes import REPO_ROOT, Service, wait_for
from tests.support.redis_server import RedisServer, free_port

COMPOSE = REPO_ROOT / "docker-compose.yml"
FUSEFLEET_SERVICES = ("api", "scheduler", "gpu-worker")
_INTERPOLATION = re.compile(r"\$\{(?P<name>\w+)(?::-(?P<default>[^}]*))?\}")


def compose() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE.read_text()))


def interpolate(value: object) -> str:
    """Compose's ${NAME:-default} with an empty environment: the defaults the file ships with."""
    return _INTERPOLATION.sub(lambda m: m.group("default") or "", str(value))


def service_env(service: dict[str, Any]) -> dict[str, str]:
    return {name: interpolate(value) for name, value in (service.get("environment") or {}).items()}


def local_argv(command: list[str], port: int) -> list[str]:
    """The service's exec-form command, with the venv's console script and a free port for the api."""
    assert isinstance(command, list), "use exec form so SIGTERM reaches the process"
    script = shutil.which(command[0], path=str(Path(sys.executable).parent)) or command[0]
    argv = [script, *command[1:]]
    if "--port" in argv:
        argv[argv.index("--port") + 1] = str(port)
    return argv


def test_compose_file_keeps_its_promises() -> None:
    services = compose()["services"]
    redis_cmd = services["redis"]["command"]
    assert "--appendonly" in redis_cmd and "everysec" in redis_cmd and "noeviction" in redis_cmd
    assert services["redis"]["healthcheck"] and services["redis"]["volumes"]
    assert services["api"]["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "/healthz" in " ".join(services["api"]["healthcheck"]["test"])
    assert services["scheduler"]["deploy"]["replicas"] == 2
    worker = services["gpu-worker"]
    assert worker["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 1
    assert "container_name" not in worker, "a fixed name prevents --scale"
    grace_minutes = int(str(worker["stop_grace_period"]).rstrip("m"))
    time_limit = int(service_env(worker)["FUSEFLEET_BATCH_TIME_LIMIT_S"])
    assert grace_minutes * 60 > time_limit, "stop_grace_period must outlast the longest batch"
    assert services["flower"]["profiles"] == ["monitoring"]
    env_example = (REPO_ROOT / ".env.example").read_text()
    for name in FUSEFLEET_SERVICES:
        for variable in service_env(services[name]):
            if variable.startswith("FUSEFLEET_"):
                assert f"# {variable}=" in env_example, f"{variable} missing from .env.example"


@pytest.mark.timeout(300)
def test_compose_commands_serve_a_request(
    redis_server: RedisServer, model_cache: Path, lora_dir: Path, tmp_path: Path
) -> None:
    services = compose()["services"]
    port = free_port()
    prefix = f"ff-compose-{uuid.uuid4().hex[:8]}"
    host_specific = {
        "FUSEFLEET_REDIS_URL": redis_server.url,
        "FUSEFLEET_MODEL_CACHE_DIR": str(model_cache),
        "FUSEFLEET_LORA_DIR": str(lora_dir),
        "HF_HOME": str(tmp_path / "hf"),
        "FUSEFLEET_KEY_PREFIX": prefix,  # isolates this test's keys in the shared test server
        "FUSEFLEET_QUEUE_NAME": f"{prefix}.batches",
    }
    clean_env = {k: v for k, v in os.environ.items() if not k.startswith("FUSEFLEET_")}
    processes = []
    for name in FUSEFLEET_SERVICES:
        env = {**clean_env, **service_env(services[name]), **host_specific}
        assert env["FUSEFLEET_REDIS_URL"] == redis_server.url
        argv = local_argv(services[name]["command"], port)
        processes.append(Service(name, argv, env, tmp_path, inherit_env=False))
    try:
        for service in processes:
            service.start()
        base = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            try:
                return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(healthy, 60, f"the compose api (logs in {tmp_path})")
        rid = httpx.post(f"{base}/v1/requests", json={"prompt": "from compose"}, timeout=10).json()["id"]

        def finished() -> dict[str, Any] | None:
            state = dict(httpx.get(f"{base}/v1/requests/{rid}", timeout=10).json())
            return state if state["status"] in ("succeeded", "failed", "aborted") else None

        state = wait_for(finished, 180, f"the request to finish (logs in {tmp_path})")
        assert isinstance(state, dict) and state["status"] == "succeeded", state
        assert httpx.get(f"{base}/v1/requests/{rid}/images/0", timeout=10).headers["content-type"] == "image/png"
    finally:
        for service in processes:
            service.stop()
