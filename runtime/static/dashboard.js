// The live page: /v1/dashboard/stream pushes the dashboard JSON once a second; each panel draws
// itself as SVG (nothing is fetched from elsewhere) and marks data-filled once it has data.
"use strict";

const COLOURS = { plain: "#1f77b4", mtp: "#d62728", serial: "#1f77b4", width: "#2ca02c", depth: "#9467bd" };
const W = 400, H = 170, PAD = 30;

function panel(name) { return document.querySelector(`[data-panel="${name}"]`); }

function fill(name, html, filled) {
  const p = panel(name);
  p.querySelector(".body").innerHTML = filled ? html : `<p class="empty">${html || "no data yet"}</p>`;
  p.dataset.filled = String(filled);
}

function scale(values, lo, hi) {
  const finite = values.filter(v => v !== null && v !== undefined && isFinite(v));
  const min = lo !== undefined ? lo : Math.min(...finite), max = Math.max(...finite, min + 1e-9);
  return v => H - PAD / 2 - (v - min) / (max - min) * (H - PAD);
}

// Lines over shared x values; each series is {name, colour, values}; marks are x values (switches).
function lines(xs, series, marks = []) {
  const all = series.flatMap(s => s.values);
  const y = scale(all, 0), x0 = xs[0], x1 = Math.max(xs[xs.length - 1], x0 + 1);
  const x = v => PAD + (v - x0) / (x1 - x0) * (W - PAD - 8);
  let svg = `<svg viewBox="0 0 ${W} ${H}">`;
  const top = Math.max(...all.filter(v => v !== null && isFinite(v)));
  svg += `<text x="2" y="12" font-size="10">${round(top)}</text><text x="2" y="${H - 4}" font-size="10">0</text>`;
  for (const m of marks) {
    if (m >= x0 && m <= x1) svg += `<line x1="${x(m)}" x2="${x(m)}" y1="0" y2="${H}" stroke="#999" stroke-dasharray="3,3"/>`;
  }
  for (const s of series) {
    let d = "", pen = "M";
    s.values.forEach((v, i) => {
      if (v === null || v === undefined) { pen = "M"; return; }
      d += `${pen}${x(xs[i]).toFixed(1)},${y(v).toFixed(1)} `; pen = "L";
    });
    svg += `<path d="${d}" fill="none" stroke="${s.colour}" stroke-width="1.5"/>`;
    s.values.forEach((v, i) => {
      if (v !== null && v !== undefined) svg += `<circle cx="${x(xs[i]).toFixed(1)}" cy="${y(v).toFixed(1)}" r="1.5" fill="${s.colour}"/>`;
    });
  }
  const legend = series.map(s => `<span style="color:${s.colour}">&#9632; ${s.name}</span>`).join("");
  return svg + `</svg><div class="legend">${legend}${marks.length ? "<span>dashed: gate switch</span>" : ""}</div>`;
}

function bars(labels, values, colour, text = round) {
  const y = scale(values, 0), n = values.length, w = (W - PAD) / Math.max(n, 1);
  let svg = `<svg viewBox="0 0 ${W} ${H}">`;
  values.forEach((v, i) => {
    const top = y(v || 0);
    svg += `<rect x="${PAD + i * w + 2}" y="${top}" width="${w - 4}" height="${H - PAD / 2 - top}" fill="${colour}"/>`;
    svg += `<text x="${PAD + i * w + w / 2}" y="${H - 2}" font-size="9" text-anchor="middle">${labels[i]}</text>`;
    svg += `<text x="${PAD + i * w + w / 2}" y="${Math.max(top - 2, 10)}" font-size="9" text-anchor="middle">${text(v)}</text>`;
  });
  return svg + "</svg>";
}

function round(v) {
  if (v === null || v === undefined || !isFinite(v)) return "-";
  return Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 1 ? v.toFixed(1) : v.toFixed(3);
}

function throughput(d) {
  const s = d.series, xs = s.map(p => p.t);
  fill("throughput", lines(xs, [
    { name: "plain tok/s", colour: COLOURS.plain, values: s.map(p => p.plain_tok_s) },
    { name: "speculative tok/s", colour: COLOURS.mtp, values: s.map(p => p.mtp_tok_s) },
  ]), s.length > 0);
}

function acceptance(d) {
  const a = d.acceptance, rates = a.rate_by_position;
  const labels = rates.map((_, i) => `pos ${i + 1}`);
  const html = bars(labels, rates.map(r => r || 0), COLOURS.mtp, v => `${(100 * v).toFixed(0)}%`)
    + `<div class="legend">accepted / drafted at each position: ${a.accepted_by_position.join(", ")} of ${a.drafted_by_position.join(", ")}</div>`;
  fill("acceptance", rates.length ? html : "no drafts verified yet", rates.length > 0);
}

