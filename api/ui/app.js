// The fusefleet web page (served by api/routes/ui.py): submit requests, follow their events live, show their images,
// abort them, and a fleet panel. No framework, no build step; every call is the native API (docs/api.md), sent with
// the API key typed on the page (kept in localStorage) when there is one. The events come from GET /v1/events over
// fetch() and a stream reader, not EventSource, which cannot send the Authorization header.
"use strict";

const KEY_STORAGE = "fusefleet.apiKey";
const TERMINAL = new Set(["succeeded", "failed", "aborted"]);
const FLEET_EVERY_MS = 2000;
const RECENT_BATCHES = 24;
const MAX_IDS_PER_STREAM = 100; // the api's default max_event_ids: the rest are followed once these end
const RETRY_MS = [500, 1000, 2000, 5000, 10000];

const $ = (id) => document.getElementById(id);
const form = $("request-form");
const cards = new Map(); // request id -> card
const watch = { controller: null, positions: new Map(), retry: 0, timer: 0 };
const fleet = { last: null, recent: [] };

// --- calls ------------------------------------------------------------------------------------------------------

function storedKey() {
  try {
    return localStorage.getItem(KEY_STORAGE) || "";
  } catch {
    return ""; // storage off (private mode): the key lasts as long as the page
  }
}

function apiKey() {
  return $("api-key").value.trim(); // the field holds the key: typed, or read back from localStorage
}

async function call(path, options = {}) {
  const headers = new Headers(options.headers || {});
  const key = apiKey();
  if (key) headers.set("Authorization", `Bearer ${key}`);
  const response = await fetch(path, { ...options, headers });
  if (response.status === 401) keyRefused(await errorText(response.clone()));
  return response;
}

function fieldName(loc) {
  // ["body", "requests", 2, "width"] -> "width"; ["query", "ids"] -> "ids"
  const parts = loc.slice(loc[0] === "body" || loc[0] === "query" || loc[0] === "header" ? 1 : 0);
  if (parts[0] === "requests" && typeof parts[1] === "number") parts.splice(0, 2);
  return parts.join(".");
}

async function errorText(response) {
  try {
    const body = await response.json();
    if (typeof body.detail === "string") return body.detail;
    if (Array.isArray(body.detail)) {
      const each = body.detail.map((item) => `${fieldName(item.loc || [])}: ${item.msg}`);
      return [...new Set(each)].join("; ");
    }
  } catch {
    // not JSON: the status says it
  }
  return `HTTP ${response.status} ${response.statusText}`;
}

function keyRefused(message) {
  $("key-fieldset").hidden = false;
  $("key-message").textContent = message;
}

// --- request cards ----------------------------------------------------------------------------------------------

function addCard(id, body) {
  const el = $("card-template").content.firstElementChild.cloneNode(true);
  const card = { id, el, body, status: "", done: false, batchId: null, batchSize: null, worker: null };
  el.dataset.id = id;
  el.querySelector(".rid").textContent = id.slice(0, 8);
  el.querySelector(".rid").title = id;
  el.querySelector(".prompt").textContent = body.prompt;
  el.querySelector("progress").setAttribute("aria-label", `Progress of request ${id.slice(0, 8)}`);
  el.querySelector(".abort").setAttribute("aria-label", `Abort request ${id.slice(0, 8)}`);
  el.querySelector(".abort").addEventListener("click", () => abort(card));
  const gallery = el.querySelector(".gallery");
  for (let k = 0; k < body.n; k++) {
    const slot = document.createElement("div"); // the image's place, sized up front: nothing moves when it lands
    slot.className = "slot";
    slot.style.setProperty("--ratio", `${body.width} / ${body.height}`);
    gallery.append(slot);
  }
  cards.set(id, card);
  $("cards").prepend(el);
  $("no-requests").hidden = true;
  setStatus(card, "queued");
  setProgress(card, 0, body.num_inference_steps);
  return card;
}

function setStatus(card, status) {
  if (TERMINAL.has(card.status) && !TERMINAL.has(status)) return; // a late event of a request that ended
  card.status = status;
  card.el.dataset.status = status;
  card.el.querySelector(".status").textContent = status;
  card.el.querySelector(".abort").hidden = TERMINAL.has(status);
}

function setProgress(card, step, total) {
  const bar = card.el.querySelector("progress");
  bar.max = Math.max(total, 1);
  bar.value = Math.min(step, bar.max);
  card.el.querySelector(".steps").textContent = `${step} / ${total}`;
}

