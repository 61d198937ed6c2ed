"""Start and stop the peer servers (BentoML, LitServe) from the project venv.

Each peer runs with its OWN interpreter, ``.bench-venvs/<name>/bin/python`` (built by ``setup_venvs.sh``), in a
new process group so that ``stop_peer`` can take down the server and every worker it forked. This module needs
only the standard library and httpx, so the load generator can import it from the project venv::

    from bench.peers.launch import PEER_ENDPOINTS, launch_peer, peer_payload, png_from_response, stop_peer, wait_ready

By hand: ``python bench/peers/launch.py litserve --model-dir /tmp/peer-model/demo-sd-v1 --port 8101 --smoke 8``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

PEERS_DIR = Path(__file__).resolve().parent
REPO_ROOT = PEERS_DIR.parent.parent
VENVS_DIR = Path(os.environ.get("BENCH_VENVS_DIR", REPO_ROOT / ".bench-venvs"))

PEERS = ("bentoml", "litserve")
PEER_ENDPOINTS = {"bentoml": "/generate", "litserve": "/predict"}
"""POST path of each peer's generate endpoint."""
PEER_HEALTH = {"bentoml": "/readyz", "litserve": "/health"}
"""GET path that answers 200 once the peer has loaded the pipeline."""


def venv_python(name: str) -> Path:
    """The peer venv's interpreter; raises when ``setup_venvs.sh`` has not built it."""
    if name not in PEERS:
        raise ValueError(f"unknown peer {name!r}; expected one of {PEERS}")
    python = VENVS_DIR / name / "bin" / "python"
    if not (VENVS_DIR / name / ".complete").exists() or not python.exists():
        raise FileNotFoundError(f"{VENVS_DIR / name} is missing or incomplete: run bench/peers/setup_venvs.sh")
    return python


def peer_command(name: str, port: int, host: str = "127.0.0.1") -> list[str]:
    """The argv that serves peer ``name`` on ``host:port`` (run with cwd ``PEERS_DIR``)."""
    python = str(venv_python(name))
    if name == "bentoml":
        return [
            python,
            "-m",
            "bentoml",
            "serve",
            "bentoml_service:PeerDiffusion",
            "--working-dir",
            str(PEERS_DIR),
            "--host",
            host,
            "--port",
            str(port),
        ]
    return [python, str(PEERS_DIR / "litserve_server.py"), "--host", host, "--port", str(port)]