function decider(d) {
  const s = d.series, xs = s.map(p => p.t), p = panel("decider");
  const gated = s.some(q => q.gate_mode !== undefined);
  p.querySelector("h2").textContent = gated ? "gate: mode and estimates" : `decider: ${d.decider || "-"} (planner depth)`;
  if (gated) {
    const mode = d.gate ? `mode now: ${d.gate.mode}, switches: ${d.gate.switches}` : "";
    const html = lines(xs, [
      { name: "plain estimate tok/s", colour: COLOURS.serial, values: s.map(q => q.gate_serial_tok_s ?? null) },
      { name: "speculative estimate tok/s", colour: COLOURS.mtp, values: s.map(q => q.gate_mtp_tok_s ?? null) },
      { name: "mode (speculative = top)", colour: "#999", values: modeLine(s) },
    ], d.switches.map(w => w.t)) + `<div class="legend">${mode}</div>`;
    fill("decider", html, s.some(q => q.gate_serial_tok_s != null || q.gate_mtp_tok_s != null));
  } else {
    fill("decider", lines(xs, [{ name: "planner depth", colour: COLOURS.depth, values: s.map(q => q.planner_depth ?? null) }]),
      s.some(q => q.planner_depth !== undefined));
  }
}

function modeLine(s) {
  const top = Math.max(0, ...s.map(q => Math.max(q.gate_serial_tok_s || 0, q.gate_mtp_tok_s || 0)));
  return s.map(q => q.gate_mode === undefined ? null : q.gate_mode === "mtp" ? top : 0);
}

function width(d) {
  const s = d.series;
  fill("width", lines(s.map(p => p.t), [{ name: "batch width (max per second)", colour: COLOURS.width, values: s.map(p => p.width_max) }]),
    s.length > 0);
}

function distribution(name, h) {
  const labels = h.bounds.map(b => b === null ? "inf" : `${b < 1 ? (b * 1000).toFixed(0) + "ms" : b + "s"}`);
  const html = bars(labels, h.counts, COLOURS.plain, v => v ? String(v) : "")
    + `<div class="legend">count ${h.count}, mean ${h.count ? round(1000 * h.sum / h.count) : "-"} ms (bars: up to each bound)</div>`;
  fill(name, h.count ? html : "", h.count > 0);
}

function requests(d) {
  const rows = d.requests.map(r => {
    const s = r.receipt || {};
    const rate = s.drafted_tokens ? `${(100 * s.accepted_tokens / s.drafted_tokens).toFixed(0)}%` : "-";
    return `<tr data-request="${r.request_id}"><td>${r.request_id}</td><td>${r.outcome} (${r.detail})</td>`
      + `<td>${r.prompt_tokens ?? "-"}</td><td>${r.completion_tokens ?? "-"}</td><td>${s.drafted_tokens ?? "-"}</td>`
      + `<td>${s.accepted_tokens ?? "-"}</td><td>${rate}</td><td>${s.verify_steps ?? "-"}</td><td>${s.plain_steps ?? "-"}</td>`
      + `<td>${(s.accepted_by_position || []).join(",")}</td></tr>`;
  }).join("");
  const head = "<tr><th>request</th><th>ended</th><th>prompt</th><th>completion</th><th>drafted</th><th>accepted</th>"
    + "<th>rate</th><th>verify steps</th><th>plain steps</th><th>accepted by position</th></tr>";
  fill("requests", `<table>${head}${rows}</table>`, d.requests.length > 0);
}

function figures(d) {
  const set = (key, value) => { document.querySelector(`[data-key="${key}"]`).textContent = value; };
  document.getElementById("model").textContent = d.model;
  set("mode", d.mode); set("decider", d.decider || "-"); set("steps", d.steps);
  set("requests", d.requests.length); set("num_drafts", d.acceptance.num_drafts);
  set("draft_tokens", d.acceptance.draft_tokens); set("accepted_tokens", d.acceptance.accepted_tokens);
  set("ttft_count", d.distributions.ttft.count); set("itl_count", d.distributions.itl.count);
  set("updated", new Date(d.at * 1000).toLocaleTimeString());
}

function render(d) {
  for (const draw of [figures, throughput, acceptance, decider, width, requests]) draw(d);
  distribution("ttft", d.distributions.ttft);
  distribution("itl", d.distributions.itl);
  window.lastDashboard = d;  // for tests and the console
}

function connect() {
  const source = new EventSource("/v1/dashboard/stream");
  source.onmessage = e => render(JSON.parse(e.data));
  source.onerror = () => { source.close(); setTimeout(connect, 1000); };
}
connect();
