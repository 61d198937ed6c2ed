"""MP4 encoding and decoding of video frames in memory with PyAV (FFmpeg's libraries; no ffmpeg binary, no temp files).

:func:`encode_mp4` turns a video pipeline's PIL frames (``pipe(...).frames[i]``) into the bytes of an MP4 file:
H.264 (libx264, which PyAV's wheels bundle) in yuv420p, the format every browser and player takes; MPEG-4 Part 2
only where the FFmpeg build lacks libx264. :func:`decode_mp4` is the inverse, for tests and clients.

Needs the ``av`` package (PyAV >= 12); it is imported when a function is called, so importing this module does not.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from fractions import Fraction
from functools import cache
from typing import Literal

import numpy as np
from PIL import Image

_PIX_FMT = "yuv420p"
_MAX_FPS_DENOMINATOR = 1001  # keeps NTSC rates exact: 24000/1001, 30000/1001


@cache
def video_codec() -> Literal["libx264", "mpeg4"]:
    """The encoder :func:`encode_mp4` uses: ``"libx264"`` (H.264) if this FFmpeg build has it, else ``"mpeg4"``."""
    import av

    try:
        av.Codec("libx264", "w")
    except av.codec.codec.UnknownCodecError:
        return "mpeg4"
    return "libx264"


def fps_fraction(fps: float) -> Fraction:
    """``fps`` as the exact rate written in the stream: the nearest fraction with denominator <= 1001
    (24 -> 24, 23.976... -> 24000/1001). Raises ValueError unless ``fps`` is finite and positive."""
    if not (math.isfinite(fps) and fps > 0):
        raise ValueError(f"fps must be a finite positive number, got {fps!r}")
    rate = Fraction(fps).limit_denominator(_MAX_FPS_DENOMINATOR)
    if rate <= 0:
        raise ValueError(f"fps {fps!r} is too small")
    return rate


def encode_mp4(frames: Sequence[Image.Image], fps: float) -> bytes:
    """The bytes of an MP4 file holding ``frames`` in order at ``fps`` frames per second.

    Contract:

    * ``frames``: at least one, all of the same size; any PIL mode (converted to RGB; alpha is dropped);
    * width and height must both be even (yuv420p halves the chroma planes): odd sizes raise ValueError, they are
      not padded or cropped, so a decoded frame always has the size of the encoded one. Pipeline sizes (multiples
      of 16 or 32) are always even;
    * ``fps``: finite and positive; the stream's frame rate is :func:`fps_fraction` of it, and frame ``i`` is shown
      at ``i / fps`` seconds;
    * video only (no audio track), codec :func:`video_codec` with its default quality (lossy: decoded pixels are
      close to, not equal to, the input), the ``moov`` index at the end of the file (FFmpeg's ``faststart`` needs
      a named file, which in-memory output does not have).
    """
    import av

    if not frames:
        raise ValueError("encode_mp4 needs at least one frame")
    rate = fps_fraction(fps)
    width, height = frames[0].size
    if width % 2 or height % 2:
        raise ValueError(f"MP4 ({_PIX_FMT}) needs an even width and height, got {width}x{height}")
    for index, image in enumerate(frames):
        if image.size != (width, height):
            raise ValueError(f"frame {index} is {image.size[0]}x{image.size[1]}, frame 0 is {width}x{height}")

    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream(video_codec(), rate=rate)
        stream.width = width
        stream.height = height
        stream.pix_fmt = _PIX_FMT
        frame_period = 1 / rate
        stream.codec_context.time_base = frame_period  # frame i has pts i: shown at i / fps seconds
        for index, image in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.asarray(image.convert("RGB")), format="rgb24")
            frame.pts = index
            frame.time_base = frame_period
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))  # flush the encoder's delayed frames
    return buffer.getvalue()


def decode_mp4(data: bytes) -> list[Image.Image]:
    """Every frame of the first video stream of the MP4 (or other FFmpeg-readable) file ``data``, in presentation
    order, as RGB PIL images of the stream's size. Raises ValueError if ``data`` is not a readable container or has
    no video stream (PyAV's errors for invalid data are ValueErrors)."""
    import av

    with av.open(io.BytesIO(data), mode="r") as container:
        if not container.streams.video:
            raise ValueError("no video stream in the data")
        stream = container.streams.video[0]
        return [Image.fromarray(frame.to_ndarray(format="rgb24")) for frame in container.decode(stream)]
