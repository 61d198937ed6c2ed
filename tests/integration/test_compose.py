"""Keeps docker-compose.yml honest where docker cannot run: its fusefleet services' exact commands and
environments are run here against a test Redis, and a request submitted through that api must succeed.

Only what is host-specific is replaced: the Redis address (the compose ``redis`` service), the folders of the
model cache and LoRA volumes, the api's published port (a free one) and, with the ``s3`` profile, the MinIO
address (an S3-protocol server of moto's on a free port). Everything else is taken as written. The ``s3``
profile's wiring is checked as compose would resolve it: its variables reach every fleet service and build the
S3 result store, and the bucket-creating one-shot (run with a stand-in ``mc``) creates the fleet's bucket with
MinIO's credentials.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
import yaml
from fakeredis import FakeRedis
from moto.server import ThreadedMotoServer
from prometheus_client.parser import text_string_to_metric_families

from shared.results import build_result_store
from shared.results.deadline import DeadlineStore
from shared.results.redis_store import RedisResultStore
from shared.results.s3 import S3ResultStore
from shared.settings import Settings
from tests.support.processes import REPO_ROOT, Service, api_up, wait_for
from tests.support.redis_server import RedisServer, free_port

COMPOSE = REPO_ROOT / "docker-compose.yml"
FUSEFLEET_SERVICES = ("api", "scheduler", "gpu-worker")
S3_WIRING = (
    "FUSEFLEET_RESULT_STORE",
    "FUSEFLEET_S3_BUCKET",
    "FUSEFLEET_S3_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
)
_NAME = re.compile(r"\w+")


def compose() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE.read_text()))


def _interpolate(text: str, start: int, env: Mapping[str, str], *, until_brace: bool) -> tuple[str, int]:
    out: list[str] = []
    i = start
    while i < len(text):
        char = text[i]
        if until_brace and char == "}":
            return "".join(out), i + 1
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("${", i):
            name = _NAME.match(text, i + 2)
            assert name is not None, f"bad interpolation in {text!r}"
            i = name.end()
            value = env.get(name.group())
            if text.startswith(":-", i) or text.startswith("-", i):
                use_default = not value if text[i] == ":" else value is None
                default, i = _interpolate(text, i + (2 if text[i] == ":" else 1), env, until_brace=True)
                out.append(default if use_default else str(value))
            else:
                assert text[i] == "}", f"unsupported interpolation in {text!r}"
                out.append(value or "")
                i += 1
        else:
            out.append(char)
            i += 1
    assert not until_brace, f"unclosed ${{ in {text!r}"
    return "".join(out), i


def interpolate(value: object, env: Mapping[str, str] | None = None) -> str:
    """Compose's interpolation (${NAME}, ${NAME:-default}, ${NAME-default}, nested defaults, $$) with ``env`` as
    the shell and .env; with no ``env``, the defaults the file ships with."""
    return _interpolate(str(value), 0, env or {}, until_brace=False)[0]


def service_env(service: dict[str, Any], env: Mapping[str, str] | None = None) -> dict[str, str]:
    return {name: interpolate(value, env) for name, value in (service.get("environment") or {}).items()}


def test_interpolation_follows_compose() -> None:
    env = {"SET": "x", "EMPTY": ""}
    assert interpolate("${SET:-d} ${EMPTY:-d} ${UNSET:-d}", env) == "x d d"
    assert interpolate("${SET-d} ${EMPTY-d} ${UNSET-d}", env) == "x  d"
    assert interpolate("${UNSET-${EMPTY:-${SET}}}/$${SET}/${SET}", env) == "x/${SET}/x"


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


def fleet_settings(env: Mapping[str, str]) -> Settings:
    """The Settings a fleet service builds from these FUSEFLEET_* variables (and nothing else)."""
    prefix = "FUSEFLEET_"
    return Settings.model_validate(
        {name.removeprefix(prefix).lower(): value for name, value in env.items() if name.startswith(prefix)}
    )


def s3_store(settings: Settings) -> S3ResultStore:
    """The S3 result store a fleet service builds from ``settings`` (under its per-call deadline)."""
    store = build_result_store(settings, FakeRedis())
    assert isinstance(store, DeadlineStore) and isinstance(store.inner, S3ResultStore), store
    return store.inner


MINIO_CASES = {
    "defaults but the password": {"FUSEFLEET_RESULT_STORE": "s3", "MINIO_ROOT_PASSWORD": "only-this-is-set"},
    "own credentials and bucket": {
        "FUSEFLEET_RESULT_STORE": "s3",
        "FUSEFLEET_S3_BUCKET": "team-images",
        "MINIO_ROOT_USER": "admin",
        "MINIO_ROOT_PASSWORD": "a-long-secret",
    },
}


def test_s3_profile_adds_minio_without_publishing_it() -> None:
    services = compose()["services"]
    minio, init = services["minio"], services["minio-init"]
    assert minio["profiles"] == ["s3"] and init["profiles"] == ["s3"]
    assert minio["image"].startswith("minio/minio") and init["image"].startswith("minio/mc")
    assert minio["command"][0].endswith("exec minio server /data --console-address :9001")
    assert "ports" not in minio, "MinIO (its console above all) stays inside the compose network"
    assert minio["healthcheck"]["test"] and any(volume.endswith(":/data") for volume in minio["volumes"])
    assert init["depends_on"]["minio"]["condition"] == "service_healthy"
    assert init["restart"] == "no"
    credentials = service_env(minio)
    assert credentials["MINIO_ROOT_USER"] and credentials["MINIO_ROOT_PASSWORD"] == "", "no password in this file"
    bucket_first = services["gpu-worker"]["depends_on"]["minio-init"]
    assert bucket_first == {"condition": "service_completed_successfully", "required": False}
    for name, service in services.items():  # the profile's services only: a plain `up` stays as it was
        assert ("s3" in service.get("profiles", [])) == (name in ("minio", "minio-init")), name


@pytest.mark.parametrize("case", list(MINIO_CASES))
def test_s3_profile_points_every_fleet_service_at_minio(case: str) -> None:
    services = compose()["services"]
    env = MINIO_CASES[case]
    minio = service_env(services["minio"], env)
    bucket = env.get("FUSEFLEET_S3_BUCKET", "fusefleet-results")
    for name in FUSEFLEET_SERVICES:
        fleet = service_env(services[name], env)
        assert fleet["FUSEFLEET_RESULT_STORE"] == "s3", name
        assert fleet["FUSEFLEET_S3_BUCKET"] == bucket, name
        assert fleet["FUSEFLEET_S3_ENDPOINT_URL"] == "http://minio:9000", name
        assert fleet["AWS_ACCESS_KEY_ID"] == minio["MINIO_ROOT_USER"], name
        assert fleet["AWS_SECRET_ACCESS_KEY"] == minio["MINIO_ROOT_PASSWORD"], name
        store = s3_store(fleet_settings(fleet))
        assert store.bucket == bucket, name
        assert store._s3.meta.endpoint_url == "http://minio:9000", name


def test_without_the_profile_the_fleet_keeps_redis_and_aws_needs_no_minio() -> None:
    services = compose()["services"]
    aws = {
        "FUSEFLEET_RESULT_STORE": "s3",
        "FUSEFLEET_S3_BUCKET": "prod-images",
        "FUSEFLEET_S3_ENDPOINT_URL": "",  # set empty: AWS itself
        "AWS_ACCESS_KEY_ID": "",  # set empty: boto3's other sources (a profile, an instance role)
        "AWS_SECRET_ACCESS_KEY": "",
    }
    for name in FUSEFLEET_SERVICES:
        plain = service_env(services[name])
        assert set(S3_WIRING) <= set(plain), f"{name} lacks part of the result-store wiring"
        assert isinstance(build_result_store(fleet_settings(plain), FakeRedis()), RedisResultStore)
        on_aws = service_env(services[name], aws)
        assert on_aws["FUSEFLEET_S3_ENDPOINT_URL"] == "" and on_aws["AWS_ACCESS_KEY_ID"] == ""
        store = s3_store(fleet_settings({**on_aws, "FUSEFLEET_S3_REGION": "eu-west-1"}))
        assert store.bucket == "prod-images"
        assert store._s3.meta.endpoint_url == "https://s3.eu-west-1.amazonaws.com"


FAKE_MC = """#!/bin/sh
# stands in for MinIO's client: records each call, one argument a line
for arg in "$@"; do printf '%s\n' "$arg"; done >> "$MC_LOG"
echo --- >> "$MC_LOG"
"""


@pytest.mark.parametrize("case", list(MINIO_CASES))
def test_minio_init_creates_the_fleets_bucket_with_minios_credentials(case: str, tmp_path: Path) -> None:
    services = compose()["services"]
    env = MINIO_CASES[case]
    init, minio = services["minio-init"], service_env(services["minio"], env)
    fleet = service_env(services["gpu-worker"], env)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mc").write_text(FAKE_MC)
    (bin_dir / "mc").chmod(0o755)
    log = tmp_path / "mc.log"
    argv = [interpolate(part, env) for part in [*init["entrypoint"], *init["command"]]]
    container_env = {**service_env(init, env), "PATH": f"{bin_dir}:/usr/bin:/bin", "MC_LOG": str(log)}
    subprocess.run(argv, env=container_env, check=True, timeout=30)
    calls = [call.strip("\n").split("\n") for call in log.read_text().split("---\n") if call.strip()]
    endpoint = fleet["FUSEFLEET_S3_ENDPOINT_URL"]
    assert calls == [
        ["alias", "set", "local", endpoint, minio["MINIO_ROOT_USER"], minio["MINIO_ROOT_PASSWORD"]],
        ["mb", "--ignore-existing", f"local/{fleet['FUSEFLEET_S3_BUCKET']}"],
    ]


FAKE_MINIO = """#!/bin/sh
# stands in for the MinIO server: records its arguments, one a line
for arg in "$@"; do printf '%s\\n' "$arg"; done > "$MINIO_LOG"
"""


def test_minio_refuses_to_start_without_a_password_of_its_own(tmp_path: Path) -> None:
    minio = compose()["services"]["minio"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "minio").write_text(FAKE_MINIO)
    (bin_dir / "minio").chmod(0o755)
    log = tmp_path / "minio.log"
    cases = [({}, False), ({"MINIO_ROOT_PASSWORD": ""}, False), ({"MINIO_ROOT_PASSWORD": "1234567"}, False)]
    cases.append(({"MINIO_ROOT_PASSWORD": "12345678"}, True))  # MinIO's own minimum: 8 characters
    for shell, starts in cases:
        argv = [interpolate(part, shell) for part in [*minio["entrypoint"], *minio["command"]]]
        env = {**service_env(minio, shell), "PATH": f"{bin_dir}:/usr/bin:/bin", "MINIO_LOG": str(log)}
        log.unlink(missing_ok=True)
        run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
        if starts:
            assert run.returncode == 0, run.stderr
            assert log.read_text().splitlines() == ["server", "/data", "--console-address", ":9001"]
        else:
            assert run.returncode == 1 and "MINIO_ROOT_PASSWORD" in run.stderr and not log.exists(), shell


def published(service: dict[str, Any], env: Mapping[str, str] | None = None) -> list[str]:
    """The host side of each port a service publishes (``address:port``), as compose resolves it."""
    return [interpolate(port, env).rsplit(":", 1)[0] for port in service.get("ports", [])]


def test_nothing_is_published_beyond_the_loopback_unless_asked() -> None:
    services = compose()["services"]
    for name, service in services.items():
        for host_side in published(service):
            assert host_side.startswith("127.0.0.1:"), f"{name} publishes {host_side} by default"
    assert published(services["api"]) == ["127.0.0.1:8000"]
    widened = {"FUSEFLEET_API_HOST": "0.0.0.0", "FUSEFLEET_API_PORT": "9000"}  # the documented way to serve others
    assert published(services["api"], widened) == ["0.0.0.0:9000"]


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server on a free port, standing in for the compose ``minio`` service."""
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("profile", ["default", "s3"])
def test_compose_commands_serve_a_request(
    request: pytest.FixtureRequest,
    profile: str,
    redis_server: RedisServer,
    model_cache: Path,
    lora_dir: Path,
    tmp_path: Path,
) -> None:
    """As ``docker compose up``, and as ``FUSEFLEET_RESULT_STORE=s3 docker compose --profile s3 up``."""
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
    shell = {"FUSEFLEET_RESULT_STORE": "s3", "MINIO_ROOT_PASSWORD": "compose-test"} if profile == "s3" else {}
    bucket = None
    if profile == "s3":
        endpoint = request.getfixturevalue("s3_endpoint")
        fleet = service_env(services["gpu-worker"], shell)
        bucket = fleet["FUSEFLEET_S3_BUCKET"]
        s3 = s3_client(endpoint, fleet)
        s3.create_bucket(Bucket=bucket)  # what minio-init does
        host_specific["FUSEFLEET_S3_ENDPOINT_URL"] = endpoint  # the compose minio service's address, here
    clean_env = {k: v for k, v in os.environ.items() if not k.startswith(("FUSEFLEET_", "AWS_"))}
    processes = []
    for name in FUSEFLEET_SERVICES:
        env = {**clean_env, **service_env(services[name], shell), **host_specific}
        assert env["FUSEFLEET_REDIS_URL"] == redis_server.url
        assert env["FUSEFLEET_RESULT_STORE"] == ("s3" if profile == "s3" else "redis")
        argv = local_argv(services[name]["command"], port)
        processes.append(Service(name, argv, env, tmp_path, inherit_env=False))
    try:
        for service in processes:
            service.start()
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: api_up(base), 60, f"the compose api (logs in {tmp_path})")
        rid = httpx.post(f"{base}/v1/requests", json={"prompt": "from compose"}, timeout=10).json()["id"]

        def finished() -> dict[str, Any] | None:
            state = dict(httpx.get(f"{base}/v1/requests/{rid}", timeout=10).json())
            return state if state["status"] in ("succeeded", "failed", "aborted") else None

        state = wait_for(finished, 180, f"the request to finish (logs in {tmp_path})")
        assert isinstance(state, dict) and state["status"] == "succeeded", state
        image = httpx.get(f"{base}/v1/requests/{rid}/images/0", timeout=10)
        assert image.status_code == 200 and image.headers["content-type"] == "image/png"
        exported = exported_names(httpx.get(f"{base}/metrics", timeout=10).text)  # what Prometheus scrapes
        for where, query in queries().items():  # the dashboard and the autoscaler ask for nothing else
            assert set(_METRIC.findall(query)) <= exported, f"{where}: {query}"
        if bucket is not None:  # the image came from the bucket: the object is there, under the fleet's prefix
            listed = s3.list_objects_v2(Bucket=bucket, Prefix=f"fusefleet/{rid}/")
            objects = [item["Key"] for item in listed.get("Contents", [])]
            assert len(objects) == 1 and objects[0].endswith("/0.png"), objects
            assert s3.get_object(Bucket=bucket, Key=objects[0])["Body"].read() == image.content
    finally:
        for service in processes:
            service.stop()


