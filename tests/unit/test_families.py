"""The family table: each family is found by its pipeline class, adds only what its call takes, and an unknown
pipeline runs request by request."""

from __future__ import annotations

import pytest

from gpu_worker.families import FAMILIES, family_of
from shared.contracts import RequestSpec


class FluxPipeline:
    """Stands in for diffusers' class of that name (families are found by class name)."""


class SomeNewPipeline:
    pass


def spec(**fields: object) -> RequestSpec:
    values: dict[str, object] = {
        "id": "r",
        "model": "m",
        "prompt": "p",
        "seed": 1,
        "width": 64,
        "height": 64,
        "num_inference_steps": 4,
        "guidance_scale": 3.0,
        "created_at": 0.0,
        **fields,
    }
    return RequestSpec.model_validate(values)


def test_each_pipeline_class_belongs_to_one_family() -> None:
    classes = [name for family in FAMILIES.values() for name in family.pipeline_classes]
    assert len(classes) == len(set(classes))
    assert family_of(FluxPipeline()).name == "flux"


def test_an_unknown_pipeline_is_not_fused_and_keeps_its_name() -> None:
    family = family_of(SomeNewPipeline())
    assert family.name == "SomeNewPipeline" and not family.traits.fused
    assert family.call_kwargs(spec(true_cfg_scale=3.0), frozenset({"true_cfg_scale"})) == {"true_cfg_scale": 3.0}


def test_call_arguments_are_only_those_the_call_takes() -> None:
    flux, pixart, ltx = FAMILIES["flux"], FAMILIES["pixart"], FAMILIES["ltx-video"]
    head = spec(true_cfg_scale=4.0, max_sequence_length=64)
    assert flux.call_kwargs(head, frozenset({"true_cfg_scale", "max_sequence_length"})) == {
        "true_cfg_scale": 4.0,
        "max_sequence_length": 64,
    }
    assert flux.call_kwargs(head, frozenset()) == {}
    assert pixart.call_kwargs(spec(), frozenset({"use_resolution_binning", "clean_caption"})) == {
        "use_resolution_binning": False,
        "clean_caption": False,
    }
    video = spec(num_frames=17)
    assert ltx.call_kwargs(video, frozenset({"frame_rate"})) == {"num_frames": 17, "frame_rate": 25}
    assert ltx.call_kwargs(spec(fps=8), frozenset({"frame_rate"})) == {"num_frames": 161, "frame_rate": 8}
    assert ltx.per_prompt_kwarg == "num_videos_per_prompt" and flux.per_prompt_kwarg == "num_images_per_prompt"


@pytest.mark.parametrize("name", list(FAMILIES))
def test_traits_name_their_family(name: str) -> None:
    assert FAMILIES[name].traits.family == name and FAMILIES[name].traits.fused
