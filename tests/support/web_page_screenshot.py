"""Takes docs/web-page.png: the web page in headless Chromium against a local fleet serving the tiny demo model, with
a few requests finished (their images shown) and one in progress.

    .venv/bin/python -m tests.support.web_page_screenshot [docs/web-page.png]

Run by hand when the page changes (about a minute); the tests never write the file. Needs Debian's chromium (or
``$FUSEFLEET_CHROMIUM``), like tests/integration/test_web_page.py.
"""

from __future__ import annotations

import io
import sys
import tempfile
from pathlib import Path

from PIL import Image
from playwright.sync_api import Page, ViewportSize, expect, sync_playwright

from demo_models import ensure_demo_model
from tests.integration.test_web_page import chromium_path
from tests.support.fleet import running_fleet
from tests.support.redis_server import RedisServer

VIEWPORT: ViewportSize = {"width": 1280, "height": 860}


def _submit(page: Page, **fields: object) -> None:
    for name, value in fields.items():
        page.fill(f"#{name}", str(value))
    page.click("#submit")


def take(out: Path) -> None:
    chromium = chromium_path()
    if chromium is None:
        raise SystemExit("no Chromium executable: apt-get install -y chromium (or set $FUSEFLEET_CHROMIUM)")
    with tempfile.TemporaryDirectory(prefix="ff-shot-") as tmp:
        root = Path(tmp)
        server = RedisServer(root / "redis").start()
        env = {
            "FUSEFLEET_MODEL_CACHE_DIR": str(root / "models"),
            "FUSEFLEET_MAX_NUM_SEQS": "4",
            "FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS": "300",
            "FUSEFLEET_MAX_INFERENCE_STEPS": "5000",
        }
        ensure_demo_model(root / "models")
        (root / "logs").mkdir()
        try:
            with running_fleet(server.url, root / "logs", env) as fleet, sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=chromium, headless=True)
                page = browser.new_page(viewport=VIEWPORT)
                page.set_default_timeout(600_000)  # a loaded machine is slow; the shot waits for what it shows
                expect.set_options(timeout=600_000)
                page.goto(fleet.base_url)
                expect(page.locator("#fleet-workers")).to_contain_text("worker0@")
                _submit(page, prompt="a lighthouse at dusk, oil painting", num_inference_steps=8, seed=1, count=3)
                expect(page.locator('#cards li[data-status="succeeded"]')).to_have_count(3)
                _submit(page, prompt="a red fox in the snow", n=2, seed=40, count=1)
                expect(page.locator('#cards li[data-status="succeeded"]')).to_have_count(4)
                _submit(page, prompt="a harbour at night", num_inference_steps=200, count=1)
                page.wait_for_function(
                    "() => { const bar = document.querySelector('#cards li progress');"
                    " return bar.value >= bar.max * 0.35; }"
                )
                shot = Image.open(io.BytesIO(page.screenshot()))
                # 256 colours are plenty for a page: a third of the bytes in the repository
                shot.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
                page.locator("#cards li .abort").first.click()
                expect(page.locator('#cards li[data-status="aborted"]')).to_have_count(1)
                browser.close()
        finally:
            server.stop()
    print(f"wrote {out}")


if __name__ == "__main__":
    take(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/web-page.png"))
