"""``fusefleet generate``: submit prompts to a running fleet, show each request's progress, write its images;
``fusefleet watch``: print the live events of requests until they end.

Each prompt is its own request; all are submitted together (``AsyncClient.generate``) so the fleet can fuse
them. One progress bar per request (step/total, on stderr) while they run; then one line per image written
(stdout; ``.png``, or ``.jpeg`` / ``.webp`` with ``--format``) and one readable line per request that failed or
was refused (stderr); the exit code is 1 when any request did not succeed.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from fusefleet.client import AsyncClient, Client, Event, FusefleetError, Result
from fusefleet.client_images import encode_image
from shared.contracts import OutputFormat, RequestStatus
from shared.events import ProgressEvent, RunningEvent, ScheduledEvent
from shared.wire import RequestView

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
_SIZE = re.compile(r"^\s*(\d+)\s*(?:[xX*]\s*(\d+))?\s*$")


def parse_size(value: str) -> tuple[int, int]:
    """``WIDTHxHEIGHT`` (or one number for a square) as (width, height)."""
    match = _SIZE.match(value)
    if not match:
        raise typer.BadParameter(f"{value!r} is not WIDTHxHEIGHT (e.g. 512x512)", param_hint="--size")
    width = int(match.group(1))
    return width, int(match.group(2) or width)


@dataclass(frozen=True, slots=True)
class GenerateOptions:
    """The options of ``fusefleet generate``; None leaves a field to the api's default."""

    prompts: Sequence[str]
    out: Path
    url: str | None = None
    n: int | None = None
    size: str | None = None
    steps: int | None = None
    seed: int | None = None
    guidance: float | None = None
    negative: str | None = None
    lora: str | None = None
    lora_scale: float | None = None
    image: Path | None = None
    mask: Path | None = None
    strength: float | None = None
    output_format: OutputFormat | None = None
    quality: int | None = None
    prefix: str | None = None
    timeout: float | None = None
    progress: bool = True


def request_params(opts: GenerateOptions) -> dict[str, Any]:
    """The request fields every prompt shares (only those given on the command line)."""
    params: dict[str, Any] = {}
    if opts.size is not None:
        params["width"], params["height"] = parse_size(opts.size)
    optional = {
        "n": opts.n,
        "num_inference_steps": opts.steps,
        "seed": opts.seed,
        "guidance_scale": opts.guidance,
        "negative_prompt": opts.negative,
        "output_format": opts.output_format.value if opts.output_format is not None else None,
        "output_compression": opts.quality,
    }
    params.update({key: value for key, value in optional.items() if value is not None})
    if opts.lora is not None:
        params["lora"] = {"name": opts.lora, **({"scale": opts.lora_scale} if opts.lora_scale is not None else {})}
    elif opts.lora_scale is not None:
        raise typer.BadParameter("--lora-scale needs --lora", param_hint="--lora-scale")
    if opts.quality is not None and (opts.output_format is None or not opts.output_format.lossy):
        raise typer.BadParameter("--quality needs --format jpeg or webp (png is lossless)", param_hint="--quality")
    if opts.image is None and (opts.mask is not None or opts.strength is not None):
        raise typer.BadParameter("--mask and --strength need --image", param_hint="--image")
    if opts.image is not None:
        params["image"] = _encoded(opts.image, "--image")
        if opts.mask is not None:
            params["mask_image"] = _encoded(opts.mask, "--mask")
        if opts.strength is not None:
            params["strength"] = opts.strength
    return params


def _encoded(path: Path, option: str) -> str:
    try:
        return encode_image(path)
    except (OSError, ValueError, ImportError) as exc:
        raise typer.BadParameter(f"{path}: {exc}", param_hint=option) from None


def _label(index: int, prompt: str, width: int = 40) -> str:
    text = prompt if len(prompt) <= width else prompt[: width - 1] + "…"
    return f"[{index}] {text}"


def _quoted(prompt: str, width: int = 60) -> str:
    return repr(prompt if len(prompt) <= width else prompt[: width - 1] + "…")


def describe_failure(result: Result, prompt: str) -> str:
    """One readable line for a request that did not succeed."""
    error = result.error
    reason = str(error) if error is not None else f"ended as {result.status}"
    if result.id is None:
        what = "was refused" if error is not None and error.type == "RequestRejected" else "could not be submitted"
        return f"error: prompt {result.index} {_quoted(prompt)} {what}: {reason}"
    return f"error: prompt {result.index} {_quoted(prompt)} (request {result.id}) did not succeed: {reason}"


