"""The model a worker serves and the runner that turns its batches into images."""

from __future__ import annotations

from pydantic import Field

from shared.settings.concern import OptionalUserPath, SettingsConcern, UserPath, default_cache_dir


class ModelSettings(SettingsConcern):
    """The pipeline (a diffusers model or a tiny demo), the runner, the device and the LoRA adapters."""

    section = "Model and runner"

    model: str | None = None
    """Local path or hub id of a diffusers text-to-image pipeline; unset = the built-in tiny demo model."""

    demo_family: str = "stable-diffusion"
    """Which tiny random-weight demo pipeline a worker serves when no model is set, by family name (docs/models.md
    lists them; its outputs are noise)."""

    model_cache_dir: UserPath = Field(default_factory=default_cache_dir)
    """Folder where the demo model is built once and cached (shared by all workers of a host)."""

    runner: str = "gpu_worker.diffusers_runner:DiffusersRunner"
    """Import path 'module:Class' of the batch runner the worker uses (custom pipelines, tests)."""

    fused: bool | None = None
    """Force the fused path on (true) or off (false); unset = fused only for pipeline classes known to accept prompt and
    generator lists."""

    device: str = "auto"
    """torch device for the pipeline: 'auto' (cuda when present), 'cpu', 'cuda'."""

    torch_dtype: str = "auto"
    """'auto' (float16 on cuda, float32 on cpu), 'float32', 'float16', 'bfloat16'."""

    torch_threads: int | None = Field(None, ge=1)
    """torch.set_num_threads in the worker; unset = torch's default."""

    lora_dir: OptionalUserPath = None
    """Folder of LoRA adapters, one sub-folder per adapter name (diffusers save_lora_weights)."""

    @property
    def model_id(self) -> str:
        """The id of the one model this fleet serves, as requests and workers name it: ``model`` or ``demo``."""
        return self.model or "demo"
