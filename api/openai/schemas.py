"""Bodies of the OpenAI Images API and their translation into one native ``GenerateRequest``.

A call's native fields are validated by ``GenerateRequest`` itself and its limits by the shared submission path
(``api.submission.accept``): one set of bounds for both APIs. Here live only what OpenAI adds:

- ``size`` ``"WIDTHxHEIGHT"`` (``"auto"`` or absent: the native default, the demo model's 64x64), each side a
  multiple of 8 between 8 and the fleet's ``max_image_side``;
- ``model``: one of the fleet's models (``GET /v1/models``; 404 ``model_not_found`` otherwise), or absent for its
  default model;
- ``response_format`` ``b64_json`` (default) or ``url``; ``user`` / ``safety_identifier``: accepted and ignored;
- ``output_format`` ``png`` (default), ``jpeg`` or ``webp``: the native ``output_format``, which ``b64_json`` (and
  the image URLs) then carry, and which the answer reports; ``output_compression`` 0-100: the native quality of
  ``jpeg`` and ``webp``. With ``png`` (lossless) only ``100``, the value OpenAI clients send by default, is
  accepted (and dropped); any other value is a 400 naming ``output_compression``;
- OpenAI parameters this server does not implement but clients commonly send (``UNSUPPORTED``): their default or
  harmless values are accepted, any other value is a 400 naming the parameter.

Extensions beyond OpenAI's parameters, with the native meaning and bounds: ``negative_prompt``,
``num_inference_steps``, ``guidance_scale``, ``seed``, ``lora`` (``{"name", "scale"}``; in a multipart form
``lora[name]`` and ``lora[scale]``, as the ``openai`` client sends a nested ``extra_body``), ``priority``,
``timeout_s``, and ``strength`` for edits. Unknown parameters are refused.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from typing import Any, Literal

from fastapi import UploadFile, status
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from api.openai.errors import OpenAIError, invalid_request, model_not_found
from shared.contracts import DEFAULT_SIDE, OutputFormat, Task
from shared.settings import Settings
from shared.wire import GenerateRequest

ResponseFormat = Literal["b64_json", "url"]
PASSED_ON = (
    "model",
    "prompt",
    "n",
    "negative_prompt",
    "num_inference_steps",
    "guidance_scale",
    "seed",
    "priority",
    "timeout_s",
)
"""The native parameters both calls take under their native names and pass on as sent (validated natively)."""
AUTO_SIZE = "auto"
LOSSLESS_COMPRESSION = 100
"""The one ``output_compression`` accepted with ``png``: OpenAI's default, which its clients may send anyway."""
SIDE_MULTIPLE = 8
_SIZE = re.compile(r"(\d{1,6})x(\d{1,6})")


class Unsupported(BaseModel):
    """An OpenAI parameter this server does not implement: the values it accepts (as sent, lower case) and why
    others are refused."""

    model_config = ConfigDict(frozen=True)

    accepted: frozenset[str]
    reason: str


UNSUPPORTED: Mapping[str, Unsupported] = {
    "quality": Unsupported(
        accepted=frozenset({"auto", "standard"}), reason="set num_inference_steps to trade quality for speed"
    ),
    "style": Unsupported(accepted=frozenset({"vivid"}), reason="describe the style in the prompt"),
    "background": Unsupported(accepted=frozenset({"auto", "opaque"}), reason="images are opaque"),
    "moderation": Unsupported(accepted=frozenset({"auto", "low"}), reason="this server does not moderate"),
    "stream": Unsupported(
        accepted=frozenset({"false"}), reason="answers are not streamed (GET /v1/requests/{id} reports progress)"
    ),
    "partial_images": Unsupported(accepted=frozenset({"0"}), reason="answers are not streamed"),
    "input_fidelity": Unsupported(accepted=frozenset({"low"}), reason="strength sets how much of the image changes"),
}


