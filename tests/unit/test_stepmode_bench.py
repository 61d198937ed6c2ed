"""The pure parts of ``python -m bench stepmode``: rates, load points, ratios and figures, tables, the docs files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.loadgen import LoadSpec
from bench.stepmode import (
    SECTION,
    STEP_COST,
    StepBenchConfig,
    capacity_rps,
    docs_section,
    figures_of,
    load_spec,
    markdown,
    offered_rates,
    ratios,
    replace_section,
    trace_stats,
    verdict,
    write_docs,
)

LOADS = [0.5, 0.8, 1.1]


def _summary(rps: float, p99: float | None, p50: float | None = 0.5, failed: int = 0) -> dict[str, Any]:
    return {
        "throughput_rps": rps,
        "images_per_s": rps,
        "latency_s": {"p50": p50, "p99": p99},
        "requests": 10 + failed,
        "succeeded": 10,
        "per_forward": 4.0,
    }


def _points() -> dict[str, list[dict[str, Any]]]:
    return {
        "step": [_summary(2.9, 1.5), _summary(4.7, 1.8), _summary(6.0, 3.0)],
        "strict": [_summary(2.9, 3.0), _summary(4.6, 4.0), _summary(2.0, 60.0)],
        "grouped": [_summary(2.9, 2.5), _summary(4.7, 3.6), _summary(5.0, 9.0, failed=2)],
    }


def _results() -> dict[str, Any]:
    workloads = {
        workload: {
            "steps": steps,
            "guidance": guidance,
            "cpu_busy": [0.3, 0.4, 0.5],
            "points": _points(),
            "ratios": [ratios(_points(), index) for index in range(3)],
        }
        for workload, steps, guidance in (("homog", [20], [7.5]), ("t2i_i2i", [4, 28], [3.5]))
    }
    return {
        "simulated": True,
        "started": "2026-12-01 10:00:00 UTC",
        "duration_s": 500.0,
        "cost_model_ms": {"a": 531.4, "b": 103.5, "ref_side": 512, "ref_steps": 20},
        "batch": 8,
        "wait_ms": 20.0,
        "seconds": 25.0,
        "capacity_rps": 5.885,
        "loads": LOADS,
        "rates": offered_rates(5.885, LOADS),
        "workloads": workloads,
        "figures": figures_of(workloads, LOADS),
    }


def test_capacity_is_request_level_homogeneous_full_batches() -> None:
    t8 = (531.4 + 103.5 * 8) / 1000
    assert STEP_COST.ref_steps == 20
    assert capacity_rps(STEP_COST, 8) == pytest.approx(8 / t8)
    assert offered_rates(10.0, LOADS) == pytest.approx([5.0, 8.0, 11.0])


def test_load_points_are_the_same_for_every_system_and_mix_steps_and_guidance() -> None:
    homog = load_spec("homog", rate=4.0, seconds=25.0)
    assert (homog.pattern, homog.rate, homog.count, homog.seed) == ("poisson", 4.0, 100, 0)
    assert {(p["num_inference_steps"], p["guidance_scale"], p["width"]) for p in map(homog.params, range(8))} == {
        (20, 7.5, 512)
    }
    mixed = load_spec("mixed", rate=4.0, seconds=25.0)
    keys = [(mixed.params(i)["num_inference_steps"], mixed.params(i)["guidance_scale"]) for i in range(8)]
    assert keys[:4] == [(10, 5.0), (20, 5.0), (10, 7.5), (20, 7.5)] and keys[4:] == keys[:4]
    assert all(a != b for a, b in zip(keys, keys[1:], strict=False))  # no two neighbours share a key
    assert mixed == load_spec("mixed", rate=4.0, seconds=25.0)  # same seed: the same arrivals


def test_load_spec_without_choices_keeps_its_steps_and_guidance() -> None:
    spec = LoadSpec(steps=6, guidance_scale=3.0)
    assert {(spec.params(i)["num_inference_steps"], spec.params(i)["guidance_scale"]) for i in range(5)} == {(6, 3.0)}


def test_ratios_and_figures() -> None:
    points = _points()
    at_80 = ratios(points, 1)
    assert at_80["p99_vs_strict"] == pytest.approx(1.8 / 4.0)
    assert at_80["p99_vs_grouped"] == pytest.approx(1.8 / 3.6)
    assert at_80["tput_vs_strict"] == pytest.approx(4.7 / 4.6)
    assert at_80["p50_vs_grouped"] == pytest.approx(1.0)
    workloads = {"homog": {"points": points}, "t2i_i2i": {"points": points}}
    assert figures_of(workloads, LOADS) == {
        "step_p99_ratio_80": pytest.approx(0.45),
        "step_homog_tput_110": pytest.approx(3.0),
        "step_mixed_tput": pytest.approx(3.0),
    }
    assert figures_of({"homog": {"points": points}}, [0.5, 0.8]) == {"step_p99_ratio_80": pytest.approx(0.45)}
    assert figures_of(workloads, [0.5]) == {}  # neither point ran
    points["strict"][1] = _summary(0.0, None, p50=None)  # nothing succeeded: no ratio
    assert ratios(points, 1)["p99_vs_strict"] is None
    assert "step_p99_ratio_80" not in figures_of({"homog": {"points": points}}, LOADS)


def test_verdicts_follow_the_goals() -> None:
    assert verdict("step_p99_ratio_80", 0.75) == "met" and verdict("step_p99_ratio_80", 0.76) == "missed"
    assert verdict("step_mixed_tput", 2.0) == "met" and verdict("step_mixed_tput", 1.99) == "missed"
    assert verdict("step_homog_tput_110", 1.0) == "met" and verdict("step_homog_tput_110", 0.99) == "missed"


def test_markdown_tables_say_simulated() -> None:
    text = markdown(_results())
    assert text.startswith("SIMULATED GPU")
    assert "| load | offered req/s | step | strict | grouped | CPU busy |" in text
    assert "| 80% | 4.71 | 4.70 · 0.50 s · 1.80 s | 4.60 · 0.50 s · 4.00 s | 4.70 · 0.50 s · 3.60 s | 40% |" in text
    assert "(2 failed)" in text
    assert "| 80% | 0.450 | 0.500 | 1.022 | 1.000 |" in text
    assert "| `step_p99_ratio_80` | <= 0.75 | **0.450** | met |" in text
    assert "| `step_mixed_tput` | >= 2.0 | **3.000** | met |" in text


def test_the_docs_section_is_replaced_in_place_or_appended() -> None:
    section = docs_section(_results())
    assert section.startswith(SECTION + "\n") and "simulated" in section
    document = "# Benchmarks\n\nintro\n\n## Priorities\n\ntext\n"
    appended = replace_section(document, section)
    assert appended.startswith(document) and appended.endswith(section.rstrip("\n") + "\n")
    assert replace_section(appended, section) == appended  # idempotent
    middle = document.replace("## Priorities", f"{SECTION}\n\nold figures\n\n## Priorities")
    replaced = replace_section(middle, section)
    assert "old figures" not in replaced and replaced.count(SECTION) == 1
    assert replaced.index(SECTION) < replaced.index("## Priorities") and replaced.endswith("## Priorities\n\ntext\n")
    assert replace_section("", section) == section.rstrip("\n") + "\n"


def test_write_docs_keeps_other_figures(tmp_path: Path) -> None:
    (tmp_path / "benchmarks.json").write_text(json.dumps({"P1": 0.5}))
    (tmp_path / "benchmarks.md").write_text("# Benchmarks\n")
    write_docs(_results(), tmp_path)
    figures = json.loads((tmp_path / "benchmarks.json").read_text())
    assert figures["P1"] == 0.5
    assert figures["step_p99_ratio_80"] == 0.45 and figures["step_mixed_tput"] == 3.0
    stepmode = figures["stepmode"]
    assert stepmode["simulated"] is True and stepmode["loads"] == LOADS
    assert stepmode["points"]["homog"]["strict"][1] == {"load": 0.8, "rps": 4.6, "p50_s": 0.5, "p99_s": 4.0}
    assert SECTION in (tmp_path / "benchmarks.md").read_text()
    assert (tmp_path / "bench" / "stepmode_t2i_i2i.png").stat().st_size > 0


def test_trace_stats_read_steps_and_forwards() -> None:
    steps = [
        {"start": 0.0, "end": 0.1, "rows": 2, "finished": 0},
        {"start": 0.11, "end": 0.2, "rows": 4, "finished": 1},
    ]
    stats = trace_stats(steps)
    assert stats["forwards"] == 2 and stats["per_forward"] == 3.0
    assert stats["forward_gap_ms_p50"] == pytest.approx(10.0)
    assert trace_stats([{"start": 0.0, "end": 1.0, "images": 8}])["per_forward"] == 8.0
    assert trace_stats([])["per_forward"] is None


def test_config_refuses_what_cannot_run() -> None:
    with pytest.raises(ValueError, match="loads"):
        StepBenchConfig(loads=())
    with pytest.raises(ValueError, match="seconds"):
        StepBenchConfig(seconds=0)
    with pytest.raises(ValueError, match="workloads"):
        StepBenchConfig(workloads=("bursty",))  # type: ignore[arg-type]