def s3_client(endpoint: str, fleet: Mapping[str, str]) -> Any:
    """A client of ``endpoint`` with the fleet's own credentials (compose's defaults)."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=fleet["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=fleet["AWS_SECRET_ACCESS_KEY"],
    )


FAKE_CELERY = """#!/bin/sh
# stands in for Celery's CLI (flower): records its arguments, one a line
for arg in "$@"; do printf '%s\\n' "$arg"; done > "$CELERY_LOG"
"""


def test_flower_runs_only_with_a_login_and_on_the_loopback(tmp_path: Path) -> None:
    flower = compose()["services"]["flower"]
    assert flower["profiles"] == ["monitoring"]
    assert all(str(port).startswith("127.0.0.1:") for port in flower["ports"]), "published on the loopback only"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "celery").write_text(FAKE_CELERY)
    (bin_dir / "celery").chmod(0o755)
    log = tmp_path / "celery.log"
    cases: list[tuple[dict[str, str], str | None]] = [
        ({}, None),
        ({"FLOWER_BASIC_AUTH": ""}, None),
        ({"FLOWER_BASIC_AUTH": "ops:s3cret"}, "ops:s3cret"),
    ]
    for shell, login in cases:
        argv = [interpolate(part, shell) for part in [*flower["entrypoint"], *flower["command"]]]
        env = {**service_env(flower, shell), "PATH": f"{bin_dir}:/usr/bin:/bin", "CELERY_LOG": str(log)}
        log.unlink(missing_ok=True)
        run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
        if login is None:
            assert run.returncode == 1 and "FLOWER_BASIC_AUTH" in run.stderr and not log.exists(), shell
        else:
            assert run.returncode == 0, run.stderr
            assert f"--basic-auth={login}" in log.read_text().splitlines()


def test_the_api_takes_a_keys_file_and_has_none_by_default() -> None:
    api = compose()["services"]["api"]
    assert fleet_settings(service_env(api)).api_keys_file is None
    keyed = fleet_settings(service_env(api, {"FUSEFLEET_API_KEYS_FILE": "/api-keys/keys.toml"}))
    assert keyed.api_keys_file == Path("/api-keys/keys.toml")
    assert any(volume.endswith(":/api-keys:ro") for volume in api["volumes"])


# --- the monitoring profile: Prometheus, Grafana and the dashboard (docs/operations.md) ---------------------------
DEPLOY = REPO_ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "fusefleet.json"
KEDA = DEPLOY / "keda" / "scaledobject.yaml"
_METRIC = re.compile(r"\bfusefleet_[a-z_]+\b")
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


def mounted(service: dict[str, Any], target: str) -> Path:
    """The repository path a service mounts (read-only) at ``target``."""
    for volume in service["volumes"]:
        source, _, rest = volume.partition(":")
        if rest in (target, f"{target}:ro"):
            assert rest.endswith(":ro"), f"{target} should be mounted read-only"
            return REPO_ROOT / source
    raise AssertionError(f"nothing mounted at {target}")


def queries() -> dict[str, str]:
    """Every PromQL expression of the dashboard and the KEDA example, by where it is."""
    found = {}
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            found[f"dashboard: {panel['title']} {target['refId']}"] = target["expr"]
    for i, trigger in enumerate(yaml.safe_load(KEDA.read_text())["spec"]["triggers"]):
        found[f"keda trigger {i}"] = trigger["metadata"]["query"]
    return found


def exported_names(exposition: str) -> set[str]:
    """The series names an exposition text offers, families without samples included (a summary's _sum, _count)."""
    names = set()
    for family in text_string_to_metric_families(exposition):
        names.add(family.name)
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ()))
        names.update(sample.name for sample in family.samples)
    return names


