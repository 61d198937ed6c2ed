"""A request-level forward run on a step set, so that an aborted row leaves it at the next step.

A fused diffusers pipeline call cannot drop a row: its latents, embeddings and generators have the batch's shape,
and a multistep scheduler keeps history of that shape. A runner whose family has a step-mode adapter
(``gpu_worker.runner.Runner.fused_by_steps``) runs a request-level batch as a closed running set instead:
every request joins at step 0 (they share their steps: one compatibility key), each step is one fused denoiser call
over the live rows, and a request whose abort flag the step reporter brings back is dropped from the set before the
next step (its latents, its half of the guidance embeddings, its generator and scheduler go with it) while its peers
go on unchanged. Their images equal the pipeline call's within the step engine's tolerance (1/255,
``docs/step_mode.md``). Nothing joins a closed set; what happens around the forward (progress, ending the aborted
request at once, storing) is the executor's, as for a pipeline call.
"""

from __future__ import annotations

from collections.abc import Sequence

from PIL import Image

from gpu_worker.runner import Runner, StepSet
from gpu_worker.step_reporter import StepReporter
from gpu_worker.store import RowSignal
from shared.compat import step_key
from shared.contracts import RequestSpec


def forward_by_steps(
    runner: Runner, specs: Sequence[RequestSpec], reporter: StepReporter
) -> list[list[Image.Image]] | None:
    """Run ``specs`` to their last step as a closed set when ``runner`` runs request-level batches by steps
    (``fused_by_steps``) and they can share one set (one step key, each row with its own LoRA; no image task; a
    family and key the step engine takes), dropping each request the reporter finds aborted: each request's images
    in order, ``[]`` for one that left. None when they cannot (the caller makes the pipeline call). Whatever a step
    raises is raised, as a pipeline call's error would be."""
    if not runner.fused_by_steps:
        return None
    carried = runner.traits.step_tasks
    if specs[0].task.needs_image or len({step_key(spec, carried) for spec in specs}) != 1:
        return None
    try:
        step_set = runner.step_set(step_key(specs[0], carried))
    except ValueError:  # a task or frames its adapter does not take, a guidance-distilled UNet: the pipeline call
        return None
    if step_set.join(specs):
        for rid in step_set.requests:
            step_set.abort(rid)
        return None
    return _denoise(step_set, [spec.id for spec in specs], reporter)


def _denoise(step_set: StepSet, ids: list[str], reporter: StepReporter) -> list[list[Image.Image]]:
    outputs: dict[str, list[Image.Image]] = {}
    while step_set.requests:
        finished = step_set.step()
        progress = step_set.progress().values()
        step = max((done for done, _ in progress), default=0)
        total = max((total for _, total in progress), default=step)
        if finished:
            outputs.update(zip(finished, step_set.outputs(finished), strict=True))
        if reporter.on_step(step, total):  # every row aborted or claimed by another run
            break
        for rid, signal in zip(ids, reporter.signals, strict=True):
            if signal is RowSignal.ABORTED:
                step_set.abort(rid)
    for rid in step_set.requests:  # left by a stop: nothing of them is kept
        step_set.abort(rid)
    return [outputs.get(rid, []) for rid in ids]
