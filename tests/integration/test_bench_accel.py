"""``bench/gpu.sh accel`` keeps working: its CPU tiny path end to end (the real script as a subprocess), every
model and variant measured, the exact variant's deviation from stock within 1/255, the approximate ones' within
what they document, the P6 figures computed, and the batch cap each variant's times give; --docs refuses a tiny or
CPU run (its figures would overwrite the GPU's); a point past the time budget is skipped and listed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench.accel import AccelConfig, run_accel
from gpu_worker.approximations import DOCUMENTED_DEVIATION

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(300)


def test_the_cpu_tiny_run_compares_stock_exact_and_approximate(tmp_path: Path) -> None:
    out = tmp_path / "accel.json"
    done = subprocess.run(
        [
            *("bash", "bench/gpu.sh", "accel", "--device", "cpu", "--tiny", "--no-compile", "--size", "32"),
            *("--steps", "4", "--batches", "1,4", "--seconds", "0", "--torch-threads", "1"),
            *("--cache-dir", str(tmp_path / "cache"), "--out", str(out)),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert set(results["models"]) == {"sd15", "dit"}
    # each variant's bound: one request encoded alone either way is bit for bit, a batch's rows encoded alone vs
    # together within 1/255; the approximate ones add what they document (int8 weights, and DeepCache on the UNet)
    approximate = {"stock": 0, "exact": 0, "cached": DOCUMENTED_DEVIATION["deepcache"]}
    approximate["quantized"] = DOCUMENTED_DEVIATION["int8_weight"]
    approximate["approx"] = approximate["cached"] + DOCUMENTED_DEVIATION["int8_weight"]
    for model in results["models"].values():
        assert set(model) == {"stock", "exact", "cached", "quantized", "approx"}
        for name, variant in model.items():
            assert set(variant["batches"]) == {"1", "4"} and variant["knee"] in (1, 4)
            for batch, point in variant["batches"].items():
                assert point["images_per_s"] > 0 and point["calls"] >= 2
                assert point["deviation_255"] <= approximate[name] + (0 if batch == "1" else 1), (name, batch)
                assert point["solo_deviation_255"] <= 1, (name, batch)  # a fused row equals its solo run
    sd15 = results["models"]["sd15"]
    assert sd15["exact"]["applied"] == "exact" and sd15["exact"]["exact"] == "eager, prompt cache"  # --no-compile
    assert sd15["stock"]["exact"] == "eager"
    assert sd15["quantized"]["applied"] == "int8_weight weights in unet"
    assert sd15["cached"]["applied"] == "step cache deepcache:3 (rows independent of peers)"
    assert "int8_weight weights in unet" in sd15["approx"]["applied"]
    assert sd15["approx"]["batches"]["4"]["deviation_255"] > 0  # really approximate
    figures = results["figures"]
    assert figures["P6_exact_speedup_sd15_b8"] is None and figures["P6_approx_speedup_sd15_b8"] is None  # no batch 8
    assert "| sd15 (stable-diffusion, 32 px) | exact | exact | 4 |" in done.stdout
    assert "| sd15 (stable-diffusion, 32 px) | approx | step cache deepcache:3" in done.stdout
    assert "Batch cap the knee gives" in done.stdout and results["skipped"] == []


def test_docs_refuses_a_tiny_or_cpu_run_before_it_runs(tmp_path: Path) -> None:
    for cfg in (AccelConfig(device="cpu", tiny=True), AccelConfig(device="cpu"), AccelConfig(device="cuda", tiny=True)):
        with pytest.raises(RuntimeError, match="--docs records GPU figures"):
            run_accel(cfg, docs_dir=tmp_path, log=lambda line: None)
    assert list(tmp_path.iterdir()) == []  # no benchmarks.json written, nothing loaded


def test_points_past_the_budget_are_skipped_and_listed(tmp_path: Path) -> None:
    cfg = AccelConfig(device="cpu", tiny=True, budget_s=0.0, models=("sd15",), out=tmp_path / "accel.json")
    results = run_accel(cfg, log=lambda line: None)
    assert results["models"]["sd15"] == {} and results["skipped"][0].startswith("sd15 stock (at 0 s of 0 s)")
    assert len(results["skipped"]) == len(cfg.variants)
    assert all(value is None for value in results["figures"].values())


def test_unknown_models_or_variants_are_refused() -> None:
    with pytest.raises(ValueError, match="variants"):
        AccelConfig(variants=("exact",))  # no stock to compare with
    with pytest.raises(ValueError, match="sdxl"):
        AccelConfig(models=("sdxl",))


def test_a_variant_the_machine_cannot_run_is_skipped_saying_why() -> None:
    from bench.accel import figures, markdown

    point = {"images_per_s": 2.0, "deviation_255": 0}
    results = {
        "models": {
            "sd15": {
                "stock": {"family": "stable-diffusion", "side": 512, "applied": "exact", "batches": {"8": point}},
                "approx": {"skipped": "weight_quantization=fp8 needs torchao"},
            }
        }
    }
    assert figures(results)["P6_approx_speedup_sd15_b8"] is None
    assert "| sd15 | approx | - | - | skipped: weight_quantization=fp8 needs torchao | | | |" in markdown(results)


def test_a_variant_that_fails_is_skipped_saying_why_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench import accel

    monkeypatch.setitem(accel.VARIANTS, "quantized", {"weight_quantization": "fp8"})  # refused off a recent GPU
    cfg = AccelConfig(
        device="cpu",
        tiny=True,
        size=32,
        steps=1,
        batches=(1,),
        seconds=0.0,
        torch_threads=1,
        models=("sd15",),
        variants=("stock", "quantized", "cached"),
        cache_dir=tmp_path / "cache",
        out=tmp_path / "accel.json",
    )
    sd15 = run_accel(cfg, log=lambda line: None)["models"]["sd15"]
    assert sd15["quantized"]["skipped"].startswith("ValueError: weight_quantization=fp8")
    assert sd15["cached"]["batches"]["1"]["images_per_s"] > 0  # the variant after it still ran