def test_monitoring_profile_scrapes_the_api_and_keeps_grafana_behind_a_login() -> None:
    services = compose()["services"]
    prometheus, grafana, api = services["prometheus"], services["grafana"], services["api"]
    for name, service in services.items():  # a plain `up` stays as it was
        assert ("monitoring" in service.get("profiles", [])) == (name in ("prometheus", "grafana", "flower")), name
    assert "ports" not in prometheus, "Prometheus has no login: it stays inside the compose network"
    config = yaml.safe_load(mounted(prometheus, "/etc/prometheus/prometheus.yml").read_text())
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    (job,) = config["scrape_configs"]
    api_port = str(api["ports"][0]).rsplit(":", 1)[1]
    assert job["metrics_path"] == "/metrics" and job["static_configs"][0]["targets"] == [f"api:{api_port}"]
    assert all(str(port).startswith("127.0.0.1:") for port in grafana["ports"]), "published on the loopback only"
    env = service_env(grafana, {"GRAFANA_ADMIN_PASSWORD": "from-dot-env"})
    assert env["GF_SECURITY_ADMIN_PASSWORD"] == "from-dot-env"
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false" and env["GF_USERS_ALLOW_SIGN_UP"] == "false"
    assert env["GF_AUTH_DISABLE_LOGIN_FORM"] == "false"
    provisioning = mounted(grafana, "/etc/grafana/provisioning")
    (datasource,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert datasource["url"] == "http://prometheus:9090" and datasource["type"] == "prometheus"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "fusefleet.yml").read_text())["providers"]
    dashboards = mounted(grafana, provider["options"]["path"])
    assert (dashboards / DASHBOARD.name).read_text() == DASHBOARD.read_text()
    assert env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] == f"{provider['options']['path']}/{DASHBOARD.name}"
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == datasource["uid"], panel["title"]
    assert KEDA.exists() and yaml.safe_load(KEDA.read_text())["spec"]["scaleTargetRef"]["name"] == "gpu-worker"