def _token(value: Any) -> str:
    """A sent value as the lower-case text ``UNSUPPORTED`` lists: JSON ``false`` and form ``"false"`` alike."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip().lower()


class OpenAIImageParams(BaseModel):
    """What generations and edits share; unknown parameters are refused (400 ``unknown_parameter``)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(None, description="One of the fleet's models (GET /v1/models); omit it for its default.")
    size: str | None = Field(None, description="'WIDTHxHEIGHT', each side a multiple of 8; 'auto' = 64x64.")
    response_format: ResponseFormat | None = Field(None, description="b64_json (default) or url.")
    user: str | None = Field(None, description="Accepted and ignored.")
    safety_identifier: str | None = Field(None, description="Accepted and ignored.")
    quality: Any = None
    background: Any = None
    moderation: Any = None
    output_format: Any = Field(None, description="png (default), jpeg or webp.")
    output_compression: Any = Field(None, description="jpeg and webp: quality 0-100; with png only 100.")
    stream: Any = None
    partial_images: Any = None

    @property
    def answer_format(self) -> ResponseFormat:
        return self.response_format or "b64_json"

    def check(self, settings: Settings) -> None:
        """Raise the OpenAI error of a model the fleet does not have or an unsupported value; the native fields come
        next."""
        if self.model is not None and self.model not in settings.catalog:
            raise model_not_found(self.model, settings.catalog)
        for param, rule in UNSUPPORTED.items():
            value = getattr(self, param, None)
            if value is not None and _token(value) not in rule.accepted:
                accepted = ", ".join(sorted(rule.accepted))
                raise OpenAIError(
                    status.HTTP_400_BAD_REQUEST,
                    f"Unsupported value for '{param}': {value!r}. This server accepts only {accepted} ({rule.reason}).",
                    param=param,
                    code="unsupported_value",
                )

    def size_fields(self, settings: Settings) -> dict[str, int]:
        """``width`` and ``height`` of ``size``; an OpenAI 400 naming ``size`` when it is not a usable size."""
        if self.size is None or self.size.strip().lower() == AUTO_SIZE:
            return {"width": DEFAULT_SIDE, "height": DEFAULT_SIDE}
        limit = settings.max_image_side
        match = _SIZE.fullmatch(self.size.strip())
        sides = [int(side) for side in match.groups()] if match else []
        if not sides or any(side < SIDE_MULTIPLE or side > limit or side % SIDE_MULTIPLE for side in sides):
            raise OpenAIError(
                status.HTTP_400_BAD_REQUEST,
                f"Invalid value for 'size': {self.size!r}. Use 'WIDTHxHEIGHT' (or 'auto' = "
                f"{DEFAULT_SIDE}x{DEFAULT_SIDE}) with each side a multiple of {SIDE_MULTIPLE} between "
                f"{SIDE_MULTIPLE} and {limit} (this server's max_image_side).",
                param="size",
                code="invalid_value",
            )
        return {"width": sides[0], "height": sides[1]}

    def native_of(self, values: Mapping[str, Any], settings: Settings) -> GenerateRequest:
        """The native request of this call: its ``PASSED_ON`` parameters and ``values`` as given (absent or null:
        the native default), its size and its format."""
        passed_on = {name: getattr(self, name) for name in PASSED_ON}
        return native_request(
            {**_present({**passed_on, **values}), **self.size_fields(settings), **self.format_fields()}
        )

    def format_fields(self) -> dict[str, Any]:
        """The native ``output_format`` and ``output_compression`` as given (the native request validates them);
        with ``png`` an ``output_compression`` of 100 is dropped, and any other number is an OpenAI 400."""
        fields = _present({"output_format": self.output_format, "output_compression": self.output_compression})
        compression = fields.get("output_compression")
        if self.output_format in (None, OutputFormat.PNG.value) and _is_number(compression):
            if compression != LOSSLESS_COMPRESSION:
                raise OpenAIError(
                    status.HTTP_400_BAD_REQUEST,
                    f"Invalid value for 'output_compression': {compression!r}. It is the quality (0-100) of the "
                    f"jpeg and webp output formats; with output_format png (lossless) only "
                    f"{LOSSLESS_COMPRESSION} is accepted.",
                    param="output_compression",
                    code="invalid_value",
                )
            del fields["output_compression"]
        return fields


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def native_request(fields: Mapping[str, Any]) -> GenerateRequest:
    """The native request of ``fields`` (absent = native default), or an OpenAI 400 naming the parameter."""
    try:
        return GenerateRequest.model_validate(dict(fields))
    except ValidationError as exc:
        errors = [{**error, "loc": ("body", *error["loc"])} for error in exc.errors()]
        raise invalid_request(errors) from None


