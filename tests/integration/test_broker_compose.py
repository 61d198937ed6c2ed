"""docker-compose.yml's broker: the redis service by default, RabbitMQ with the ``rabbitmq`` profile (and
FUSEFLEET_BROKER_URL naming it), checked as compose would resolve the file (``tests/integration/test_compose.py``'s
interpolation); the RabbitMQ service's entrypoint runs here with a stand-in for its image's own."""

from __future__ import annotations

import subprocess
from pathlib import Path

from shared.celery_config import AmqpTransport, RedisTransport, broker_transport
from tests.integration.test_compose import FUSEFLEET_SERVICES, compose, fleet_settings, interpolate, service_env

ON_RABBITMQ = {"RABBITMQ_PASSWORD": "s3cret", "FUSEFLEET_BROKER_URL": "amqp://fusefleet:s3cret@rabbitmq:5672//"}
BROKER_USERS = ("scheduler", "gpu-worker")  # the api never talks to the broker


def test_the_rabbitmq_profile_adds_a_broker_inside_the_compose_network_only() -> None:
    services = compose()["services"]
    rabbitmq = services["rabbitmq"]
    assert rabbitmq["image"].startswith("rabbitmq:") and "ports" not in rabbitmq
    assert rabbitmq["healthcheck"]["test"] and any(v.endswith(":/var/lib/rabbitmq") for v in rabbitmq["volumes"])
    assert service_env(rabbitmq)["RABBITMQ_DEFAULT_PASS"] == "", "no password in this file"
    for name, service in services.items():  # the profile's service only: a plain `up` stays as it was
        assert ("rabbitmq" in service.get("profiles", [])) == (name == "rabbitmq"), name
    for name in BROKER_USERS:
        assert services[name]["depends_on"]["rabbitmq"] == {"condition": "service_healthy", "required": False}
    assert "rabbitmq" not in services["api"]["depends_on"]


def test_the_fleet_uses_the_redis_service_unless_broker_url_names_rabbitmq() -> None:
    services = compose()["services"]
    for name in FUSEFLEET_SERVICES:
        plain = fleet_settings(service_env(services[name]))
        assert plain.celery_broker_url == "redis://redis:6379/0", name
        assert isinstance(broker_transport(plain), RedisTransport), name
        on_rabbitmq = fleet_settings(service_env(services[name], ON_RABBITMQ))
        assert on_rabbitmq.celery_broker_url == ON_RABBITMQ["FUSEFLEET_BROKER_URL"], name
        assert isinstance(broker_transport(on_rabbitmq), AmqpTransport), name
        assert on_rabbitmq.batch_time_limit_s < 1800, "below RabbitMQ's default consumer_timeout"


FAKE = """#!/bin/sh
# stands in for {name}: records its arguments, one a line
for arg in "$@"; do printf '%s\\n' "$arg"; done > "$FAKE_LOG"
"""


def run_entrypoint(service: str, fake: str, shell: dict[str, str], tmp_path: Path) -> tuple[int, str, list[str]]:
    """Run ``service``'s entrypoint and command as its container would, ``fake`` standing in for the program it
    starts; its exit status, stderr and the arguments the program got (none: it never started)."""
    spec = compose()["services"][service]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / fake).write_text(FAKE.format(name=fake))
    (bin_dir / fake).chmod(0o755)
    log = tmp_path / f"{fake}.log"
    log.unlink(missing_ok=True)
    argv = [interpolate(part, shell) for part in [*spec["entrypoint"], *spec["command"]]]
    env = {**service_env(spec, shell), "PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE_LOG": str(log)}
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    return run.returncode, run.stderr, log.read_text().splitlines() if log.exists() else []


def test_rabbitmq_refuses_to_start_without_a_password_of_its_own(tmp_path: Path) -> None:
    for shell in ({}, {"RABBITMQ_PASSWORD": ""}):
        status, stderr, started = run_entrypoint("rabbitmq", "docker-entrypoint.sh", shell, tmp_path)
        assert status == 1 and "RABBITMQ_PASSWORD" in stderr and not started, shell
    status, stderr, started = run_entrypoint("rabbitmq", "docker-entrypoint.sh", ON_RABBITMQ, tmp_path)
    assert status == 0 and started == ["rabbitmq-server"], stderr


def test_flower_watches_the_fleets_broker(tmp_path: Path) -> None:
    login = {"FLOWER_BASIC_AUTH": "ops:pw"}
    for shell, broker in (
        (login, "redis://redis:6379/0"),
        ({**login, **ON_RABBITMQ}, ON_RABBITMQ["FUSEFLEET_BROKER_URL"]),
    ):
        status, stderr, argv = run_entrypoint("flower", "celery", shell, tmp_path)
        assert status == 0, stderr
        assert argv[:2] == [f"--broker={broker}", "flower"], argv