FAKE_GRAFANA = """#!/bin/sh
# stands in for the Grafana image's /run.sh: says it started
echo started > "$GRAFANA_LOG"
"""


def test_grafana_refuses_to_start_without_an_admin_password(tmp_path: Path) -> None:
    grafana = compose()["services"]["grafana"]
    run_sh = tmp_path / "run.sh"
    run_sh.write_text(FAKE_GRAFANA)
    run_sh.chmod(0o755)
    log = tmp_path / "grafana.log"
    cases = [({}, False), ({"GRAFANA_ADMIN_PASSWORD": "admin"}, False), ({"GRAFANA_ADMIN_PASSWORD": "x9"}, True)]
    for shell, starts in cases:
        # the image's /run.sh is the one host-specific part: the stand-in's path instead
        argv = [interpolate(part, shell).replace("exec /run.sh", f"exec {run_sh}") for part in grafana["command"]]
        argv = [*grafana["entrypoint"], *argv]
        env = {**service_env(grafana, shell), "PATH": "/usr/bin:/bin", "GRAFANA_LOG": str(log)}
        log.unlink(missing_ok=True)
        run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
        if starts:
            assert run.returncode == 0 and log.read_text() == "started\n", run.stderr
        else:
            assert run.returncode == 1 and "GRAFANA_ADMIN_PASSWORD" in run.stderr and not log.exists(), shell
