"""The settings of fusefleet: every knob of every service, read from ``FUSEFLEET_*`` variables.

``Settings`` composes one class per concern (``wiring``, ``batching``, ``scheduler``, ``model``, ``acceleration``,
``limits``, ``results``, ``worker``, ``api``, ``webhooks``): each holds its fields, flat
(``settings.max_num_seqs``, read from ``FUSEFLEET_MAX_NUM_SEQS``), and validates its own rules; ``Settings`` adds
the rules that tie two concerns. Each service builds ``Settings()`` once at start-up and passes it down; nothing
reads the environment elsewhere. A new setting is a field with a docstring (its description) in its concern's
module (``docs/configuration.md``).
"""

from __future__ import annotations

from typing import Self

from pydantic import model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from shared.settings.acceleration import AccelerationSettings
from shared.settings.api import ApiSettings
from shared.settings.batching import BatchingSettings, BatchOrder, SchedulingPolicy
from shared.settings.concern import ENV_PREFIX, SettingsConcern
from shared.settings.config_file import CONFIG_VARIABLE, ConfigFileError, FleetConfigFile
from shared.settings.limits import LimitSettings
from shared.settings.model import ModelSettings
from shared.settings.results import S3_ATTEMPT_SLACK_S, S3_ATTEMPTS, ResultSettings, ResultStoreName
from shared.settings.scheduler import SchedulerSettings
from shared.settings.webhooks import WebhookSettings
from shared.settings.wiring import WiringSettings
from shared.settings.worker import WorkerSettings

__all__ = [
    "CONFIG_VARIABLE",
    "ENV_PREFIX",
    "S3_ATTEMPTS",
    "S3_ATTEMPT_SLACK_S",
    "AccelerationSettings",
    "ApiSettings",
    "BatchOrder",
    "BatchingSettings",
    "ConfigFileError",
    "LimitSettings",
    "ModelSettings",
    "ResultSettings",
    "ResultStoreName",
    "SchedulerSettings",
    "SchedulingPolicy",
    "Settings",
    "SettingsConcern",
    "WebhookSettings",
    "WiringSettings",
    "WorkerSettings",
]


class Settings(
    WiringSettings,
    BatchingSettings,
    SchedulerSettings,
    ModelSettings,
    AccelerationSettings,
    LimitSettings,
    ResultSettings,
    WorkerSettings,
    ApiSettings,
    WebhookSettings,
):
    """Configuration shared by the api, the scheduler and the workers (env prefix ``FUSEFLEET_``): every concern's
    fields and rules, and the rules between concerns."""

    @classmethod
    def concerns(cls) -> tuple[type[SettingsConcern], ...]:
        """The concerns, in the order the settings reference lists them."""
        return tuple(base for base in cls.__bases__ if issubclass(base, SettingsConcern))

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Arguments, then ``FUSEFLEET_*`` variables, then the fleet config file (``FUSEFLEET_CONFIG``), then the
        defaults (``shared.settings.config_file``)."""
        return init_settings, env_settings, dotenv_settings, FleetConfigFile(settings_cls), file_secret_settings

    @model_validator(mode="after")
    def _model_batching_names_models(self) -> Self:
        unknown = [name for name in self.model_batching if name not in self.catalog]
        if unknown:
            raise ValueError(f"model_batching names {', '.join(unknown)}, not among models ({', '.join(self.catalog)})")
        return self

    @model_validator(mode="after")
    def _model_approximations_name_models(self) -> Self:
        unknown = [name for name in self.model_approximations if name not in self.catalog]
        if unknown:
            raise ValueError(
                f"model_approximations names {', '.join(unknown)}, not among models ({', '.join(self.catalog)})"
            )
        return self

    def for_model(self, name: str) -> Self:
        """These settings as a runner of model ``name`` reads them (``ModelSettings.for_model``), with the model's
        own approximate accelerations (``model_approximations``) over the fleet's."""
        settings = super().for_model(name)
        own = self.model_approximations.get(name)
        return settings.model_copy(update=own.given()) if own is not None else settings

    @model_validator(mode="after")
    def _timeouts_fit(self) -> Self:
        if self.redis_socket_timeout_s * 1000 <= self.scheduler_block_ms:
            raise ValueError(
                f"redis_socket_timeout_s ({self.redis_socket_timeout_s}) must exceed scheduler_block_ms "
                f"({self.scheduler_block_ms} ms): the scheduler's blocking read would time out"
            )
        if self.result_orphan_grace_s <= self.batch_time_limit_s + self.redis_outage_retry_s:
            raise ValueError(
                f"result_orphan_grace_s ({self.result_orphan_grace_s}) must exceed batch_time_limit_s + "
                f"redis_outage_retry_s ({self.batch_time_limit_s + self.redis_outage_retry_s}): the sweeper would "
                "delete the images of a run that may still finish"
            )
        return self