def _present(values: Mapping[str, Any]) -> dict[str, Any]:
    """The values that were given: JSON ``null`` (or an absent form field) means the default, as at OpenAI."""
    return {name: value for name, value in values.items() if value is not None}


class ImageGenerationRequest(OpenAIImageParams):
    """``POST /v1/images/generations`` (JSON). The native fields are passed on as sent and validated natively."""

    prompt: Any = Field(description="The text prompt (one string).")
    n: Any = Field(None, description="Images for this prompt, 1 to the server's max_images_per_request.")
    style: Any = None
    negative_prompt: Any = None
    num_inference_steps: Any = None
    guidance_scale: Any = None
    seed: Any = None
    lora: Any = Field(None, description='{"name": adapter, "scale": float} from the fleet\'s LoRA folder.')
    priority: Any = None
    timeout_s: Any = None

    def native(self, settings: Settings) -> GenerateRequest:
        self.check(settings)
        return self.native_of({"lora": self.lora}, settings)


class ImageEditForm(OpenAIImageParams):
    """``POST /v1/images/edits`` (multipart/form-data): one ``image`` file (``image[]`` with one file is the
    same), an optional ``mask`` file (white = repaint), and the generation's parameters as form fields."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    prompt: str = Field(description="The text prompt.")
    image: UploadFile | None = None
    image_list: list[UploadFile] | None = Field(None, alias="image[]")
    mask: UploadFile | None = None
    n: int | None = None
    negative_prompt: str | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    seed: int | None = None
    strength: float | None = Field(None, description="How much of the image is replaced, 0 < strength <= 1.")
    lora_name: str | None = Field(None, alias="lora[name]")
    lora_scale: float | None = Field(None, alias="lora[scale]")
    output_compression: int | None = Field(None, description="jpeg and webp: quality 0-100; with png only 100.")
    priority: int | None = None
    timeout_s: float | None = None
    input_fidelity: Any = None

    def _image_file(self) -> UploadFile:
        files = [*([self.image] if self.image is not None else []), *(self.image_list or [])]
        if not files:
            raise OpenAIError(
                status.HTTP_400_BAD_REQUEST,
                "Missing required parameter: 'image'.",
                param="image",
                code="missing_required_parameter",
            )
        if len(files) > 1:
            raise OpenAIError(
                status.HTTP_400_BAD_REQUEST,
                f"Invalid value for 'image': {len(files)} images; this server edits one image per request.",
                param="image",
                code="invalid_value",
            )
        return files[0]

    async def native(self, settings: Settings) -> GenerateRequest:
        """The native image-conditioned request: the uploads as base64 ``image`` and ``mask_image``."""
        self.check(settings)
        image = await self._image_file().read()
        mask = await self.mask.read() if self.mask is not None else None
        lora: dict[str, Any] | None = None
        if self.lora_name is not None or self.lora_scale is not None:
            lora = _present({"name": self.lora_name, "scale": self.lora_scale})
        inputs = {
            "image": base64.b64encode(image).decode(),
            "mask_image": base64.b64encode(mask).decode() if mask is not None else None,
            "strength": self.strength,
            "lora": lora,
        }
        return self.native_of(inputs, settings)


class ImageObject(BaseModel):
    """One generated image: ``b64_json`` (its bytes in the request's ``output_format``, base64) or ``url``
    (absolute, the native image URL)."""

    b64_json: str | None = None
    url: str | None = None


class ImagesResponse(BaseModel):
    """OpenAI's answer: ``created`` (unix seconds), one entry per image, in order, and the images'
    ``output_format`` (as OpenAI's gpt-image answers have it)."""

    created: int
    data: list[ImageObject]
    output_format: OutputFormat | None = None


class ModelObject(BaseModel):
    """One model in OpenAI's shape, with what the fleet adds: its family, its tasks, how many live workers serve it
    and whether any of them holds it loaded now (``resident``: a worker of several models may keep only some loaded,
    ``max_resident_models``). ``family`` is None and ``tasks`` empty while none does."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "fusefleet"
    family: str | None = None
    tasks: list[Task] = Field(default_factory=list)
    workers: int = 0
    resident: bool = False


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelObject]
