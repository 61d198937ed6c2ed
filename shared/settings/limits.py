"""Request limits: what the api accepts (422, 413, 429 or 503 beyond them)."""

from __future__ import annotations

from pydantic import Field

from shared.settings.concern import SettingsConcern


class LimitSettings(SettingsConcern):
    """The bounds of one request (sizes, steps, prompt, timeout, inputs) and of the queue."""

    section = "Request limits (the API answers 422 beyond them)"

    max_image_side: int = Field(2048, ge=8)
    """Largest accepted width or height in pixels."""

    max_inference_steps: int = Field(200, ge=1)
    """Largest accepted num_inference_steps."""

    max_images_per_request: int = Field(8, ge=1)
    """Largest accepted n (images for one prompt)."""

    max_num_frames: int = Field(257, ge=1)
    """Largest accepted num_frames (frames of one video)."""

    max_video_decode_bytes: int = Field(2 * 1024**3, ge=1024)
    """Largest decoded clip a video request may ask for: n x num_frames x width x height x 3 channels x 4 bytes (the
    float32 frames the VAE decodes; its activations grow with them), num_frames the model's default when unset;
    refused at submit (422 naming num_frames). A video worker decodes a batch one video at a time (VAE slicing), so
    this bounds a batch's decode too."""

    max_prompt_chars: int = Field(4000, ge=1)
    """Longest accepted prompt or negative prompt."""

    max_timeout_s: float = Field(3600.0, gt=0)
    """Largest timeout_s a request may set (422 above it). A request not started within its timeout_s fails with
    Timeout; one still running then is aborted. Requests without timeout_s have no deadline."""

    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    """Largest accepted HTTP request body; larger ones get 413."""

    max_input_image_bytes: int = Field(10 * 1024 * 1024, ge=1024)
    """Largest accepted input image or mask (decoded bytes, before base64); larger ones get 422."""

    max_input_image_pixels: int = Field(4096 * 4096, ge=64)
    """Largest accepted input image or mask in pixels (width x height as stored in the file): bounds the memory of
    decoding one. It is then resized to the request's width x height."""

    max_queue_len: int = Field(100_000, ge=1)
    """Requests waiting in the stream beyond which submissions get 503 (backpressure)."""

    max_queued_input_bytes: int = Field(1024**3, ge=1024)
    """Bytes of input images (and masks) that unfinished requests may hold in Redis, as stored (the client's file when
    it already has the request's size, else a PNG at that size); a submission past it gets 429 with Retry-After (413
    when its own inputs exceed it). Held from submission until the request ends."""
