"""Tiny random-weight pipelines of every supported family, built offline: the demo models and the tests' models.

Not a product package: the worker imports it only to serve the demo (``FUSEFLEET_MODEL`` unset). Each family's
module builds its pipeline from the sizes in the JSON file beside it (diffusers' own test-suite components);
:mod:`demo_models.catalog` names them by family and caches them on disk. docs/models.md tells the story.
"""

from demo_models.catalog import (
    DEFAULT_DEMO_FAMILY,
    DEMO_FAMILIES,
    DEMO_MODEL_NAME,
    demo_builder,
    demo_model_dir,
    ensure_demo_model,
)

__all__ = [
    "DEFAULT_DEMO_FAMILY",
    "DEMO_FAMILIES",
    "DEMO_MODEL_NAME",
    "demo_builder",
    "demo_model_dir",
    "ensure_demo_model",
]
