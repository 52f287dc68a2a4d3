// The generation playground: a prompt goes to /v2/models/<model>/generate_stream; each
// Server-Sent Event is one denoising step (a preview, drawn as it arrives); the last one
// carries the PNG and parameters.steps_used. The fields beyond prompt, steps and seed
// follow the model: its metadata's inputs (negative_prompt, width, height) and its
// config's parameters (sordino_image_to_image: an image upload and a strength; the
// default size and steps; the size multiple its UNet needs). ?model=NAME picks the
// model. window.playground exposes the state for tests (done, steps seen, latency,
// error, the model's fields).
"use strict";
(function () {
  const state = {
    running: false, done: false, steps: 0, latencyMs: null, error: null, png: null,
    fields: [], described: false,
  };
  window.playground = state;
  const $ = (id) => document.getElementById(id);
  const OPTIONAL = ["negative", "width", "height", "image", "strength"];
  // Values the user typed are kept; the model's defaults fill only the others.
  const touched = new Set();

  // The model's size (width / height) when it takes one, else a square.
  function aspect() {
    if (!state.fields.includes("width")) return 1;
    const width = Number($("width").value) || 1;
    const height = Number($("height").value) || width;
    return height / width;
  }

  // Gray values (digits) or RGB triples (an export), row-major, of the model's aspect.
  function draw(values) {
    const canvas = $("canvas");
    const channels = state.fields.includes("width") ? 3 : 1;
    const pixels = values.length / channels;
    const ratio = aspect();
    const width = Math.max(1, Math.round(Math.sqrt(pixels / ratio)));
    const height = Math.max(1, Math.round(pixels / width));
    canvas.height = Math.round(canvas.width * ratio);
    const ctx = canvas.getContext("2d");
    const image = ctx.createImageData(width, height);
    for (let i = 0; i < width * height; i++) {
      for (let c = 0; c < 3; c++) image.data[4 * i + c] = values[i * channels + (channels === 3 ? c : 0)];
      image.data[4 * i + 3] = 255;
    }
    const off = document.createElement("canvas");
    off.width = width;
    off.height = height;
    off.getContext("2d").putImageData(image, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(off, 0, 0, canvas.width, canvas.height);
  }

  function show(event, started) {
    const params = event.parameters || {};
    // Several images (num_images): the first is drawn and shown.
    const png = Array.isArray(event.png) ? event.png[0] : event.png;
    if (event.image && !(event.png && Array.isArray(event.png))) draw(event.image);
    if (png) {
      state.latencyMs = performance.now() - started;
      state.png = png;
      $("png").src = "data:image/png;base64," + png;
      $("progress").textContent = `done: ${params.steps_used} steps`;
      $("result").textContent =
        `${state.latencyMs.toFixed(0)} ms, seed ${params.seed}, ${params.source}` +
        (params.degraded ? " (degraded under load)" : "");
      state.done = true;
    } else {
      state.steps = params.step;
      $("progress").textContent = `step ${params.step} of ${params.steps}`;
    }
  }

  // A failed prompt must not leave the previous prompt's image looking like its answer.
  function clearImage() {
    state.png = null;
    $("png").removeAttribute("src");
    const canvas = $("canvas");
    canvas.getContext("2d").clearRect(0, 0, canvas.width, canvas.height);
  }

  async function getJson(url) {
    const response = await fetch(url);
    if (!response.ok) return null;
    return response.json();
  }

  // Show the fields the model takes; a model the server does not know shows none.
  async function describe() {
    const model = encodeURIComponent($("model").value);
    const [metadata, config] = await Promise.all([
      getJson(`/v2/models/${model}`).catch(() => null),
      getJson(`/v2/models/${model}/config`).catch(() => null),
    ]);
    const inputs = new Set(((metadata && metadata.inputs) || []).map((i) => i.name));
    const settings = (config && config.parameters) || {};
    const setting = (key) => (settings[`sordino_${key}`] || {}).string_value;
    const fields = [];
    if (inputs.has("negative_prompt")) fields.push("negative");
    if (inputs.has("width") && inputs.has("height")) fields.push("width", "height");
    if (inputs.has("image") && setting("image_to_image") === "true") fields.push("image", "strength");
    state.fields = fields;
    for (const name of OPTIONAL) $(`${name}-field`).hidden = !fields.includes(name);
    const multiple = setting("size_multiple");
    for (const side of ["width", "height"]) {
      if (multiple) $(side).step = multiple;
      if (multiple) $(side).min = multiple;
      const preset = setting(`${side}_default`);
      if (preset && fields.includes(side) && !touched.has(side)) $(side).value = preset;
    }
    const steps = setting("steps_default");
    if (steps && !touched.has("steps")) $("steps").value = steps;
    state.described = true;
  }

  function readFile(file) {
    return new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(reader.result);
      reader.onerror = () => reject(new Error(`cannot read ${file.name}`));
      reader.readAsDataURL(file);
    });
  }

  async function requestBody() {
    const body = { prompt: $("prompt").value, steps: Number($("steps").value) };
    if ($("seed").value !== "") body.seed = Number($("seed").value);
    const fields = state.fields;
    if (fields.includes("negative") && $("negative").value !== "") {
      body.negative_prompt = $("negative").value;
    }
    const file = fields.includes("image") && $("image").files && $("image").files[0];
    if (file) {
      // Image to image answers at the image's size: width and height stay out.
      body.image = await readFile(file);
      body.strength = Number($("strength").value);
    } else if (fields.includes("width")) {
      if ($("width").value !== "") body.width = Number($("width").value);
      if ($("height").value !== "") body.height = Number($("height").value);
    }
    return body;
  }

  async function generate(evt) {
    evt.preventDefault();
    if (state.running) return;
    Object.assign(state, { running: true, done: false, steps: 0, latencyMs: null, error: null });
    $("result").textContent = "";
    $("result").className = "";
    clearImage();
    const model = encodeURIComponent($("model").value);
    const started = performance.now();
    try {
      const body = await requestBody();
      const response = await fetch(`/v2/models/${model}/generate_stream`, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body),
      });
      if (!response.ok) {
        const answer = await response.json().catch(() => ({}));
        throw new Error(answer.error || `the server answered ${response.status}`);
      }
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffered = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffered += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buffered.indexOf("\n\n")) >= 0) {
          const line = buffered.slice(0, cut).trim();
          buffered = buffered.slice(cut + 2);
          if (!line.startsWith("data:")) continue;
          const event = JSON.parse(line.slice(5));
          if (event.error) throw new Error(event.error);
          show(event, started);
        }
      }
      if (!state.done) throw new Error("the stream ended without an image");
    } catch (err) {
      state.error = String(err.message || err);
      clearImage();
      $("result").textContent = state.error;
      $("result").className = "error";
      $("progress").textContent = "failed";
    } finally {
      state.running = false;
    }
  }

  $("form").addEventListener("submit", generate);
  for (const id of ["steps", "width", "height"]) {
    $(id).addEventListener("input", () => touched.add(id));
  }
  $("model").addEventListener("change", () => {
    state.described = false;
    describe().catch(() => undefined);
  });
  const asked = window.location && new URLSearchParams(window.location.search).get("model");
  if (asked) $("model").value = asked;
  describe().catch(() => undefined);
})();
