"""The dashboard's aiohttp app: `/` the page, `/api/state` the snapshot it polls, `/health`.

The page is static HTML with a small script: every `refresh_s` it fetches `/api/state` and
redraws, without a reload, the trainer's phase (warm start: its step and held-out accuracy;
then RL), the reward and held-out accuracy curves (inline SVG with axes, tick values and the
80% target line), the flow line (the trainer's idle share, the validator's lag, stale drops,
the pool's pacing and why the trainer or the pool waits), the nodes table (the network's own
workers and any member that joined from elsewhere), the validators table (judged, accused,
upheld, overturned, lag), the policy versions per shardcast server and the invalidation log.
Loopback only: it shows what a pool's reader may see and takes no input.
"""

from __future__ import annotations

import json
from pathlib import Path

from aiohttp import web

from meshrl.dashboard.config import DashboardConfig
from meshrl.dashboard.state import collect_state

__all__ = ["build_dashboard"]

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>meshrl network</title>
<link rel="icon" href="data:,">
<style>
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222;max-width:1200px}
table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3} td:first-child{text-align:left}
.bad{color:#b00} .muted{color:#888} .ext{color:#369}
svg{border:1px solid #ddd;background:#fcfcfc;margin-right:1em}
svg text{font:11px system-ui,sans-serif;fill:#444}
svg .axis{stroke:#555} svg .grid{stroke:#eee} svg .target{stroke:#090;stroke-dasharray:5 4}
svg text.target-label{fill:#090} svg text.last{font-weight:bold;fill:#222}
#phase{font-size:16px} #phase b{font-size:18px}
</style></head><body>
<h1>meshrl network <span id="pool" class="muted"></span></h1>
<p id="status" class="muted">loading…</p>
<h2>Trainer</h2>
<p id="phase">-</p>
<h2>Curves</h2>
<div><svg id="reward" width="540" height="240"></svg>
<svg id="accuracy" width="540" height="240"></svg></div>
<p class="muted">left: mean reward of the accepted rollouts of each RL step; right: greedy
held-out accuracy over the trainer's time (dashed: warm start, solid: RL; green: the 80%
target)</p>
<h2>Flow</h2>
<p id="flow">-</p><ul id="waiting"></ul>
<p class="muted">trainer idle: the share of its step time spent waiting for batches; validator
lag: files submitted and not yet judged; pacing: files in flight or waiting of those the trainer
wants ahead; a wait line names what the trainer or the pool awaits</p>
<h2>Nodes</h2>
<table id="nodes"><thead><tr><th>node</th><th>state</th><th>policy</th><th>tokens/s</th>
<th>accepted</th><th>rejected</th><th>pending</th><th>stake</th><th>slashed</th>
<th>earned</th><th>claimable</th></tr></thead>
<tbody></tbody></table>
<p class="muted">stake (the node's provider's), slashed, rewards earned and claimable now: tokens,
as the chain has them (the orchestrator follows its events); policy: the version the node
last loaded; a node named by its address joined from outside this network</p>
<h2>Validators</h2>
<table id="validators"><thead><tr><th>validator</th><th>judged</th><th>accepted</th>
<th>accused</th><th>upheld</th><th>overturned</th><th>lag (files)</th><th>last verdict</th>
</tr></thead><tbody></tbody></table>
<p class="muted">judged: submissions it gave a verdict; accused: its invalidations on chain;
upheld / overturned: of those, settled each way; lag: files of its share submitted and not yet
judged</p>
<h2>Policy versions</h2>
<table id="versions"><thead><tr><th>server</th><th>role</th><th>latest</th><th>held</th></tr>
</thead><tbody></tbody></table>
<h2>Invalidations</h2><ul id="invalid"></ul>
<h2>Supervisor</h2><ul id="events"></ul>
<script>
"use strict";
const REFRESH = __REFRESH__;
const SVG = "http://www.w3.org/2000/svg";
function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  row.appendChild(td);
}
function tokens(base) { return (base / 1e18).toFixed(3); }  // 18 decimals; display only
function pct(x) { return x == null ? "-" : (100 * x).toFixed(0) + "%"; }
function secs(s) {
  if (s == null) return "-";
  return s < 120 ? s.toFixed(0) + " s" : s < 7200 ? (s / 60).toFixed(1) + " min" :
    (s / 3600).toFixed(1) + " h";
}
function fill(id, rows, cols) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren();
  for (const r of rows) {
    const tr = document.createElement("tr");
    for (const c of cols) cell(tr, c[0](r), c[1] ? c[1](r) : "");
    body.appendChild(tr);
  }
}
function el(svg, tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  svg.appendChild(e);
  return e;
}
function ticks(lo, hi, n, whole) {  // about n round values from lo to hi (whole: integers)
  const raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  let step = [1, 2, 5, 10].map(m => m * mag).find(s => s >= raw);
  if (whole) step = Math.max(1, Math.round(step));
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(v);
  return out;
}
// a chart with axes, tick values, axis titles, an optional target line and the last value:
// o = {series: [{points: [[x, y]...], color, dash, label}], xlabel, ylabel, xfmt, yfmt,
//      xwhole (integer x ticks), y0, y1 (the y range at least), target, empty (the text
//      when there are no points)}
function chart(id, o) {
  const svg = document.getElementById(id);
  const w = svg.width.baseVal.value, h = svg.height.baseVal.value;
  const L = 52, R = 14, T = 12, B = 38, pw = w - L - R, ph = h - T - B;
  svg.replaceChildren();
  const pts = o.series.flatMap(s => s.points);
  const xs = pts.map(p => p[0]), ys = pts.map(p => p[1]);
  let x0 = Math.min(...xs, 0), x1 = Math.max(...xs, x0 + 1);
  let y0 = Math.min(...ys, o.y0), y1 = Math.max(...ys, o.y1);
  if (y1 - y0 < 1e-9) y1 = y0 + 1;
  const X = x => L + (x - x0) / (x1 - x0) * pw, Y = y => T + ph - (y - y0) / (y1 - y0) * ph;
  for (const v of ticks(y0, y1, 5)) {
    el(svg, "line", {class: "grid", x1: L, x2: L + pw, y1: Y(v), y2: Y(v)});
    el(svg, "text", {class: "tick ytick", x: L - 6, y: Y(v) + 4, "text-anchor": "end"},
       o.yfmt(v));
  }
  for (const v of ticks(x0, x1, 6, o.xwhole)) {
    el(svg, "line", {class: "axis", x1: X(v), x2: X(v), y1: T + ph, y2: T + ph + 4});
    el(svg, "text", {class: "tick xtick", x: X(v), y: T + ph + 16, "text-anchor": "middle"},
       o.xfmt(v));
  }
  el(svg, "line", {class: "axis x-axis", x1: L, x2: L + pw, y1: T + ph, y2: T + ph});
  el(svg, "line", {class: "axis y-axis", x1: L, x2: L, y1: T, y2: T + ph});
  el(svg, "text", {class: "xlabel", x: L + pw / 2, y: h - 4, "text-anchor": "middle"},
     o.xlabel);
  el(svg, "text", {class: "ylabel", x: 12, y: T + ph / 2, "text-anchor": "middle",
                   transform: "rotate(-90 12 " + (T + ph / 2) + ")"}, o.ylabel);
  if (o.target != null && o.target >= y0 && o.target <= y1) {
    el(svg, "line", {class: "target", x1: L, x2: L + pw, y1: Y(o.target), y2: Y(o.target)});
    el(svg, "text", {class: "target-label", x: L + pw / 2, y: Y(o.target) - 4,
                     "text-anchor": "middle"}, o.yfmt(o.target) + " target");
  }
  if (pts.length === 0) {
    el(svg, "text", {class: "empty", x: L + pw / 2, y: T + ph / 2, "text-anchor": "middle"},
       o.empty);
    return;
  }
  let ly = T + 12;
  for (const s of o.series) {
    if (s.points.length === 0) continue;
    const d = s.points.map(p => X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1)).join(" ");
    el(svg, "polyline", {class: "series", points: d, fill: "none", stroke: s.color,
                         "stroke-width": 1.5, "stroke-dasharray": s.dash || "none"});
    if (s.points.length <= 60) {
      for (const p of s.points) {
        const c = el(svg, "circle", {cx: X(p[0]), cy: Y(p[1]), r: 2.5, fill: s.color});
        el(c, "title", {}, o.xfmt(p[0]) + ": " + o.yfmt(p[1]));
      }
    }
    const p = s.points[s.points.length - 1];
    el(svg, "text", {class: "last", x: Math.min(X(p[0]) + 4, L + pw - 30), y: Y(p[1]) - 6},
       o.yfmt(p[1]));
    if (s.label) {
      el(svg, "text", {class: "legend", x: L + 8, y: ly, fill: s.color}, s.label);
      ly += 13;
    }
  }
}
function list(id, items) {
  const ul = document.getElementById(id);
  ul.replaceChildren();
  for (const t of items) {
    const li = document.createElement("li");
    li.textContent = t;
    ul.appendChild(li);
  }
}
function phaseText(p) {
  if (p.phase === "starting") return "starting: no metrics written yet (loading the model)";
  if (p.phase === "warm start") {
    return "supervised, before RL: step " + (p.step ?? "-") +
      (p.max_steps != null ? " of " + p.max_steps : "") + " · held-out accuracy " +
      pct(p.accuracy) + (p.target != null ? " (RL starts at " + pct(p.target) + ")" : "") +
      (p.loss != null ? " · loss " + p.loss.toFixed(3) : "") + " · " + secs(p.elapsed) +
      " · no policy is published until it ends";
  }
  const w = p.warm_start;
  return "step " + p.step + " · held-out accuracy " + pct(p.accuracy) +
    (p.eval_step != null ? " at step " + p.eval_step : "") + " · " + secs(p.elapsed) +
    (w ? " · warm start: " + w.steps + " steps to " + pct(w.accuracy) : "");
}
async function refresh() {
  try {
    const s = await (await fetch("/api/state", {cache: "no-store"})).json();
    if (!s.ready) { document.getElementById("status").textContent = s.errors.join("; "); return; }
    document.getElementById("pool").textContent = "pool " + s.pool_id;
    document.getElementById("status").textContent = "trained steps: " + s.trained_step +
      " · updated " + new Date().toLocaleTimeString() +
      (s.errors.length ? " · " + s.errors.join("; ") : "");
    const ph = document.getElementById("phase");
    ph.replaceChildren();
    const b = document.createElement("b");
    b.textContent = s.phase.phase === "rl" ? "RL" : s.phase.phase;
    ph.append(b, " · " + phaseText(s.phase));
    ph.dataset.phase = s.phase.phase;
    fill("nodes", s.nodes, [[r => r.name + (r.dishonest ? " (cheat)" : ""),
                             r => r.external ? "ext" : ""],
      [r => r.state, r => r.state === "healthy" ? "" : "bad"],
      [r => r.policy_version ?? "none yet", r => r.policy_version == null ? "muted" : ""],
      [r => r.tokens_per_s], [r => r.accepted], [r => r.rejected, r => r.hard ? "bad" : ""],
      [r => r.pending], [r => tokens(r.stake)],
      [r => tokens(r.slashed), r => r.slashed ? "bad" : ""],
      [r => tokens(r.earned)], [r => tokens(r.claimable)]]);
    fill("validators", s.validators, [[r => r.name + (r.rogue ? " (rogue)" : "")],
      [r => r.judged], [r => r.accepted], [r => r.accused], [r => r.upheld],
      [r => r.overturned, r => r.overturned ? "bad" : ""], [r => r.lag],
      [r => r.last_verdict_s == null ? "none yet" : secs(r.last_verdict_s) + " ago"]]);
    fill("versions", s.versions, [[r => r.url], [r => r.role ?? "down"],
      [r => r.latest ?? "-"], [r => r.complete.join(" ")]]);
    const f = s.flow || {}, p = f.pacing;
    document.getElementById("flow").textContent = "trainer idle " +
      (f.idle_share == null ? "-" : (100 * f.idle_share).toFixed(0) + "%") +
      " · validator lag " + (f.validator_lag ?? "-") + " files · stale dropped " +
      (f.dropped_stale ?? "-") + " · pacing " + (p && p.ahead != null ?
        p.backlog + " in flight or waiting + " + p.leases + " being made, of " + p.ahead :
        "off");
    list("waiting", (f.waiting || []).map(w => w.role + ": " + w.msg + " (" + w.why + ")"));
    const num = v => Math.abs(v) >= 10 ? v.toFixed(0) : +v.toFixed(2) + "";
    chart("reward", {series: [{points: s.reward, color: "#36c", label: "batch reward"}],
      xlabel: "RL step", ylabel: "mean reward", xfmt: v => v.toFixed(0), yfmt: num,
      xwhole: true,
      y0: 0, y1: 1, target: null, empty: s.phase.phase === "rl" ? "no RL step yet" :
        "RL not started: the trainer is in its " + s.phase.phase});
    // one time unit for the whole axis: minutes once the run is past 5 minutes
    const tmax = Math.max(0, ...s.accuracy.sft.map(p => p[0]), ...s.accuracy.rl.map(p => p[0]));
    const unit = tmax > 300 ? 60 : 1, inUnit = ps => ps.map(p => [p[0] / unit, p[1]]);
    chart("accuracy", {series: [
        {points: inUnit(s.accuracy.sft), color: "#c63", dash: "4 3", label: "warm start"},
        {points: inUnit(s.accuracy.rl), color: "#36c", label: "RL"}],
      xlabel: "trainer time (" + (unit === 60 ? "min" : "s") + ")",
      ylabel: "held-out accuracy", xfmt: num, yfmt: pct,
      y0: 0, y1: 1, target: s.target, empty: "no evaluation yet"});
    list("invalid", s.invalidations.map(v => v.validator + ": " + v.name + " " + v.verdict +
      ": " + v.reason));
    list("events", s.events.map(e => new Date(e.t * 1000).toLocaleTimeString() + " " +
      e.role + " " + e.event + (e.rc !== undefined ? " (rc " + e.rc + ")" : "")));
  } catch (err) {
    document.getElementById("status").textContent = "dashboard unreachable: " + err;
  }
}
refresh();
setInterval(refresh, REFRESH * 1000);
</script></body></html>
"""


def build_dashboard(cfg: DashboardConfig) -> web.Application:
    run = Path(cfg.run)
    page = PAGE.replace("__REFRESH__", json.dumps(cfg.refresh_s))

    async def index(_: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/html")

    async def state(_: web.Request) -> web.Response:
        return web.json_response(await collect_state(run))

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "service": "dashboard", "run": str(run)})

    app = web.Application()
    app.router.add_get("/", index)
    app.router.add_get("/api/state", state)
    app.router.add_get("/health", health)
    return app