def peer_env(
    model_dir: Path | None,
    max_batch_size: int,
    wait_ms: float,
    torch_threads: int,
    max_latency_ms: int | None = None,
    request_timeout_s: float | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of a peer server: this process's, plus the BENCH_* knobs the peer reads, plus
    ``extra_env`` (e.g. ``BENCH_RUNNER=simulated`` and the cost model's ``FUSEFLEET_SIM_*``). ``model_dir`` may be
    None only for the simulated runner."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # nothing from the project venv leaks into the peer's interpreter
    env.pop("VIRTUAL_ENV", None)
    if model_dir is not None:
        env["BENCH_MODEL_DIR"] = str(Path(model_dir).resolve())
    env.update(
        BENCH_MAX_BATCH_SIZE=str(max_batch_size),
        BENCH_BATCH_TIMEOUT_S=str(wait_ms / 1000.0),  # LitServe's wait window; BentoML has none
        BENCH_TORCH_THREADS=str(torch_threads),
        BENTOML_DO_NOT_TRACK="True",
        PYTHONUNBUFFERED="1",
    )
    env.setdefault("BENTOML_HOME", str(VENVS_DIR / "bentoml" / "home"))  # not ~/bentoml
    if max_latency_ms is not None:
        env["BENCH_MAX_LATENCY_MS"] = str(max_latency_ms)
    if request_timeout_s is not None:
        env["BENCH_REQUEST_TIMEOUT_S"] = str(request_timeout_s)
    env.update(extra_env or {})
    return env


def launch_peer(
    name: str,
    model_dir: Path | None,
    port: int,
    max_batch_size: int,
    wait_ms: float,
    torch_threads: int,
    log_path: Path,
    *,
    max_latency_ms: int | None = None,
    request_timeout_s: float | None = None,
    host: str = "127.0.0.1",
    extra_env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start peer ``name`` in its own venv and process group, stdout+stderr to ``log_path``; returns at once.

    ``wait_ms`` is LitServe's ``batch_timeout`` (a wait window). BentoML has no wait knob: ``max_latency_ms``
    (default 20000) is its latency SLO, past which queued requests get 503. Follow with ``wait_ready`` and
    end with ``stop_peer``. ``extra_env``: see ``peer_env``.
    """
    argv = peer_command(name, port, host)
    env = peer_env(model_dir, max_batch_size, wait_ms, torch_threads, max_latency_ms, request_timeout_s, extra_env)
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv)}\n".encode())
        log.flush()
        return subprocess.Popen(
            argv,
            cwd=PEERS_DIR,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop_peer kills the workers too
        )


def wait_ready(
    base_url: str,
    timeout: float = 120.0,
    health_path: str | None = None,
    proc: subprocess.Popen[Any] | None = None,
) -> None:
    """Poll until ``base_url`` answers 200 on its health path; raise on timeout or when ``proc`` exits.

    Without ``health_path`` both /readyz (BentoML) and /health (LitServe) are tried.
    """
    paths = [health_path] if health_path else list(dict.fromkeys(PEER_HEALTH.values()))
    deadline = time.monotonic() + timeout
    last: str = "no answer"
    with httpx.Client(base_url=base_url, timeout=5.0) as client:
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"peer at {base_url} exited with {proc.returncode} before it was ready")
            for path in paths:
                try:
                    resp = client.get(path)
                except httpx.HTTPError as exc:
                    last = repr(exc)
                    continue
                if resp.status_code == 200:
                    return
                last = f"{path}: {resp.status_code}"
            time.sleep(0.25)
    raise TimeoutError(f"peer at {base_url} not ready after {timeout}s ({last})")


def stop_peer(proc: subprocess.Popen[Any], timeout: float = 15.0) -> int | None:
    """SIGTERM the peer's whole process group, SIGKILL it after ``timeout``; returns the exit code."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            continue
        # the leader is gone; make sure no worker of its group lingers
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.5)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return proc.poll()


def peer_payload(name: str, request: Mapping[str, Any]) -> Any:
    """The JSON body for one request ``{prompt, width, height, num_inference_steps, guidance_scale, seed}``.

    BentoML's batchable API takes a list (its batch dimension): one request is a one-element list.
    """
    return [dict(request)] if name == "bentoml" else dict(request)


def png_from_response(name: str, response: httpx.Response) -> bytes:
    """The PNG bytes in a 200 answer of peer ``name`` (BentoML: JSON list of base64; LitServe: raw image/png)."""
    if name == "bentoml":
        import base64

        (encoded,) = response.json()
        return base64.b64decode(encoded)
    return response.content


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG header; ValueError when ``data`` is not a PNG."""
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ValueError("not a PNG")
    width, height = struct.unpack(">II", data[16:24])
    return width, height


async def smoke(name: str, base_url: str, n: int, sizes: tuple[int, ...] = (64, 32)) -> list[tuple[int, int]]:
    """Send ``n`` concurrent requests cycling through ``sizes``; check 200 and PNG size; return the sizes."""

    async def one(client: httpx.AsyncClient, i: int) -> tuple[int, int]:
        side = sizes[i % len(sizes)]
        request = {
            "prompt": f"a red cat {i}",
            "width": side,
            "height": side,
            "num_inference_steps": 2,
            "guidance_scale": 7.5,
            "seed": i,
        }
        resp = await client.post(PEER_ENDPOINTS[name], json=peer_payload(name, request))
        if resp.status_code != 200:
            raise RuntimeError(f"request {i}: HTTP {resp.status_code}: {resp.text[:200]}")
        got = png_size(png_from_response(name, resp))
        if got != (side, side):
            raise RuntimeError(f"request {i}: got a {got} image, expected {(side, side)}")
        return got

    async with httpx.AsyncClient(base_url=base_url, timeout=600.0) as client:
        return list(await asyncio.gather(*(one(client, i) for i in range(n))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("peer", choices=PEERS)
    parser.add_argument("--model-dir", type=Path, required=True, help="ensure_demo_model(...)'s directory")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--max-batch-size", type=int, default=4)
    parser.add_argument("--wait-ms", type=float, default=20.0, help="LitServe batch_timeout (ms)")
    parser.add_argument("--max-latency-ms", type=int, default=None, help="BentoML max_latency_ms (SLO)")
    parser.add_argument("--torch-threads", type=int, default=2)
    parser.add_argument("--log", type=Path, default=None, help="default: /tmp/peer-<name>-<port>.log")
    parser.add_argument("--smoke", type=int, default=0, help="send N concurrent requests, check them, then stop")
    parser.add_argument("--sizes", default="64,32", help="--smoke image sides, cycled (default 64,32)")
    args = parser.parse_args()

    log_path = args.log or Path(f"/tmp/peer-{args.peer}-{args.port}.log")
    proc = launch_peer(
        args.peer,
        args.model_dir,
        args.port,
        args.max_batch_size,
        args.wait_ms,
        args.torch_threads,
        log_path,
        max_latency_ms=args.max_latency_ms,
    )
    base_url = f"http://127.0.0.1:{args.port}"
    try:
        started = time.monotonic()
        wait_ready(base_url, timeout=180.0, health_path=PEER_HEALTH[args.peer], proc=proc)
        print(f"{args.peer} ready at {base_url}{PEER_ENDPOINTS[args.peer]} in {time.monotonic() - started:.1f}s")
        print(f"log: {log_path}", flush=True)
        if args.smoke:
            started = time.monotonic()
            sides = tuple(int(side) for side in args.sizes.split(","))
            sizes = asyncio.run(smoke(args.peer, base_url, args.smoke, sides))
            print(f"smoke ok: {len(sizes)} PNGs {sizes} in {time.monotonic() - started:.1f}s")
        else:
            proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        code = stop_peer(proc)
        print(f"{args.peer} stopped (exit {code})", file=sys.stderr)


if __name__ == "__main__":
    main()