function renderMeta(card) {
  const parts = [];
  if (card.batchId) {
    parts.push(`batch ${card.batchId.slice(0, 8)} (${card.batchSize} request${card.batchSize === 1 ? "" : "s"})`);
  }
  if (card.worker) parts.push(`on ${card.worker}`);
  card.el.querySelector(".meta").textContent = parts.join(" \u00b7 ");
}

function showError(card, message) {
  card.el.querySelector(".error").textContent = message;
}

function finish(card, view) {
  card.done = true;
  setStatus(card, view.status);
  card.batchId = view.batch_id || card.batchId;
  card.batchSize = view.batch_size || card.batchSize;
  card.worker = view.worker || card.worker;
  renderMeta(card);
  setProgress(card, view.progress.step, view.progress.total);
  const gallery = card.el.querySelector(".gallery");
  if (view.status === "succeeded" && view.images.length) {
    showImages(card, view.images);
  } else {
    gallery.replaceChildren();
    if (view.error) showError(card, `${view.error.type}: ${view.error.message}`);
    else if (view.images_evicted_at) showError(card, "its images were dropped by the result store's size cap");
  }
}

function showImages(card, urls) {
  const gallery = card.el.querySelector(".gallery");
  const slots = [...gallery.children];
  urls.forEach((url, k) => {
    let slot = slots[k];
    if (!slot) {
      slot = document.createElement("div");
      slot.className = "slot";
      gallery.append(slot);
    }
    slot.style.setProperty("--ratio", `${card.body.width} / ${card.body.height}`);
    const link = document.createElement("a");
    const img = document.createElement("img");
    img.alt = `Image ${k + 1} of "${card.body.prompt}"`;
    img.width = card.body.width;
    img.height = card.body.height;
    img.decoding = "async";
    if (card.body.width < 128) img.className = "upscaled"; // shown 128 px wide: crisp pixels, not a blur
    img.addEventListener("error", () => slot.classList.add("broken"));
    link.append(img);
    slot.replaceChildren(link);
    if (apiKey()) {
      // an <img> cannot send the key: fetch the bytes with it and show them from a blob URL
      call(url)
        .then((response) => (response.ok ? response.blob() : Promise.reject(new Error(`HTTP ${response.status}`))))
        .then((blob) => {
          const local = URL.createObjectURL(blob);
          img.src = local;
          link.href = local;
        })
        .catch(() => slot.classList.add("broken"));
    } else {
      img.src = url;
      link.href = url;
    }
  });
  for (const extra of slots.slice(urls.length)) extra.remove();
}

function onEvent(name, data) {
  const card = cards.get(data.id);
  if (!card) return;
  if (name === "scheduled") {
    card.batchId = data.batch_id;
    card.batchSize = data.batch_size;
    setStatus(card, "scheduled");
  } else if (name === "running") {
    card.worker = data.worker;
    setStatus(card, "running");
  } else if (name === "progress") {
    setProgress(card, data.step, data.total);
  } else if (TERMINAL.has(name)) {
    finish(card, data);
    return;
  } else if (name === "queued") {
    setStatus(card, "queued");
  }
  renderMeta(card);
}

async function abort(card) {
  const button = card.el.querySelector(".abort");
  button.disabled = true;
  try {
    const response = await call(`/v1/requests/${encodeURIComponent(card.id)}/abort`, { method: "POST" });
    if (response.ok) {
      const answer = await response.json();
      setStatus(card, answer.status); // aborted, or running while its worker winds it down
    } else if (response.status !== 409) {
      // 409: it already ended; its terminal event is on its way
      showError(card, `abort: ${await errorText(response)}`);
    }
  } catch (error) {
    showError(card, `abort failed: ${error.message}`);
  } finally {
    button.disabled = false;
  }
}

// --- live events ------------------------------------------------------------------------------------------------

function follow() {
  // (Re)open one stream over the requests not ended yet, resuming each where it was (Last-Event-ID).
  clearTimeout(watch.timer);
  if (watch.controller) watch.controller.abort();
  watch.controller = null;
  const ids = [...cards.values()].filter((card) => !card.done).map((card) => card.id).slice(0, MAX_IDS_PER_STREAM);
  if (!ids.length) return;
  const controller = new AbortController();
  watch.controller = controller;
  readStream(ids, controller.signal).then(
    (again) => {
      if (watch.controller !== controller) return;
      watch.controller = null;
      if (again) follow();
      else if ([...cards.values()].some((card) => !card.done)) retryLater(); // closed early (Redis failed)
    },
    (error) => {
      if (watch.controller !== controller) return; // replaced by a newer stream
      watch.controller = null;
      retryLater(error.message);
    },
  );
}

