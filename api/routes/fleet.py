"""``GET /v1/fleet``: the queue, the batches holding a worker slot and every worker, as JSON (``api.fleet_view``), for
the web page's fleet panel and any dashboard.

Two reads of Redis (``FleetReader.read``: one pipelined round trip; ``FleetReader.running``: two more), each bounded
by ``redis_socket_timeout_s``: the answer, or a 503 with ``Retry-After``, comes within twice that.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Request, status

from api.fleet_view import FleetView, fleet_view
from api.outage import REQUEST_STORE, retry_after_headers
from api.responses import UNAVAILABLE
from api.shard_router import Fleet

router = APIRouter(tags=["fleet"])


async def get_fleet_reader(request: Request) -> Fleet:
    """The fleet reader: the fleet's one shard's, or every shard's summed (``api.shard_router``)."""
    reader: Fleet = request.app.state.fleet
    return reader


FleetReaderDep = Annotated[Fleet, Depends(get_fleet_reader)]


def _unavailable() -> HTTPException:
    return HTTPException(
        status.HTTP_503_SERVICE_UNAVAILABLE, detail=f"{REQUEST_STORE} is unavailable", headers=retry_after_headers()
    )


@router.get("/v1/fleet", responses={**UNAVAILABLE})
async def get_fleet(reader: FleetReaderDep) -> FleetView:
    """The fleet now: queue depth and oldest wait, batches in flight and those holding a worker slot (size, worker,
    step), every worker (live, model, the batch it runs), throughput, and the batches formed so far by size.
    Fleet-wide: with API keys any key reads it, and it names no request."""
    snapshot = await reader.read()
    if snapshot is None:
        raise _unavailable()
    running = await reader.running(snapshot.busy_batches)
    if running is None:
        raise _unavailable()
    return fleet_view(snapshot, running)
