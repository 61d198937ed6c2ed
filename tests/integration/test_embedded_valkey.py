"""The embedded server (``fusefleet.valkey.EmbeddedValkey``): a port it picked and lost to another process before
binding it (two pytest processes pick ports at once) is picked again; a port given is never changed."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import redis

from fusefleet.valkey import EmbeddedValkey, free_port


def test_a_picked_port_taken_meanwhile_is_picked_again(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        picks = iter([busy, free_port()])
        server = EmbeddedValkey(tmp_path / "picked", port_picker=lambda: next(picks)).start()
        try:
            assert server.port != busy
            with redis.Redis.from_url(server.url) as client:
                assert client.ping()
            server.kill()
            server.start()  # a restart keeps its port
            with redis.Redis.from_url(server.url) as client:
                assert client.ping()
        finally:
            server.stop()
        with pytest.raises(RuntimeError, match="did not start"):
            EmbeddedValkey(tmp_path / "given", port=busy).start()  # a given port is the caller's: no other
