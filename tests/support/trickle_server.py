"""An HTTP endpoint that never finishes answering: it reads each request, then sends the first bytes of a status
line and one more byte every ``interval_s`` for as long as the client waits. Every socket read of the client gets
a byte well within its read timeout, so botocore's connect and read timeouts never end the call: what an S3
endpoint that stops answering properly looks like to a worker (a stuck proxy, a half-dead load balancer)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class TrickleServer:
    url: str
    accepted: threading.Event  # set once a client connected


@contextmanager
def trickle_server(interval_s: float = 0.1) -> Iterator[TrickleServer]:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()
    accepted = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            try:
                conn.recv(65536)  # the request's head (a body may follow: never read)
                conn.sendall(b"HTTP/1.1 200 ")
                while not stop.wait(interval_s):
                    conn.sendall(b" ")
            except OSError:
                return

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            accepted.set()
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, name="trickle-server", daemon=True)
    thread.start()
    try:
        yield TrickleServer(f"http://127.0.0.1:{listener.getsockname()[1]}", accepted)
    finally:
        stop.set()
        thread.join(2)
        listener.close()
