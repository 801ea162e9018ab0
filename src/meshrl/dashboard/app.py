"""The dashboard's aiohttp app: `/` the page, `/api/state` the snapshot it polls, `/health`.

The page is static HTML with a small script: every `refresh_s` it fetches `/api/state` and
redraws the flow line (the trainer's idle share, the validator's lag, stale drops, the pool's
pacing and why the trainer or the pool waits), the nodes table, the policy versions per
shardcast server, the reward and held-out accuracy curves (inline SVG) and the invalidation
log, without a reload. Loopback only: it shows what a pool's reader may see and takes no input.
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
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3} td:first-child{text-align:left}
.bad{color:#b00} .muted{color:#888} svg{border:1px solid #ddd;background:#fcfcfc}
</style></head><body>
<h1>meshrl network <span id="pool" class="muted"></span></h1>
<p id="status" class="muted">loading…</p>
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
as the chain has them (the orchestrator follows its events)</p>
<h2>Policy versions</h2>
<table id="versions"><thead><tr><th>server</th><th>role</th><th>latest</th><th>held</th></tr>
</thead><tbody></tbody></table>
<h2>Curves</h2>
<div><svg id="reward" width="420" height="160"></svg>
<svg id="accuracy" width="420" height="160"></svg></div>
<p class="muted">left: batch reward per step; right: held-out accuracy per step</p>
<h2>Invalidations</h2><ul id="invalid"></ul>
<h2>Supervisor</h2><ul id="events"></ul>
<script>
"use strict";
const REFRESH = __REFRESH__;
function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  row.appendChild(td);
}
function tokens(base) { return (base / 1e18).toFixed(3); }  // 18 decimals; display only
function fill(id, rows, cols) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren();
  for (const r of rows) {
    const tr = document.createElement("tr");
    for (const c of cols) cell(tr, c[0](r), c[1] ? c[1](r) : "");
    body.appendChild(tr);
  }
}
function curve(id, points) {
  const svg = document.getElementById(id);
  const w = svg.width.baseVal.value, h = svg.height.baseVal.value;
  svg.replaceChildren();
  if (points.length === 0) return;
  const xs = points.map(p => p[0]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1);
  const d = points.map(p => ((p[0] - x0) / (x1 - x0) * (w - 10) + 5).toFixed(1) + "," +
                             (h - 5 - p[1] * (h - 10)).toFixed(1)).join(" ");
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", d);
  line.setAttribute("fill", "none");
  line.setAttribute("stroke", id === "reward" ? "#36c" : "#c63");
  svg.appendChild(line);
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
async function refresh() {
  try {
    const s = await (await fetch("/api/state", {cache: "no-store"})).json();
    if (!s.ready) { document.getElementById("status").textContent = s.errors.join("; "); return; }
    document.getElementById("pool").textContent = "pool " + s.pool_id;
    document.getElementById("status").textContent = "trained steps: " + s.trained_step +
      " · updated " + new Date().toLocaleTimeString() +
      (s.errors.length ? " · " + s.errors.join("; ") : "");
    fill("nodes", s.nodes, [[r => r.name + (r.dishonest ? " (cheat)" : "")],
      [r => r.state, r => r.state === "healthy" ? "" : "bad"], [r => r.policy_version ?? "-"],
      [r => r.tokens_per_s], [r => r.accepted], [r => r.rejected, r => r.hard ? "bad" : ""],
      [r => r.pending], [r => tokens(r.stake)],
      [r => tokens(r.slashed), r => r.slashed ? "bad" : ""],
      [r => tokens(r.earned)], [r => tokens(r.claimable)]]);
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
    curve("reward", s.reward);
    curve("accuracy", s.accuracy);
    list("invalid", s.invalidations.map(v => v.node + " " + v.verdict + ": " + v.reason));
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
