"""``fusefleet.local``: a whole fleet embedded in a Python program, as vLLM-Omni's ``Omni(...).generate([...])``.

>>> import fusefleet
>>> with fusefleet.local(max_num_seqs=4, request_batch_max_wait_ms=20) as fleet:  # doctest: +SKIP
...     results = fleet.generate(["a red fox", "a blue whale"], num_inference_steps=4)
...     pngs = [result.images[0] for result in results]

It runs ``fusefleet up``'s processes (``fusefleet.up.LocalFleet``: an embedded Valkey unless ``FUSEFLEET_REDIS_URL``
is set, the api on a free port, the scheduler, ``workers`` workers) in a temporary folder, each service configured
by the keyword arguments (any setting, by its name, over the environment and the config file), and hands back a
``fusefleet.client.Client`` of its api: ``generate`` makes each list item its own request and returns one result per
item, in order. Leaving the block stops every process and removes the folder.
"""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fusefleet.client import Client
from fusefleet.settings_flags import env_value
from fusefleet.up import LocalFleet
from shared.settings import ENV_PREFIX, Settings

READY_TIMEOUT_S = 120.0
"""Longest wait for the api of a new local fleet to answer (its processes import torch and diffusers)."""
HOST = "127.0.0.1"


def settings_env(settings: dict[str, Any]) -> dict[str, str]:
    """Keyword settings as the ``FUSEFLEET_*`` variables of the services (tables and lists as JSON); a TypeError
    for a name that is no setting, a ValidationError for a value that is not valid (before anything starts)."""
    unknown = sorted(set(settings) - set(Settings.model_fields))
    if unknown:
        raise TypeError(f"fusefleet.local: no such setting: {', '.join(unknown)}")
    Settings(**settings)  # refused here, naming the setting, rather than by every process at start
    return {
        ENV_PREFIX + name.upper(): json.dumps(value) if isinstance(value, dict | list | tuple) else env_value(value)
        for name, value in settings.items()
    }


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


@contextmanager
def local(*, workers: int = 1, timeout_s: float = READY_TIMEOUT_S, **settings: Any) -> Iterator[Client]:
    """Start a local fleet configured by ``settings`` (e.g. ``models={"sd": "demo:stable-diffusion"}``,
    ``max_num_seqs=4``) with ``workers`` workers; yield a client of its api; stop it on leaving. A RuntimeError
    naming its log folder when its api does not answer within ``timeout_s`` (a process exited or it was slow)."""
    env = settings_env(settings)
    state_dir = Path(tempfile.mkdtemp(prefix="fusefleet-local-"))
    port = _free_port()
    fleet = LocalFleet(
        host=HOST, port=port, workers=workers, state_dir=state_dir, env_overrides=env, log_dir=state_dir / "logs"
    )
    try:
        fleet.start()
        if not fleet.wait_until_ready(timeout_s):
            exited = fleet.first_exited()
            why = f"{exited} exited" if exited else f"its api did not answer within {timeout_s:.0f} s"
            raise RuntimeError(f"fusefleet.local: the fleet did not start ({why}); logs in {state_dir / 'logs'}")
        with Client(f"http://{HOST}:{port}") as client:
            yield client
    finally:
        fleet.stop()
        shutil.rmtree(state_dir, ignore_errors=True)
