// sordino dashboard: polls GET /v2/sordino/telemetry (the JSON `sordino monitor` reads too)
// once a second and draws it with uPlot (vendored beside this file).
"use strict";

(function () {
  const SECONDS = 300;
  const PALETTE = ["#2f6fed", "#e8590c", "#2b8a3e", "#ae3ec9", "#c92a2a", "#0b7285", "#5f3dc4", "#e67700"];
  const state = { ready: false, updates: 0, memoryUpdates: 0, failures: 0, last: null, charts: {}, shapes: {} };
  window.sordino = state;

  const $ = (id) => document.getElementById(id);
  const fmt = (v, digits = 1) => (v === null || v === undefined ? "n/a" : Number(v).toFixed(digits));
  const mb = (v) => (v === null || v === undefined ? null : v / 1048576);
  const time = (t) => new Date(t * 1000).toLocaleTimeString();
  const pad = (n) => String(n).padStart(2, "0");

  // The x axis shows the time of day only (every chart spans minutes, never days), with
  // seconds when ticks are under a minute apart, and at least 80 px between ticks:
  // uPlot's default two-line date and time labels overlapped in a chart this narrow.
  function clockLabels(u, ticks, axisIdx, space, incr) {
    return ticks.map((t) => {
      const d = new Date(t * 1000);
      const hm = `${pad(d.getHours())}:${pad(d.getMinutes())}`;
      return incr < 60 ? `${hm}:${pad(d.getSeconds())}` : hm;
    });
  }
  const X_AXIS = { space: 80, values: clockLabels };
  state.clockLabels = clockLabels;

  // Align per-model columns on the union of their seconds (models load at different times).
  function align(models, columns) {
    const ts = new Set();
    models.forEach((m) => m.series.t.forEach((t) => ts.add(t)));
    const xs = Array.from(ts).sort((a, b) => a - b);
    const index = new Map(xs.map((t, i) => [t, i]));
    const data = [xs];
    const labels = [];
    models.forEach((m) => {
      columns.forEach(([column, suffix]) => {
        const ys = new Array(xs.length).fill(null);
        m.series.t.forEach((t, i) => { ys[index.get(t)] = m.series[column][i]; });
        data.push(ys);
        labels.push(m.name + (suffix ? " " + suffix : ""));
      });
    });
    return { data, labels };
  }

  function width(el) { return Math.max(320, el.clientWidth || 540); }

  function draw(name, el, labels, data, opts = {}) {
    const shape = labels.join("|");
    let chart = state.charts[name];
    if (chart && state.shapes[name] === shape) {
      chart.setData(data);
      return chart;
    }
    if (chart) chart.destroy();
    const series = [{}].concat(labels.map((label, i) => Object.assign({
      label,
      stroke: PALETTE[i % PALETTE.length],
      width: 1.5,
      spanGaps: false,
      points: { show: false },
    }, (opts.series && opts.series[i]) || {})));
    chart = new uPlot({
      width: width(el),
      height: 220,
      series,
      axes: (opts.axes || [{}, { size: 60 }]).map((axis, i) => (i === 0 ? Object.assign({}, X_AXIS, axis) : axis)),
      scales: opts.scales || { x: { time: true } },
      legend: { live: true },
    }, data, el);
    state.charts[name] = chart;
    state.shapes[name] = shape;
    return chart;
  }

  function busyWorkers(w) {
    return w.busy_mean === undefined || w.busy_mean === null ? String(w.busy) : w.busy_mean.toFixed(1);
  }

  function figures(snap) {
    const res = snap.resources.current;
    const w = snap.workers || {};
    const items = [
      ["models", String(snap.models.length)],
      ["process RSS", fmt(mb(res.rss_bytes), 0) + " MB"],
      ["CPU temperature", res.cpu_temp_c === null ? "n/a" : fmt(res.cpu_temp_c) + " °C"],
      ["pool in use", res.pool_in_use_bytes === null ? "no pool" : fmt(mb(res.pool_in_use_bytes)) + " MB"],
      ["fragmentation", res.fragmentation === null ? "no pool" : fmt(res.fragmentation * 100) + " %"],
      // The mean over the last seconds, as `sordino monitor` shows it (busy_workers).
      ["workers busy", w.instances === undefined ? "n/a" : `${busyWorkers(w)}/${w.instances}`],
    ];
    (snap.resources.gpus || []).forEach((g) => {
      items.push([`GPU ${g.index} memory`, fmt(mb(g.memory_used_bytes), 0) + " MB"]);
      if (g.temperature_c !== null) items.push([`GPU ${g.index} temperature`, fmt(g.temperature_c) + " °C"]);
    });
    snap.models.forEach((m) => {
      const c = m.current || {};
      items.push([m.name, `${fmt(c.qps)} qps · p99 ${fmt(c.p99_ms, 2)} ms`]);
    });
    $("figures").innerHTML = items.map(([l, v]) =>
      `<div class="figure"><div class="label">${escape(l)}</div><div class="value">${escape(v)}</div></div>`).join("");
  }

  function escape(s) {
    return String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
  }

  function events(snap) {
    const rows = snap.events.slice(-15).reverse();
    $("events").querySelector("tbody").innerHTML = rows.map((e) =>
      `<tr class="${e.kind.startsWith("chaos") ? "chaos" : ""}"><td>${time(e.t)}</td>` +
      `<td class="kind">${escape(e.kind)}</td><td>${escape(e.subject)}</td><td>${escape(e.cause)}</td></tr>`).join("");
    const kinds = Array.from(new Set(snap.events.map((e) => e.kind))).sort();
    const xs = snap.events.map((e) => e.t);
    const ys = snap.events.map((e) => kinds.indexOf(e.kind));
    const order = xs.map((_, i) => i).sort((a, b) => xs[a] - xs[b]);
    const end = snap.time || Date.now() / 1000;
    draw("events", $("chart-events"), ["event"], [order.map((i) => xs[i]), order.map((i) => ys[i])], {
      series: [{ paths: () => null, points: { show: true, size: 9, fill: "#e8590c" } }],
      scales: { x: { time: true, range: () => [end - SECONDS, end + 1] }, y: { range: [-0.5, Math.max(kinds.length - 0.5, 0.5)] } },
      axes: [{}, { size: 130, splits: () => kinds.map((_, i) => i), values: (u, ticks) => ticks.map((v) => kinds[v] || "") }],
    });
  }

  function memory(snap) {
    const s = snap.resources.series;
    const data = [s.t, s.rss_bytes.map(mb), s.pool_reserved_bytes.map(mb), s.pool_in_use_bytes.map(mb), s.fragmentation];
    draw("memory", $("chart-memory"), ["RSS MB", "pool reserved MB", "pool in use MB", "fragmentation"], data, {
      series: [{}, {}, {}, { scale: "ratio", dash: [4, 3] }],
      scales: { x: { time: true }, ratio: { range: [0, 1] } },
      axes: [{}, { size: 60 }, { side: 1, scale: "ratio", grid: { show: false } }],
    });
    const hasPool = s.pool_reserved_bytes.some((v) => v !== null);
    $("memory-note").textContent = hasPool ? "" : "No memory pool reports to this server: pool and fragmentation lines stay empty.";
  }

  function mib(v) {
    return v === null || v === undefined ? "–" : (v / 1048576).toFixed(1) + " MiB";
  }

  function pct(v) {
    return v === null || v === undefined ? "–" : (100 * v).toFixed(1) + " %";
  }

  function memoryView(doc) {
    const rows = [];
    const a = doc.arena;
    if (a) rows.push(["arena", a.name, mib(a.in_use_bytes), mib(a.reserved_bytes), mib(a.peak_bytes), pct(a.fragmentation), `largest free ${mib(a.largest_free)}, ${a.waiting} waiting`]);
    (doc.tiers || []).forEach((t) => rows.push(["tier", `${t.tier}/${t.lifetime}`, mib(t.in_use_bytes), mib(t.reserved_bytes), mib(t.peak_bytes), pct(t.fragmentation), `${t.chunks} chunks`]));
    (doc.owners || []).forEach((o) => rows.push(["owner", o.owner, mib(o.in_use_bytes), o.quota_bytes ? mib(o.quota_bytes) : "no quota", mib(o.peak_bytes), "–", `${o.waits} waits, ${o.rejections} refused`]));
    (doc.workers || []).forEach((w) => rows.push(["worker", `${w.model}:${w.version}#${w.instance}`, mib(w.rss_bytes), "–", "–", "–", `RSS; CPU arena ${w.cpu_arena}; GPU ${w.gpu}`]));
    (doc.nodes || []).forEach((n) => {
      const a = n.arena;
      rows.push(["node", `${n.node.slice(0, 12)} (${n.address})`, mib(a.in_use_bytes), mib(a.reserved_bytes), mib(a.peak_bytes), pct(a.fragmentation), `largest free ${mib(a.largest_free)}, ${n.batches} batches`]);
      n.owners.filter((o) => o.quota_bytes || o.in_use_bytes).forEach((o) => rows.push(["node-owner", `${n.node.slice(0, 12)} ${o.owner}`, mib(o.in_use_bytes), o.quota_bytes ? mib(o.quota_bytes) : "no quota", mib(o.peak_bytes), "–", `${o.waits} waits, ${o.rejections} refused`]));
    });
    (doc.plans || []).forEach((p) => rows.push(["plan", p.model, mib(p.planned_peak_bytes), "–", mib(p.max_planned_peak_bytes), "–", `naive ${mib(p.naive_bytes)} for ${p.steps} steps`]));
    $("memory-table").querySelector("tbody").innerHTML = rows.map((r) =>
      `<tr class="memory-${escape(r[0])}">` + r.map((c) => `<td>${escape(c)}</td>`).join("") + "</tr>").join("");
    const p = doc.pool;
    $("memory-pool").textContent = !p ? "" : p.auto
      ? `pool auto ${mib(p.capacity_bytes)} (target ${mib(p.target_bytes)}, predicted peak ${mib(p.predicted_peak_bytes)}, real peak ${mib(p.observed_peak_bytes)}), ${p.resizes} resizes`
      : `pool ${mib(p.capacity_bytes)} fixed · strategy ${doc.strategy}`;
    state.memoryUpdates += 1;
  }

  async function pollMemory() {
    try {
      const response = await fetch("/v2/sordino/memory", { cache: "no-store" });
      if (response.ok) memoryView(await response.json());
    } catch (err) {
      // the telemetry poll reports an unreachable server
    }
  }

  function render(snap) {
    const models = snap.models;
    $("server").textContent = `${snap.server.name} ${snap.server.version} · up since ${time(snap.server.started_at)}`;
    figures(snap);
    let a = align(models, [["qps", ""]]);
    draw("qps", $("chart-qps"), a.labels, a.data);
    a = align(models, [["p50_ms", "p50"], ["p99_ms", "p99"]]);
    draw("latency", $("chart-latency"), a.labels, a.data, {
      series: a.labels.map((l, i) => ({ stroke: PALETTE[Math.floor(i / 2) % PALETTE.length], dash: i % 2 ? undefined : [4, 3] })),
    });
    a = align(models, [["batch_size", ""]]);
    draw("batch", $("chart-batch"), a.labels, a.data, { series: a.labels.map(() => ({ points: { show: true, size: 3 } })) });
    a = align(models, [["errors", ""]]);
    draw("errors", $("chart-errors"), a.labels, a.data);
    memory(snap);
    events(snap);
  }

  async function poll() {
    try {
      const response = await fetch(`/v2/sordino/telemetry?seconds=${SECONDS}&events=200`, { cache: "no-store" });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const snap = await response.json();
      state.last = snap;
      render(snap);
      state.updates += 1;
      state.ready = true;
      $("status").textContent = `live · updated ${new Date().toLocaleTimeString()}`;
      $("status").className = "status";
    } catch (err) {
      state.failures += 1;
      $("status").textContent = `cannot reach the server (${err.message}); retrying`;
      $("status").className = "status down";
    }
  }

  window.addEventListener("resize", () => {
    Object.entries(state.charts).forEach(([name, chart]) => {
      const el = $("chart-" + name);
      if (el) chart.setSize({ width: width(el), height: 220 });
    });
  });
  poll();
  setInterval(poll, 1000);
  pollMemory();
  setInterval(pollMemory, 2000);
})();
