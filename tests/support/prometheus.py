"""A Prometheus exposition text read back the way the metrics tests assert on it."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(exposition: str) -> dict[str, float]:
    """Every sample of ``exposition``, by name plus its sorted labels: ``name{label=value,...}``, or ``name``."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            labels = ",".join(f"{key}={value}" for key, value in sorted(sample.labels.items()))
            found[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return found