function retryLater(reason) {
  if (reason) console.warn(`event stream: ${reason}`);
  watch.timer = setTimeout(follow, RETRY_MS[Math.min(watch.retry, RETRY_MS.length - 1)]);
  watch.retry += 1;
}

async function readStream(ids, signal) {
  const headers = { Accept: "text/event-stream" };
  const last = ids.map((id) => watch.positions.get(id) || "");
  if (last.some(Boolean)) headers["Last-Event-ID"] = last.join(",");
  const query = ids.map(encodeURIComponent).join(",");
  const response = await call(`/v1/events?ids=${query}`, { headers, signal, cache: "no-store" });
  if (response.status === 404) return dropUnknown(ids); // expired or deleted meanwhile
  if (!response.ok) throw new Error(await errorText(response));
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let event = { id: null, name: "", data: [] };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return false;
    buffer += value;
    const hold = buffer.endsWith("\r") ? 1 : 0; // a CR may be the first half of a CRLF
    const lines = buffer.slice(0, buffer.length - hold).split(/\r\n|\r|\n/);
    buffer = lines.pop() + buffer.slice(buffer.length - hold);
    for (const line of lines) {
      if (line === "") {
        dispatch(event, ids);
        event = { id: null, name: "", data: [] };
        continue;
      }
      if (line.startsWith(":")) continue; // a comment: ping, or why the server closes
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let text = colon < 0 ? "" : line.slice(colon + 1);
      if (text.startsWith(" ")) text = text.slice(1);
      if (field === "event") event.name = text;
      else if (field === "data") event.data.push(text);
      else if (field === "id") event.id = text;
    }
  }
}

function dispatch(event, ids) {
  if (event.id !== null) {
    // the id holds every request's position, in the order of ids (docs/api.md)
    event.id.split(",").forEach((position, i) => {
      if (position && ids[i]) watch.positions.set(ids[i], position);
    });
  }
  if (!event.data.length) return;
  watch.retry = 0;
  onEvent(event.name || "message", JSON.parse(event.data.join("\n")));
}

async function dropUnknown(ids) {
  // Which of ids the api no longer knows: those cards end; the others are followed again.
  for (const id of ids) {
    const response = await call(`/v1/requests/${encodeURIComponent(id)}`, { cache: "no-store" });
    const card = cards.get(id);
    if (response.status === 404 && card) {
      card.done = true;
      setStatus(card, "gone");
      card.el.querySelector(".abort").hidden = true;
      showError(card, "unknown or expired (deleted, or past result_ttl_s)");
    } else if (response.ok && card) {
      const view = await response.json();
      if (TERMINAL.has(view.status)) finish(card, view);
    }
  }
  return true;
}

// --- the form ---------------------------------------------------------------------------------------------------

function readFile(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result); // a data: URL, which the api takes as it is
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

async function readForm() {
  const value = (name) => form.elements.namedItem(name).value;
  const body = {
    prompt: value("prompt"),
    width: Number(value("width")),
    height: Number(value("height")),
    num_inference_steps: Number(value("num_inference_steps")),
    guidance_scale: Number(value("guidance_scale")),
    n: Number(value("n")),
  };
  if (value("negative_prompt").trim()) body.negative_prompt = value("negative_prompt");
  if (value("seed") !== "") body.seed = Number(value("seed"));
  const file = form.elements.namedItem("image").files[0];
  if (file) {
    body.image = await readFile(file);
    body.strength = Number(value("strength"));
  }
  return body;
}

async function submit(event) {
  event.preventDefault();
  const button = $("submit");
  button.disabled = true;
  $("form-error").textContent = "";
  try {
    const body = await readForm();
    const count = Number(form.elements.namedItem("count").value);
    const bodies = Array.from({ length: count }, (_, k) =>
      body.seed === undefined ? body : { ...body, seed: body.seed + k * body.n },
    );
    const single = count === 1;
    const response = await call(single ? "/v1/requests" : "/v1/requests/batch", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(single ? bodies[0] : { requests: bodies }),
    });
    if (!response.ok) {
      $("form-error").textContent = await errorText(response);
      return;
    }
    const answer = await response.json();
    const ids = single ? [answer.id] : answer.ids;
    for (let k = ids.length - 1; k >= 0; k--) addCard(ids[k], bodies[k]); // the first on top
    follow();
  } catch (error) {
    $("form-error").textContent = `not submitted: ${error.message}`;
  } finally {
    button.disabled = false;
  }
}