class _Bars:
    """One rich progress bar per request, on stderr; also remembers the ids seen (to abort them on Ctrl-C)."""

    def __init__(self, prompts: Sequence[str], enabled: bool) -> None:
        self.ids: dict[int, str] = {}
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            disable=not enabled,
        )
        self.tasks: list[TaskID] = [
            self.progress.add_task(_label(i, prompt), total=None, status=_styled("submitting"))
            for i, prompt in enumerate(prompts)
        ]

    def update(self, index: int, view: RequestView) -> None:
        self.ids[index] = view.id
        total = view.progress.total
        step = total if view.status is RequestStatus.SUCCEEDED else view.progress.step
        task = self.tasks[index]
        self.progress.update(task, completed=step, total=total, status=_styled(view.status.value))
        if view.status.terminal:
            self.progress.stop_task(task)  # its elapsed time stops with it

    def done(self, result: Result) -> None:
        task = self.tasks[result.index]
        if result.id is None:
            refused = result.error is not None and result.error.type == "RequestRejected"
            status = "refused" if refused else "not submitted"
            self.progress.update(task, total=1, completed=0, status=_styled(status))
        elif not result.ok and result.status is not None and not result.status.terminal:
            self.progress.update(task, status=_styled("timed out"))
        self.progress.stop_task(task)


_STYLES = {"succeeded": "green", "running": "cyan", "failed": "red", "refused": "red", "aborted": "yellow"}


def _styled(status: str) -> str:
    style = _STYLES.get(status, "red" if status in ("not submitted", "timed out") else "dim")
    return f"[{style}]{status}[/{style}]"


async def _generate(opts: GenerateOptions, requests: list[dict[str, Any]], bars: _Bars) -> list[Result]:
    async with AsyncClient(opts.url) as client:
        return await client.generate(requests, opts.timeout, on_progress=bars.update)


def _abort(url: str | None, ids: Sequence[str]) -> int:
    aborted = 0
    with Client(url, timeout=5.0) as client:
        for request_id in ids:
            try:
                client.abort(request_id)
                aborted += 1
            except FusefleetError:
                pass
    return aborted


def run_generate(opts: GenerateOptions) -> int:
    """Run the command; its exit code (0: every request succeeded, 1: some did not, 130: interrupted)."""
    if not opts.prompts:
        raise typer.BadParameter("give at least one prompt", param_hint="PROMPTS")
    params = request_params(opts)
    requests = [{**params, "prompt": prompt} for prompt in opts.prompts]
    bars = _Bars(opts.prompts, opts.progress)
    try:
        with bars.progress:
            results = asyncio.run(_generate(opts, requests, bars))
            for result in results:
                bars.done(result)
    except KeyboardInterrupt:
        aborted = _abort(opts.url, list(bars.ids.values()))
        typer.echo(f"interrupted: aborted {aborted} of {len(bars.ids)} submitted request(s)", err=True)
        return EXIT_INTERRUPTED
    failed = 0
    for result, prompt in zip(results, opts.prompts, strict=True):
        if not result.ok:
            failed += 1
            typer.echo(describe_failure(result, prompt), err=True)
            continue
        stem = f"{opts.prefix}-{result.index}" if opts.prefix else None
        try:
            paths = result.save(opts.out, stem)
        except OSError as exc:
            failed += 1
            typer.echo(f"error: prompt {result.index}: cannot write its images to {opts.out}: {exc}", err=True)
            continue
        for path in paths:
            typer.echo(str(path))
    return EXIT_FAILED if failed else 0


# --- fusefleet watch ------------------------------------------------------------------------------------------------
def describe_event(event: Event) -> str:
    """One readable line for an event: ``<request id> <event> <detail>``."""
    data = event.data
    detail = ""
    if isinstance(data, ScheduledEvent):
        detail = f"batch {data.batch_id} of {data.batch_size}"
    elif isinstance(data, RunningEvent):
        detail = f"on {data.worker}"
    elif isinstance(data, ProgressEvent):
        detail = f"{data.step}/{data.total}"
    elif isinstance(data, RequestView) and data.error is not None:
        detail = f"{data.error.type}: {data.error.message}"
    elif isinstance(data, RequestView):
        detail = " ".join(data.videos + data.images)
    return f"{event.request_id} {event.name} {detail}".rstrip()


def event_json(event: Event) -> str:
    """An event as one JSON line: its name, its ``last_event_id`` (to resume after it) and its data."""
    return json.dumps(
        {"event": event.name, "last_event_id": event.last_event_id, "data": event.data.model_dump(mode="json")}
    )


def run_watch(url: str | None, request_ids: Sequence[str], *, as_json: bool, last_event_id: str | None) -> int:
    """Print the requests' events as they happen until each ended; 0 when all succeeded, 1 otherwise."""
    ended: dict[str, str] = {}
    try:
        with Client(url) as client:
            for event in client.watch(request_ids, last_event_id=last_event_id):
                typer.echo(event_json(event) if as_json else describe_event(event))
                if event.terminal:
                    ended[event.request_id] = event.name
    except FusefleetError as exc:
        typer.echo(f"error: {exc}", err=True)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return 0 if all(status == RequestStatus.SUCCEEDED for status in ended.values()) else EXIT_FAILED
