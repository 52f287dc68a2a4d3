// The generation playground: a prompt goes to /v2/models/<model>/generate_stream; each
// Server-Sent Event is one denoising step (a 32x32 preview, drawn as it arrives); the
// last one carries the PNG and parameters.steps_used. window.playground exposes the
// state for tests (done, steps seen, latency, error).
"use strict";
(function () {
  const state = { running: false, done: false, steps: 0, latencyMs: null, error: null, png: null };
  window.playground = state;
  const $ = (id) => document.getElementById(id);

  function draw(values) {
    const canvas = $("canvas");
    const side = Math.round(Math.sqrt(values.length));
    const ctx = canvas.getContext("2d");
    const image = ctx.createImageData(side, side);
    for (let i = 0; i < values.length; i++) {
      image.data[4 * i] = image.data[4 * i + 1] = image.data[4 * i + 2] = values[i];
      image.data[4 * i + 3] = 255;
    }
    const off = document.createElement("canvas");
    off.width = off.height = side;
    off.getContext("2d").putImageData(image, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(off, 0, 0, canvas.width, canvas.height);
  }

  function show(event, started) {
    const params = event.parameters || {};
    if (event.image) draw(event.image);
    if (event.png) {
      state.latencyMs = performance.now() - started;
      state.png = event.png;
      $("png").src = "data:image/png;base64," + event.png;
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

  async function generate(evt) {
    evt.preventDefault();
    if (state.running) return;
    Object.assign(state, { running: true, done: false, steps: 0, latencyMs: null, error: null });
    $("result").textContent = "";
    $("result").className = "";
    clearImage();
    const body = { prompt: $("prompt").value, steps: Number($("steps").value) };
    if ($("seed").value !== "") body.seed = Number($("seed").value);
    const model = encodeURIComponent($("model").value);
    const started = performance.now();
    try {
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
})();