// --- the fleet panel --------------------------------------------------------------------------------------------

function seconds(value) {
  return value < 10 ? `${value.toFixed(1)} s` : `${Math.round(value)} s`;
}

function newBatches(sizes) {
  // Batches formed since the last read: the growth of each size's count (the view's batch_sizes are totals).
  const before = fleet.last ? fleet.last.batch_sizes : null;
  fleet.last = { batch_sizes: sizes };
  if (!before) return [];
  const formed = [];
  for (const [size, count] of Object.entries(sizes)) {
    const grew = Math.min(count - (before[size] || 0), RECENT_BATCHES);
    for (let k = 0; k < grew; k++) formed.push(Number(size));
  }
  return formed;
}

function renderFleet(view) {
  $("fleet-queue").textContent = String(view.queue_depth);
  $("fleet-oldest").textContent = view.queue_depth ? seconds(view.oldest_waiting_s) : "\u2013";
  $("fleet-inflight").textContent = String(view.batches_in_flight);
  $("fleet-rate").textContent = view.images_per_s.toFixed(2);
  fleet.recent = [...fleet.recent, ...newBatches(view.batch_sizes)].slice(-RECENT_BATCHES);
  const largest = Math.max(1, ...fleet.recent);
  $("fleet-recent").replaceChildren(
    ...fleet.recent.map((size) => {
      const bar = document.createElement("span");
      bar.className = "batch";
      bar.style.setProperty("--fill", String(size / largest));
      bar.textContent = String(size);
      return bar;
    }),
  );
  $("fleet-recent-text").textContent = fleet.recent.length
    ? `requests per batch, oldest first: ${fleet.recent.join(", ")}`
    : "none formed since this page opened";
  const rows = view.workers.map((worker) => {
    const row = document.createElement("tr");
    const held = new Set(worker.resident || []);
    const models = worker.models && worker.models.length
      ? worker.models.map((m) => (worker.models.length > 1 && !held.has(m) ? `${m} (not loaded)` : m)).join(", ")
      : worker.model;
    const cells = [worker.name, models || "(not announced)", workerNow(worker)];
    for (const text of cells) {
      const cell = document.createElement("td");
      cell.textContent = text;
      row.append(cell);
    }
    row.title = worker.pipeline || "";
    row.dataset.busy = worker.batch ? "true" : "false";
    return row;
  });
  if (!rows.length) {
    const row = document.createElement("tr");
    const cell = document.createElement("td");
    cell.colSpan = 3;
    cell.textContent = "no worker has a heartbeat";
    row.append(cell);
    rows.push(row);
  }
  $("fleet-workers").replaceChildren(...rows);
}

function workerNow(worker) {
  if (!worker.live) return `stale (last beat ${seconds(worker.last_beat_s)} ago)`;
  const batch = worker.batch;
  if (!batch) return "idle";
  const step = batch.total ? `, step ${batch.step}/${batch.total}` : "";
  return `busy: batch ${batch.batch_id.slice(0, 8)} (${batch.size} request${batch.size === 1 ? "" : "s"}${step})`;
}

async function refreshFleet() {
  try {
    if (!document.hidden) {
      const response = await call("/v1/fleet", { cache: "no-store" });
      if (response.ok) {
        renderFleet(await response.json());
        $("fleet-error").textContent = "";
      } else {
        $("fleet-error").textContent = await errorText(response);
      }
    }
  } catch (error) {
    $("fleet-error").textContent = `fleet unavailable: ${error.message}`;
  } finally {
    setTimeout(refreshFleet, FLEET_EVERY_MS);
  }
}

// --- start ------------------------------------------------------------------------------------------------------

function start() {
  const keyInput = $("api-key");
  keyInput.value = storedKey();
  if (document.documentElement.dataset.apiKeys === "on") $("key-fieldset").hidden = false;
  keyInput.addEventListener("change", () => {
    try {
      localStorage.setItem(KEY_STORAGE, apiKey());
    } catch {
      // storage off: the field still holds it
    }
    $("key-message").textContent = "";
    follow();
  });
  const image = form.elements.namedItem("image");
  image.addEventListener("change", () => {
    $("strength-row").hidden = !image.files.length;
  });
  const strength = form.elements.namedItem("strength");
  strength.addEventListener("input", () => {
    $("strength-value").textContent = strength.value;
  });
  form.addEventListener("submit", submit);
  refreshFleet();
}

start();
