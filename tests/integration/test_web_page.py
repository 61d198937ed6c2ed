"""The web page (``GET /``, api/ui/) in a real headless Chromium driven by Playwright, against a real fleet: api,
scheduler and a worker running ``SimulatedGpuRunner`` (forwards of ``SIM_*`` ms in equal steps, each image weighed
by its area; no model to load).

Three requests submitted together from the form are fused into one batch: each card shows that batch, its
progress bar moves with the live events, and its image appears and loads. A large request is aborted from its card
while it runs. A second api process with API keys, serving the same fleet, shows the key field; with the key typed,
the page's event stream and image fetches send it.

Debian's ``chromium`` is used as it is (``executable_path``; no ``playwright install``): the tests skip, saying so,
only where no Chromium executable exists (``.ci/run`` installs it).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, Route, expect, sync_playwright

from shared.api_keys import ApiKey, key_table, token_hash
from tests.support.fleet import Fleet, fleet_fixture
from tests.support.processes import Service, api_up, wait_for
from tests.support.redis_server import free_port

CHROMIUM_ENV = "FUSEFLEET_CHROMIUM"
CHROMIUM_PATHS = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
PAGE_ENV = {
    "FUSEFLEET_RUNNER": "bench.runners:SimulatedGpuRunner",
    # a forward: 1 s + 300 ms per 64 x 64 px of output, in equal steps: three 64 px images at 10 steps report a
    # step every 190 ms; one 512 px image (64 units) would take 20 s, 0.4 s a step, unless aborted
    "FUSEFLEET_SIM_BASE_MS": "1000",
    "FUSEFLEET_SIM_PER_IMAGE_MS": "300",
    "FUSEFLEET_SIM_REF_SIDE": "64",
    "FUSEFLEET_MAX_NUM_SEQS": "4",
    "FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS": "300",
    "FUSEFLEET_SCHEDULER_LEASE_MS": "1500",
}
TIMEOUT_MS = 15_000
TOKEN = "ff_webpage"

RECORD_PROGRESS = """() => {
  window.progressSeen = {};
  new MutationObserver((changes) => {
    for (const change of changes) {
      const id = change.target.closest("li.card").dataset.id;
      (window.progressSeen[id] ||= []).push([change.target.value, change.target.max]);
    }
  }).observe(document.getElementById("cards"), {subtree: true, attributes: true, attributeFilter: ["value"]});
}"""
IMAGES_LOADED = """(count) => {
  const images = [...document.querySelectorAll("#cards img")];
  return images.length === count && images.every((img) => img.complete && img.naturalWidth > 0);
}"""


def chromium_path() -> str | None:
    """``$FUSEFLEET_CHROMIUM``, else the first Chromium of the usual paths or ``PATH``; None when there is none."""
    for candidate in (os.environ.get(CHROMIUM_ENV), *CHROMIUM_PATHS, shutil.which("chromium")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    path = chromium_path()
    if path is None:
        pytest.skip(
            f"no Chromium executable ({', '.join(CHROMIUM_PATHS)} or ${CHROMIUM_ENV}): "
            "`apt-get install -y chromium` (.ci/run does) to run the web page in a browser"
        )
    with sync_playwright() as playwright:
        one = playwright.chromium.launch(executable_path=path, headless=True)
        yield one
        one.close()


fleet = fleet_fixture(PAGE_ENV, "web-page-fleet")


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    one = context.new_page()
    one.set_default_timeout(TIMEOUT_MS)
    expect.set_options(timeout=TIMEOUT_MS)  # expect's own default is 5 s: short for a loaded 2-core machine
    errors: list[str] = []
    one.on("pageerror", lambda error: errors.append(str(error)))
    one.on("console", lambda message: _keep_errors(message, errors))
    yield one
    context.close()
    assert not errors, errors


def _keep_errors(message: ConsoleMessage, errors: list[str]) -> None:
    """Script errors; not Chromium's "Failed to load resource" lines for answers >= 400 (the 401s the keyed page
    gets before its key is typed): what the page does with those is asserted on the page."""
    if message.type == "error" and not message.text.startswith("Failed to load resource"):
        errors.append(message.text)


def _fill(page: Page, **fields: Any) -> None:
    for name, value in fields.items():
        page.fill(f"#{name}", str(value))


def _card_ids(page: Page) -> list[str]:
    return [str(card.get_attribute("data-id")) for card in page.locator("#cards li.card").all()]


def test_submit_watch_see_the_images_and_abort(page: Page, fleet: Fleet) -> None:  # the browser first: it may skip
    page.goto(fleet.base_url)
    expect(page.locator("#key-fieldset")).to_be_hidden()  # this api has no keys
    expect(page.locator("#fleet-workers")).to_contain_text("worker0@")  # the fleet panel read /v1/fleet
    page.evaluate(RECORD_PROGRESS)

    _fill(page, prompt="a lighthouse at dusk", num_inference_steps=10, seed=7, count=3)
    page.click("#submit")

    expect(page.locator("#cards li.card")).to_have_count(3)
    ids = _card_ids(page)
    for request_id in ids:
        expect(page.locator(f'li[data-id="{request_id}"] .status')).to_have_text("succeeded")
    page.wait_for_function(IMAGES_LOADED, arg=3)
    states = fleet.wait_done(ids)
    assert [states[rid]["seed"] for rid in ids] == [7, 8, 9]  # request k: seed + k x n
    (batch_id,) = {state["batch_id"] for state in states.values()}  # one fused forward
    for request_id in ids:
        card = page.locator(f'li[data-id="{request_id}"]')
        expect(card.locator(".meta")).to_contain_text(f"batch {batch_id[:8]} (3 requests")
        expect(card.locator(".steps")).to_have_text("10 / 10")
        expect(card.locator(".abort")).to_be_hidden()
        assert card.locator("img").get_attribute("src") == f"/v1/requests/{request_id}/images/0"
        seen = page.evaluate("(id) => window.progressSeen[id]", request_id)
        values = [value for value, _ in seen]
        assert values == sorted(values) and any(0 < value < 10 for value, _ in seen), seen  # moved, step by step

    _fill(page, prompt="a very slow one", width=512, height=512, num_inference_steps=50, count=1)
    page.click("#submit")
    expect(page.locator("#cards li.card")).to_have_count(4)
    slow = _card_ids(page)[0]  # the newest is on top
    assert slow not in ids
    card = page.locator(f'li[data-id="{slow}"]')
    page.wait_for_function(
        "(id) => (window.progressSeen[id] || []).some(([value]) => value > 0)", arg=slow, timeout=TIMEOUT_MS
    )
    expect(card.locator(".status")).to_have_text("running")

    # one more request while the slow one runs: the page reopens its stream over both, resuming the slow one after
    # its last event (Last-Event-ID); the first try is cut, and the page tries again
    tries: list[str] = []

    def cut_first_try(route: Route) -> None:
        tries.append(route.request.headers.get("last-event-id", ""))
        if len(tries) == 1:
            route.abort()
        else:
            route.continue_()

    page.route("**/v1/events?*", cut_first_try)
    seen_before = len(page.evaluate("(id) => window.progressSeen[id]", slow))
    _fill(page, prompt="a quick one", width=64, height=64, num_inference_steps=4)
    page.click("#submit")
    expect(page.locator("#cards li.card")).to_have_count(5)
    quick = _card_ids(page)[0]
    page.wait_for_function("([id, n]) => window.progressSeen[id].length > n + 1", arg=[slow, seen_before])
    assert len(tries) >= 2 and tries[0] == tries[1] and tries[0].split(",")[0], tries  # the slow one's position

    card.locator(".abort").click()
    expect(card.locator(".status")).to_have_text("aborted")
    expect(card.locator(".abort")).to_be_hidden()
    expect(card.locator(".gallery img")).to_have_count(0)
    assert fleet.wait_done([slow], timeout=10)[slow]["status"] == "aborted"
    steps = [value for value, _ in page.evaluate("(id) => window.progressSeen[id]", slow)]
    assert steps == sorted(steps), steps  # nothing replayed from the start after the reconnections
    expect(page.locator(f'li[data-id="{quick}"] .status')).to_have_text("succeeded")  # it waited for the slot
    page.wait_for_function(IMAGES_LOADED, arg=4)
    # the batches formed while the page watched: 3 fused requests, the aborted one, the quick one
    expect(page.locator("#fleet-recent-text")).to_have_text("requests per batch, oldest first: 3, 1, 1")


@pytest.fixture
def keyed_api(fleet: Fleet, tmp_path: Path) -> Iterator[str]:
    """A second api process of the same fleet, with one API key: its base URL."""
    keys = tmp_path / "keys.toml"
    keys.write_text(key_table(ApiKey(name="web", sha256=token_hash(TOKEN))))
    port = free_port()
    env = {**fleet.env, "FUSEFLEET_API_KEYS_FILE": str(keys)}
    service = Service.fusefleet("api-keys", ["api", "--port", str(port)], env, tmp_path).start()
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: api_up(base_url), 60, f"the keyed api (log: {service.log_path})")
        yield base_url
    finally:
        service.stop()


def test_with_api_keys_the_page_asks_for_one_and_sends_it(page: Page, keyed_api: str) -> None:
    page.goto(keyed_api)
    expect(page.locator("#key-fieldset")).to_be_visible()
    expect(page.locator("#key-message")).to_contain_text("needs an API key")  # the fleet panel's call was a 401
    page.fill("#api-key", TOKEN)
    page.locator("#api-key").dispatch_event("change")
    _fill(page, prompt="a key holder's fox", num_inference_steps=4)
    page.click("#submit")
    expect(page.locator("#cards li.card .status")).to_have_text("succeeded")
    page.wait_for_function(IMAGES_LOADED, arg=1)
    assert str(page.locator("#cards img").get_attribute("src")).startswith("blob:")  # fetched with the key
    expect(page.locator("#fleet-workers")).to_contain_text("worker0@")
    assert page.evaluate("() => localStorage.getItem('fusefleet.apiKey')") == TOKEN
