// forge-pack search dashboard. Plain JS, hand-written SVG; nothing fetched from outside this server.
// Every text that came from the run (sources, logs, LLM replies, moves) is set with textContent, never HTML.
"use strict";

const SVGNS = "http://www.w3.org/2000/svg";
const POLL_LIVE_MS = 1500, POLL_IDLE_MS = 5000, SUMMARY_EVERY_MS = 10000, RERENDER_MIN_MS = 2000;
const FAIL_COLOURS = {
  compile_error: "#b3261e", static_check: "#c2185b", launch_error: "#e64a19", crash: "#6d1b1b",
  timeout: "#8d6e63", mismatch: "#f57c00", nan: "#ad1457", unwritten_output: "#7b1fa2", input_mutated: "#5d4037",
  aliasing: "#455a64", nondeterministic: "#c9a100", implausible_speedup: "#0288d1", inapplicable: "#9e9e9e",
  out_of_bounds: "#6a1b9a", work_after_return: "#00796b", internal_error: "#212121",
};
const OK_COLOUR = "#1a9850", PENDING_COLOUR = "#9aa0a6";

const S = {
  token: null, cursor: 0, summary: null, summaryAt: 0, progress: null, progressSeen: new Set(),
  tree: null, route: {}, dirty: {}, lastRender: {}, timers: {}, treeView: null, node: null, nodeSources: {},
};

// ---------------------------------------------------------------- small helpers

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  setAttrs(e, attrs);
  for (const k of kids.flat(Infinity)) if (k !== null && k !== undefined && k !== false) e.append(k instanceof Node ? k : String(k));
  return e;
}
function sv(tag, attrs, ...kids) {
  const e = document.createElementNS(SVGNS, tag);
  setAttrs(e, attrs);
  for (const k of kids.flat(Infinity)) if (k !== null && k !== undefined) e.append(k instanceof Node ? k : String(k));
  return e;
}
function setAttrs(e, attrs) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : v);
  }
}
const $ = (id) => document.getElementById(id);
const fin = (v) => typeof v === "number" && isFinite(v);
function fmtX(s) { return fin(s) ? s.toFixed(s >= 10 ? 1 : 2) + "×" : "—"; }
function fmtUs(us) { return !fin(us) ? "—" : us >= 1000 ? (us / 1000).toFixed(2) + " ms" : us.toFixed(us >= 100 ? 1 : 2) + " µs"; }
function fmtPct(f) { return fin(f) ? (100 * f).toFixed(1) + "%" : "—"; }
function fmtNum(v, d = 3) { return !fin(v) ? "—" : Math.abs(v) >= 1e4 || (v !== 0 && Math.abs(v) < 1e-3) ? v.toExponential(2) : +v.toFixed(d) + ""; }
function fmtInt(n) { return fin(n) ? n.toLocaleString("en-US") : "—"; }
function fmtK(n) { return !fin(n) ? "—" : n >= 1e6 ? (n / 1e6).toFixed(1) + "M" : n >= 1e3 ? (n / 1e3).toFixed(1) + "k" : String(n); }
function fmtDur(s) {
  if (!fin(s)) return "—";
  s = Math.max(0, Math.round(s));
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
  return h ? `${h}h ${String(m).padStart(2, "0")}m` : m ? `${m}m ${String(r).padStart(2, "0")}s` : `${r}s`;
}
function verdictColour(v) { return v === "ok" ? OK_COLOUR : v === "pending" || v === "evaluating" || !v ? PENDING_COLOUR : FAIL_COLOURS[v] || "#d93025"; }
function chip(verdict, n) {
  const cls = verdict === "ok" || verdict === "pending" || verdict === "evaluating" || verdict === "implausible_speedup" || verdict === "inapplicable" ? "v-" + verdict : "v-fail";
  return el("span", { class: "chip " + cls }, verdict || "pending", n !== undefined ? el("span", { class: "n", text: fmtInt(n) }) : null);
}
function hotspotById(id) { return (S.summary && S.summary.hotspots.find((h) => h.id === id)) || null; }
function hotspotLabel(id) { const h = hotspotById(id); return h ? `#${h.rank} ${h.pretty}` : id; }
function link(text, route, cls) { return el("a", { href: routeHash(route), class: cls, text }); }
function nodeLink(id) { return link("#" + id, { view: "node", node: id }, "mono"); }
function openNode(id) { go({ view: "node", node: id, against: "" }); }

// ---------------------------------------------------------------- token, routing, API

function takeToken() {
  const hash = new URLSearchParams(location.hash.slice(1)), query = new URLSearchParams(location.search);
  const t = hash.get("token") || query.get("token");
  if (t) {
    sessionStorage.setItem("forge-pack-token", t);
    hash.delete("token"); query.delete("token");
    const q = query.toString();
    history.replaceState(null, "", location.pathname + (q ? "?" + q : "") + (hash.toString() ? "#" + hash : ""));
  }
  return t || sessionStorage.getItem("forge-pack-token");
}
function parseRoute() {
  const p = new URLSearchParams(location.hash.slice(1)), r = {};
  for (const [k, v] of p) r[k] = v;
  r.view = r.view || "hotspots";
  return r;
}
function routeHash(r) {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(r)) if (v !== undefined && v !== null && v !== "" && v !== false) p.set(k, v);
  return "#" + p.toString();
}
function go(changes, replace) {
  const r = Object.assign({}, S.route, changes);
  const h = routeHash(r);
  if (replace) { history.replaceState(null, "", h); onRoute(); } else location.hash = h;
}
class ApiError extends Error { constructor(status, msg) { super(msg); this.status = status; } }
async function api(path, params) {
  const u = new URL(path, location.origin);
  for (const [k, v] of Object.entries(params || {})) if (v !== undefined && v !== null && v !== "") u.searchParams.set(k, v);
  const r = await fetch(u, { headers: { "X-Forge-Token": S.token }, cache: "no-store", credentials: "same-origin" });
  if (!r.ok) {
    let msg = r.statusText;
    try { msg = (await r.json()).error || msg; } catch (e) { /* not JSON */ }
    throw new ApiError(r.status, msg);
  }
  return r.json();
}
function notice(text) { const n = $("notice"); n.hidden = !text; n.textContent = text || ""; }

// ---------------------------------------------------------------- header

function renderHeader() {
  const s = S.summary, run = s.run || {};
  $("h-model").textContent = run.model_path || "(no run recorded yet)";
  const age = fin(run.heartbeat_age_s) ? run.heartbeat_age_s + (Date.now() - S.summaryAt) / 1000 : null;
  let state = run.state || "unknown";
  if (state === "running" && age !== null && age > run.stale_after_s) state = "stalled";
  const st = $("h-state");
  st.className = "state " + state;
  st.textContent = state === "stalled" ? "stalled / crashed" : state;
  st.title = state === "stalled" ? "status is running but the search has not written a heartbeat for " + fmtDur(age) : "";
  $("h-beat").textContent = age === null ? "" : `last heartbeat ${fmtDur(age)} ago`;
  const env = run.env || {};
  const parts = [];
  if (env.gpu || env.gpu_name) parts.push((env.gpu || env.gpu_name) + (env.compute_capability ? ` (sm ${env.compute_capability})` : ""));
  if (env.torch) parts.push("torch " + env.torch);
  if (env.cuda) parts.push("CUDA " + env.cuda);
  if (env.driver) parts.push("driver " + env.driver);
  if (env.host) parts.push("host " + env.host);
  if (run.device) parts.push(run.dtype ? `${run.device} ${run.dtype}` : run.device);  // no dtype: no empty field
  for (const [k, v] of Object.entries(env)) {
    if (!["gpu", "gpu_name", "compute_capability", "torch", "cuda", "driver", "host"].includes(k) && ((typeof v === "string" && v.trim()) || fin(v))) parts.push(`${k} ${v}`);
  }
  $("h-env").textContent = parts.filter((p) => p && p.trim()).join("  ·  ");
  $("h-evals").textContent = `${fmtInt(s.evaluations)} / ${fmtInt(s.budget)}` + (s.evaluating ? ` (+${s.evaluating} running)` : "");
  $("h-evals-bar").style.width = (s.budget ? Math.min(100, (100 * s.evaluations) / s.budget) : 0) + "%";
  let elapsed = run.elapsed_s;
  if (state === "running" && fin(elapsed)) elapsed += (Date.now() - S.summaryAt) / 1000;
  $("h-elapsed").textContent = fmtDur(elapsed);
  $("h-proj").textContent = fmtX(s.projected_model_speedup);
  $("h-llm").textContent = s.llm.calls ? `${fmtInt(s.llm.calls)} calls · ${fmtK(s.llm.prompt_tokens)} in / ${fmtK(s.llm.completion_tokens)} out · $${(s.llm.cost_usd || 0).toFixed(2)}` + (s.llm.failed ? ` · ${s.llm.failed} failed` : "") : "no calls";
  const order = Object.entries(s.verdicts).sort((a, b) => (a[0] === "ok" ? -1 : b[0] === "ok" ? 1 : b[1] - a[1]));
  const chips = order.map(([v, n]) => chip(v, n));
  if (s.pending) chips.push(chip("pending", s.pending));
  if (s.evaluating) chips.push(chip("evaluating", s.evaluating));
  $("h-verdicts").replaceChildren(...(chips.length ? chips : [el("span", { class: "muted", text: "none yet" })]));
  const ctl = s.control || {};
  $("h-control").hidden = !ctl.allowed;
  if (ctl.allowed) $("c-current").textContent = ctl.current ? `last request: ${ctl.current.action}` : "no request yet";
}
async function sendControl(action) {
  if (action === "stop" && !window.confirm("Stop the search after the evaluations in flight?")) return;
  try {
    const r = await fetch("/api/control", { method: "POST", headers: { "X-Forge-Token": S.token, "Content-Type": "application/json" }, body: JSON.stringify({ action }) });
    if (!r.ok) throw new Error((await r.json()).error);
    await refreshSummary();
  } catch (e) { notice("control request failed: " + e.message); }
}

// ---------------------------------------------------------------- hotspots view

function renderHotspots() {
  const s = S.summary, root = $("view-hotspots");
  const head = el("tr", {}, ["#", "signature", "share of model", "eager", "torch.compile", "best", "vs eager", "vs compile", "projected model", "evaluations", "status", ""].map((h, i) => el("th", { class: i >= 3 && i <= 9 ? "num" : null, text: h })));
  const rows = s.hotspots.map((h) => el("tr", { class: "click", "data-hotspot": h.id, onclick: (ev) => { if (ev.target.tagName !== "A") go({ view: "tree", hotspot: h.id }); } },
    el("td", { text: h.rank }),
    el("td", { class: "sig", title: (h.call_paths || []).join(", ") }, h.pretty, h.region ? regionCell(h.region) : ""),
    el("td", {}, el("span", { class: "share" }, shareBar(h.time_share)), fmtPct(h.time_share)),
    el("td", { class: "num", text: fmtUs(h.eager_us) }),
    el("td", { class: "num", text: fmtUs(h.compile_us) }),
    el("td", { class: "num" }, h.best_node_id ? link(fmtUs(h.best_us), { view: "node", node: h.best_node_id }) : "—"),
    el("td", { class: "num " + (h.speedup_vs_eager > 1 ? "good" : ""), text: fmtX(h.speedup_vs_eager) }),
    el("td", { class: "num " + (h.speedup_vs_compile > 1 ? "good" : ""), text: fmtX(h.speedup_vs_compile) }),
    el("td", { class: "num", text: fmtX(h.projected_model_speedup) }),
    el("td", { class: "num", title: h.planned_budget !== h.budget ? `budget ${h.planned_budget}` : "", text: `${h.evaluations} / ${h.budget ?? "—"}` + (h.failures ? ` (${h.failures} failed)` : "")
      + (h.stop_reason === "exhausted" ? " · proposers ran dry" : h.stop_reason === "time_limit" ? " · time limit"
        : h.stop_reason === "out_of_memory" ? " · inputs do not fit the device's memory" : "") }),
    el("td", {}, h.status + (h.evaluating ? " ⟳" : "")),
    el("td", {}, link("tree", { view: "tree", hotspot: h.id }), " · ", link("candidates", { view: "candidates", hotspot: h.id })),
  ));
  const total = el("tr", { class: "total" }, el("td"), el("td", { text: "whole model (Amdahl over the best kernels ≥ 1.0×)" }),
    el("td", { text: fmtPct(s.hotspots.reduce((a, h) => a + (h.time_share || 0), 0)) }), el("td"), el("td"), el("td"), el("td"), el("td"),
    el("td", { class: "num", text: fmtX(s.projected_model_speedup) }), el("td", { class: "num", text: `${s.evaluations} / ${s.budget}` }), el("td"), el("td"));
  root.replaceChildren(el("div", { class: "card" }, el("h2", { text: "Hotspot leaderboard" }),
    s.hotspots.length ? el("table", { id: "hotspot-table" }, el("thead", {}, head), el("tbody", {}, rows, total)) : el("p", { class: "muted", text: "No hotspots recorded yet." })));
}
// a region hotspot: the ops it fuses and, folded, the subgraph's code (clicks stay in the row)
function regionCell(r) {
  const ops = (r.ops || []).map((o) => o.split(".").length === 3 ? o.split(".")[1] : o).join(" ");
  return el("div", { class: "muted" }, `${r.kind} region ×${r.instances}: ${ops}`,
    el("details", { onclick: (e) => e.stopPropagation() }, el("summary", { text: "code" }), el("pre", { text: r.code || "" })));
}
function shareBar(f) { const b = el("span"); b.style.width = Math.round(100 * Math.min(1, f || 0)) + "%"; return b; }

// ---------------------------------------------------------------- progress view

async function loadProgress() {
  const p = await api("/api/progress");
  S.progress = p;
  S.progressSeen = new Set(p.rows.map((r) => r[0]));
}
function progressFromEvents(events) {
  if (!S.progress) return false;
  let added = false;
  for (const [, at, kind, hid, nid, pl] of events) {
    if (kind !== "eval_done" || S.progressSeen.has(nid)) continue;
    let hi = S.progress.hotspots.indexOf(hid);
    if (hi < 0) { S.progress.hotspots.push(hid); hi = S.progress.hotspots.length - 1; }
    S.progress.rows.push([nid, hi, at - S.progress.start, pl.ok ? 1 : 0, pl.reason, fin(pl.speedup_vs_eager) ? pl.speedup_vs_eager : null]);
    S.progressSeen.add(nid);
    added = true;
  }
  return added;
}
function renderProgress() {
  const root = $("view-progress"), p = S.progress, s = S.summary;
  const sel = S.route.hotspot || "";
  const select = el("select", { id: "progress-hotspot", onchange: (e) => go({ hotspot: e.target.value }, true) },
    el("option", { value: "", text: "all hotspots (line: projected whole-model speedup)" }),
    s.hotspots.map((h) => el("option", { value: h.id, text: `#${h.rank} ${h.pretty}` })));
  select.value = sel;
  const hi = sel ? p.hotspots.indexOf(sel) : -1;
  const rows = sel ? p.rows.filter((r) => r[1] === hi) : p.rows;
  const shares = p.hotspots.map((id) => (hotspotById(id) || {}).time_share || 0);
  // best so far: of this hotspot, or the projected whole-model speedup over all hotspots (Amdahl)
  const bestPer = p.hotspots.map(() => 1.0);
  const pts = rows.map((r, i) => {
    if (r[3] && fin(r[5]) && r[5] > bestPer[r[1]]) bestPer[r[1]] = r[5];
    const best = sel ? bestPer[hi] : amdahl(shares, bestPer);
    return { i: i + 1, t: r[2], ok: !!r[3], reason: r[3] ? "ok" : r[4], s: r[5], node: r[0], best };
  });
  const reasons = [...new Set(pts.map((q) => q.reason))];
  const W = Math.max(600, (root.clientWidth || 1034) - 34);  // drawn at the real width: round dots, crisp text
  const legend = el("div", { class: "legend" }, reasons.map((v) => el("span", {}, dotSwatch(verdictColour(v)), v)),
    el("span", {}, el("span", { class: "sw", "data-kind": "best" }), sel ? "best speedup so far" : "projected model speedup so far"),
    el("span", { text: "failed evaluations sit in the red lane below the axis" }));
  legend.querySelector('[data-kind="best"]').style.background = "#e0a100";
  root.replaceChildren(
    el("div", { class: "toolbar" }, el("label", { text: "hotspot" }), select, el("span", { class: "muted", text: `${pts.length} evaluations` })),
    el("div", { class: "charts" },
      el("div", { class: "card" }, el("h2", {}, el("span", { text: "Best speedup vs evaluations" }), legend), chart(pts, "i", "evaluation #", (v) => String(Math.round(v)), "chart-evals", W)),
      el("div", { class: "card" }, el("h2", { text: "Best speedup vs time" }), chart(pts, "t", "time since start", (v) => fmtDur(v), "chart-time", W))));
}
function dotSwatch(c) { const d = el("span", { class: "sw" }); d.style.background = c; return d; }
function amdahl(shares, best) {
  let t = 1;
  shares.forEach((f, i) => { if (best[i] > 1) t -= f * (1 - 1 / best[i]); });
  return t > 0 ? 1 / t : 1;
}
function chart(pts, xkey, xlabel, xfmt, id, W) {
  const H = 300, L = 52, R = 16, T = 14, B = 58, lane = 14;
  const svg = sv("svg", { class: "chart", id, viewBox: `0 0 ${W} ${H}`, role: "img" });
  const ys = pts.flatMap((q) => (fin(q.s) ? [q.s, q.best] : [q.best]));
  let lo = Math.min(0.5, ...ys), hi = Math.max(2, ...ys);
  const ly0 = Math.log(lo * 0.95), ly1 = Math.log(hi * 1.05);
  const xmax = Math.max(1, ...pts.map((q) => q[xkey]));
  const X = (v) => L + ((W - L - R) * v) / xmax;
  const Y = (v) => T + (H - T - B) * (1 - (Math.log(v) - ly0) / (ly1 - ly0));
  const y0 = H - B;
  svg.append(sv("rect", { class: "lane", x: L, y: y0 + 6, width: W - L - R, height: lane }));
  svg.append(sv("text", { x: L - 6, y: y0 + 17, "text-anchor": "end" }, "failed"));
  for (const t of logTicks(lo, hi)) {
    svg.append(sv("line", { class: "grid", x1: L, x2: W - R, y1: Y(t), y2: Y(t) }));
    svg.append(sv("text", { x: L - 6, y: Y(t) + 4, "text-anchor": "end" }, t + "×"));
  }
  for (const t of niceTicks(0, xmax, 8)) {
    svg.append(sv("line", { class: "grid", x1: X(t), x2: X(t), y1: T, y2: y0 }));
    svg.append(sv("text", { x: X(t), y: y0 + 36, "text-anchor": "middle" }, xfmt(t)));
  }
  svg.append(sv("line", { class: "axis", x1: L, x2: W - R, y1: y0, y2: y0 }));
  svg.append(sv("line", { class: "axis", x1: L, x2: L, y1: T, y2: y0 }));
  svg.append(sv("line", { class: "one", x1: L, x2: W - R, y1: Y(1), y2: Y(1) }));
  svg.append(sv("text", { x: W - R, y: Y(1) - 4, "text-anchor": "end" }, "1.0× (eager)"));
  svg.append(sv("text", { x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle" }, xlabel));
  if (pts.length) {
    let d = "", prev = null;
    for (const q of pts) {
      const x = X(q[xkey]).toFixed(1), y = Y(q.best).toFixed(1);
      d += prev === null ? `M${L},${y}L${x},${y}` : `L${x},${prev}L${x},${y}`;
      prev = y;
    }
    d += `L${W - R},${prev}`;
    svg.append(sv("path", { class: "bestline", d }));
  }
  const g = sv("g", {});
  for (const q of pts) {
    const y = fin(q.s) && q.ok ? Y(q.s) : y0 + 6 + lane / 2 + ((q.node * 7) % 9) - 4;
    const c = sv("circle", { class: "dot", cx: X(q[xkey]).toFixed(1), cy: y.toFixed(1), r: 3.2, fill: verdictColour(q.reason), "data-node": q.node });
    c.append(sv("title", {}, `#${q.node} · ${q.reason}` + (fin(q.s) ? ` · ${fmtX(q.s)}` : "") + ` · best so far ${fmtX(q.best)}`));
    g.append(c);
  }
  g.addEventListener("click", (e) => { const n = e.target.getAttribute && e.target.getAttribute("data-node"); if (n) openNode(n); });
  svg.append(g);
  return svg;
}
function logTicks(lo, hi) {
  const c = [0.1, 0.2, 0.25, 0.5, 0.75, 1, 1.5, 2, 2.5, 3, 4, 5, 8, 10, 20, 50, 100];
  return c.filter((t) => t >= lo * 0.95 && t <= hi * 1.05);
}
function niceTicks(a, b, n) {
  const span = b - a || 1, step0 = span / n, mag = Math.pow(10, Math.floor(Math.log10(step0)));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= step0) || mag * 10;
  const out = [];
  for (let t = Math.ceil(a / step) * step; t <= b + 1e-9; t += step) out.push(+t.toFixed(10));
  return out;
}

// ---------------------------------------------------------------- tree view

async function loadTree(hid) { S.tree = await api("/api/tree", { hotspot: hid }); }
function treeHotspot() { return S.route.hotspot || (S.summary.hotspots.find((h) => h.status === "searching") || S.summary.hotspots[0] || {}).id; }
function speedColour(s) {
  // diverging at 1.0×: purple for slower, green for faster, saturating at 0.5× and 2×
  const t = Math.max(-1, Math.min(1, Math.log2(s)));
  const mid = [240, 240, 236], slow = [118, 42, 131], fast = [27, 120, 55];
  const to = t < 0 ? slow : fast, a = Math.abs(t);
  return `rgb(${mid.map((m, i) => Math.round(m + (to[i] - m) * a)).join(",")})`;
}
function layoutTree(nodes) {
  const byId = new Map(), kids = new Map(), roots = [];
  for (const n of nodes) { byId.set(n.id, n); kids.set(n.id, []); }
  for (const n of nodes) (n.parent_id !== null && byId.has(n.parent_id) ? kids.get(n.parent_id) : roots).push(n);
  let next = 0;
  const stack = roots.slice().reverse().map((n) => [n, false]);
  while (stack.length) {  // iterative post-order: leaves take the next slot, parents sit over their children
    const [n, done] = stack.pop();
    const ch = kids.get(n.id);
    if (!done && ch.length) { stack.push([n, true]); for (let i = ch.length - 1; i >= 0; i--) stack.push([ch[i], false]); continue; }
    n.x = ch.length ? (ch[0].x + ch[ch.length - 1].x) / 2 : next++;
  }
  return { byId, kids, roots, width: Math.max(1, next) };
}
function renderTree() {
  const root = $("view-tree"), s = S.summary, t = S.tree, hid = treeHotspot();
  const select = el("select", { id: "tree-hotspot", onchange: (e) => { S.treeView = null; go({ hotspot: e.target.value }, true); } },
    s.hotspots.map((h) => el("option", { value: h.id, text: `#${h.rank} ${h.pretty}` })));
  select.value = hid || "";
  const scale = el("span", { class: "scale" }, "0.5×", [0.5, 0.7, 0.85, 1, 1.2, 1.5, 2].map((v) => { const b = el("span", { class: "sw", title: fmtX(v) }); b.style.background = speedColour(v); return b; }), "2×",
    el("span", {}, dotSwatch(FAIL_COLOURS.compile_error), "failed"), el("span", {}, dotSwatch(PENDING_COLOUR), "pending"),
    el("span", {}, dotSwatch("#e0a100"), "best + path"), el("span", { text: "size: visits · dashed ring: evaluating" }));
  const bar = el("div", { class: "toolbar" }, el("label", { text: "hotspot" }), select,
    el("button", { type: "button", id: "tree-fit", onclick: () => { S.treeView = { hid: treeHotspot(), auto: true, fit: true }; renderTree(); } }, "fit all"),
    el("button", { type: "button", onclick: () => t && t.best_node_id && openNode(t.best_node_id) }, "open best"),
    scale);
  if (!t || t.hotspot_id !== hid) { root.replaceChildren(bar, el("p", { class: "muted", text: "loading tree…" })); return; }
  const nodes = t.nodes.map((r) => Object.fromEntries(t.cols.map((c, i) => [c, r[i]])));
  const info = el("span", { class: "muted", text: `${nodes.length} nodes · exploration c = ${fmtNum(t.exploration)}` });
  bar.append(info);
  if (!nodes.length) { root.replaceChildren(bar, el("p", { class: "muted", text: "No nodes for this hotspot yet." })); return; }
  const L = layoutTree(nodes);
  const DX = 18, DY = 64, PAD = 24;
  const maxDepth = Math.max(...nodes.map((n) => n.depth));
  const W = L.width * DX + 2 * PAD, H = (maxDepth + 1) * DY + 2 * PAD;
  const px = (n) => PAD + n.x * DX + DX / 2, py = (n) => PAD + n.depth * DY + 10;
  const onPath = new Set();
  for (let c = L.byId.get(t.best_node_id); c; c = L.byId.get(c.parent_id)) onPath.add(c.id);
  const svg = sv("svg", { class: "tree", id: "tree-svg" });
  const gEdges = sv("g", {}), gNodes = sv("g", {}), gRings = sv("g", {});
  for (const n of nodes) {
    const p = L.byId.get(n.parent_id);
    if (!p) continue;
    const y1 = py(p), y2 = py(n), ym = (y1 + y2) / 2;
    gEdges.append(sv("path", { class: "edge" + (onPath.has(n.id) && onPath.has(p.id) ? " best" : ""), d: `M${px(p)},${y1}C${px(p)},${ym} ${px(n)},${ym} ${px(n)},${y2}` }));
  }
  for (const n of nodes) {
    const r = Math.min(9, 3 + 1.1 * Math.sqrt(n.visits || 0));
    const fill = n.verdict === null ? PENDING_COLOUR : n.verdict === "ok" ? speedColour(n.speedup || 1) : "#d93025";
    let cls = "node";
    if (n.id === t.best_node_id) cls += " best"; else if (onPath.has(n.id)) cls += " onpath";
    if (String(n.id) === S.route.node) cls += " selected";
    gNodes.append(sv("circle", { class: cls, cx: px(n), cy: py(n), r: r.toFixed(1), fill, "data-node": n.id }));
    if (n.status === "evaluating") gRings.append(sv("circle", { class: "ring", cx: px(n), cy: py(n), r: (r + 4).toFixed(1), "data-evaluating": n.id }));
    if (n.id === t.best_node_id) gRings.append(sv("text", { class: "label", x: px(n) + r + 3, y: py(n) - r, text: "★ best " + fmtX(n.speedup) }));
  }
  svg.append(gEdges, gNodes, gRings);
  const byNode = new Map(nodes.map((n) => [String(n.id), n]));
  gNodes.addEventListener("mousemove", (e) => {
    const n = byNode.get(e.target.getAttribute("data-node"));
    if (!n) return;
    showTip(e, [`#${n.id}  ${n.move}`, `${n.verdict || n.status}` + (fin(n.speedup) ? `  ${fmtX(n.speedup)} vs eager` : "") + (fin(n.median_us) ? `  (${fmtUs(n.median_us)})` : ""),
      `visits ${n.visits}  ·  mean value ${fmtNum(n.mean)}  ·  UCT ${fmtNum(n.uct)}`, `depth ${n.depth}  ·  ${n.move_kind}${n.family ? "  ·  " + n.family : ""}`].join("\n"));
  });
  gNodes.addEventListener("mouseleave", hideTip);
  gNodes.addEventListener("click", (e) => { const id = e.target.getAttribute("data-node"); if (id) { hideTip(); openNode(id); } });
  const wrap = el("div", { class: "tree-wrap" }, svg, el("div", { class: "tree-help", text: "wheel: zoom · drag: pan · click: open candidate" }));
  root.replaceChildren(bar, wrap);
  const full = { x: 0, y: 0, w: W, h: H };
  const focus = L.byId.get(t.best_node_id) || L.byId.get(Number(S.route.node)) || L.roots[0];
  if (!S.treeView || S.treeView.hid !== hid || S.treeView.auto) {
    const fit = !!(S.treeView && S.treeView.hid === hid && S.treeView.fit);
    S.treeView = Object.assign({ hid, auto: true, fit }, fitBox(full, svg, fit ? null : [px(focus), py(focus)]));
  }
  applyView(svg);
  panZoom(svg);
}
// The whole tree, or (for a tree too big to read whole) a readable window around focus [x, y].
function fitBox(full, svg, focus) {
  const r = svg.getBoundingClientRect(), rw = r.width || 1000, rh = r.height || 620, aspect = rw / rh;
  let w = full.w, h = full.h;
  if (w / h < aspect) w = h * aspect; else h = w / aspect;
  if (w < 600) { h *= 600 / w; w = 600; }
  const MIN_SCALE = 0.7;  // screen pixels per layout unit: below this nodes are specks
  if (focus && rw / w < MIN_SCALE) {
    w = rw / MIN_SCALE; h = rh / MIN_SCALE;
    return { x: Math.max(full.x, Math.min(full.w - w, focus[0] - w / 2)), y: Math.max(full.y, focus[1] - 0.6 * h), w, h };
  }
  return { x: full.x - (w - full.w) / 2, y: full.y, w, h };
}
function applyView(svg) { const v = S.treeView; svg.setAttribute("viewBox", `${v.x} ${v.y} ${v.w} ${v.h}`); }
function panZoom(svg) {
  svg.addEventListener("wheel", (e) => {
    e.preventDefault();
    const v = S.treeView, r = svg.getBoundingClientRect(), k = Math.exp(e.deltaY * 0.0015);
    v.auto = false;
    const mx = v.x + ((e.clientX - r.left) / r.width) * v.w, my = v.y + ((e.clientY - r.top) / r.height) * v.h;
    v.w *= k; v.h *= k; v.x = mx - (mx - v.x) * k; v.y = my - (my - v.y) * k;
    applyView(svg);
  }, { passive: false });
  let drag = null;
  svg.addEventListener("pointerdown", (e) => { if (e.target.tagName === "circle") return; drag = { x: e.clientX, y: e.clientY }; svg.classList.add("dragging"); svg.setPointerCapture(e.pointerId); });
  svg.addEventListener("pointermove", (e) => {
    if (!drag) return;
    const v = S.treeView, r = svg.getBoundingClientRect();
    v.auto = false;
    v.x -= ((e.clientX - drag.x) / r.width) * v.w; v.y -= ((e.clientY - drag.y) / r.height) * v.h;
    drag = { x: e.clientX, y: e.clientY };
    applyView(svg);
  });
  const end = () => { drag = null; svg.classList.remove("dragging"); };
  svg.addEventListener("pointerup", end);
  svg.addEventListener("pointercancel", end);
}
function showTip(e, text) {
  const t = $("tooltip");
  t.textContent = text;
  t.hidden = false;
  t.style.left = Math.min(window.innerWidth - 430, e.clientX + 14) + "px";
  t.style.top = e.clientY + 14 + "px";
}
function hideTip() { $("tooltip").hidden = true; }

// ---------------------------------------------------------------- candidates view

const PAGE = 100;
async function loadCandidates() {
  const r = S.route;
  S.cands = await api("/api/candidates", { hotspot: r.hotspot, verdict: r.verdict, depth: r.depth, best: r.best, sort: r.sort || "id", dir: r.dir, offset: r.offset || 0, limit: PAGE });
}
function renderCandidates() {
  const root = $("view-candidates"), c = S.cands, r = S.route, s = S.summary;
  const f = (key) => (e) => go({ [key]: e.target.type === "checkbox" ? (e.target.checked ? "1" : "") : e.target.value, offset: "" });
  const hs = el("select", { id: "f-hotspot", onchange: f("hotspot") }, el("option", { value: "", text: "all hotspots" }), s.hotspots.map((h) => el("option", { value: h.id, text: `#${h.rank} ${h.op}` })));
  hs.value = r.hotspot || "";
  const vs = el("select", { id: "f-verdict", onchange: f("verdict") }, ["", "ok", "failed", "pending", "evaluating", ...c.reasons].map((v) => el("option", { value: v, text: v || "any verdict" })));
  vs.value = r.verdict || "";
  const ds = el("select", { id: "f-depth", onchange: f("depth") }, el("option", { value: "", text: "any depth" }), c.depths.map((d) => el("option", { value: d, text: "depth " + d })));
  ds.value = r.depth || "";
  const best = el("input", { type: "checkbox", id: "f-best", onchange: f("best") });
  best.checked = r.best === "1";
  const cols = [["id", "id", "id"], ["hotspot", "hotspot", "hotspot"], ["depth", "depth", "depth"], ["move", null], ["verdict", "verdict", "verdict"],
    ["vs eager", "speedup", "num"], ["vs compile", null, "num"], ["median", "median", "num"], ["IQR", null, "num"], ["max abs err", null, "num"], ["visits", "visits", "num"], ["detail", null]];
  const sort = r.sort || "id", desc = r.dir === "desc";
  const head = el("tr", {}, cols.map(([label, key, cls]) => el("th", {
    class: [cls === "num" ? "num" : "", key ? "sortable" : "", key === sort ? "sorted" + (desc ? " desc" : "") : ""].join(" "),
    onclick: key ? () => go({ sort: key, dir: key === sort && !desc ? "desc" : "", offset: "" }) : null, text: label })));
  const body = c.items.map((it) => el("tr", { class: "click", "data-node": it.id, onclick: () => openNode(it.id) },
    el("td", { class: "mono" }, "#" + it.id, it.best ? el("span", { class: "star", title: "best of its hotspot", text: " ★" }) : null),
    el("td", { title: it.hotspot_id, text: (hotspotById(it.hotspot_id) || {}).op || it.hotspot_id }),
    el("td", { text: it.depth }), el("td", { class: "mono small move", title: it.move, text: it.move }), el("td", {}, chip(it.verdict)),
    el("td", { class: "num " + (it.speedup_vs_eager > 1 ? "good" : ""), text: fmtX(it.speedup_vs_eager) }), el("td", { class: "num", text: fmtX(it.speedup_vs_compile) }),
    el("td", { class: "num", text: fmtUs(it.median_us) }), el("td", { class: "num", text: fmtUs(it.iqr_us) }), el("td", { class: "num", text: fmtNum(it.max_abs_err) }),
    el("td", { class: "num", text: it.visits }), el("td", { class: "detail", title: it.detail, text: it.detail })));
  const off = c.offset || 0;
  const pager = el("div", { class: "pager" },
    el("button", { type: "button", disabled: off <= 0, onclick: () => go({ offset: Math.max(0, off - PAGE) || "" }) }, "‹ prev"),
    el("span", { id: "cand-count", text: c.total ? `${off + 1}–${Math.min(off + PAGE, c.total)} of ${fmtInt(c.total)}` : "no candidates match" }),
    el("button", { type: "button", disabled: off + PAGE >= c.total, onclick: () => go({ offset: off + PAGE }) }, "next ›"));
  root.replaceChildren(el("div", { class: "card" },
    el("div", { class: "toolbar" }, el("label", { text: "hotspot" }), hs, el("label", { text: "verdict" }), vs, el("label", { text: "depth" }), ds,
      el("label", { for: "f-best", title: "candidates that raised their hotspot's best speedup (★ = best)" }, best, " best only")),
    // the table scrolls inside its card rather than spilling out of it on a narrow window
    el("div", { class: "table-wrap", id: "cand-wrap" }, el("table", { id: "cand-table" }, el("thead", {}, head), el("tbody", {}, body))), pager));
}

// ---------------------------------------------------------------- candidate detail

async function loadNode(id) {
  S.node = await api("/api/node", { id });
  const n = S.node;
  S.nodeSources[n.id] = n.candidate.source || "";
}
async function sourceOf(id) {
  if (!(id in S.nodeSources)) S.nodeSources[id] = (await api("/api/source", { id })).source || "";
  return S.nodeSources[id];
}
function codeBlock(text, id) {
  const lines = (text || "").replace(/\n$/, "").split("\n");
  return el("div", { class: "code", id }, lines.map((l, i) => el("div", { class: "l" }, el("span", { class: "ln", text: i + 1 }), el("span", { class: "tx", text: l }))));
}
// Indented JSON with arrays of plain values kept on one line (launch specs are mostly such arrays).
function compactJson(v) {
  return JSON.stringify(v, null, 2).replace(/\[\s+([^[\]{}]*?)\s+\]/g, (m, inner) => "[" + inner.split(/,\s+/).join(", ") + "]");
}
function kv(pairs) { return el("dl", { class: "kv" }, pairs.filter((p) => p).flatMap(([k, v]) => [el("dt", { text: k }), el("dd", {}, v instanceof Node ? v : String(v ?? "—"))])); }
// The verification rule in words (forge_pack/evaluate/verdict_rules.py compare), shown with every verdict.
const TOLERANCE_RULE = "An element passes when |out − ref| ≤ max(atol, eager allowance) + rtol × |ref| (ref: float64; "
  + "allowance: 2× eager PyTorch's own error at that magnitude). Max rel err is |out − ref| / max(|ref|, atol): "
  + "where |ref| is near zero the atol term sets the bound, so a large relative error there passes as long as the "
  + "absolute error stays within atol.";
// One check's numbers explained: which term of the bound lets it pass (or by how much it failed).
function explainCheck(c) {
  if (!fin(c.atol) || !fin(c.rtol)) return "";
  const knee = c.rtol > 0 ? c.atol / c.rtol : Infinity;  // |ref| where atol and rtol·|ref| are equal
  if (!c.passed) return c.mismatches ? `${fmtInt(c.mismatches)} element(s) beyond atol ${fmtNum(c.atol)} + rtol ${fmtNum(c.rtol)} × |ref|` : "";
  if (fin(c.max_rel_err) && c.max_rel_err > c.rtol) {
    return `max rel err ${fmtNum(c.max_rel_err)} > rtol ${fmtNum(c.rtol)}, ok: that element passes through the bound's `
      + `absolute term, atol ${fmtNum(c.atol)} (or eager's allowance), which dominates where |ref| is small (below atol / rtol = ${fmtNum(knee)})`;
  }
  return `within rtol ${fmtNum(c.rtol)} × |ref| everywhere (max rel err ${fmtNum(c.max_rel_err)})`;
}
function renderNode() {
  const root = $("view-node"), n = S.node;
  if (!n) { root.replaceChildren(el("p", { class: "muted", text: "loading candidate…" })); return; }
  const ev = n.evaluation, v = ev ? ev.verdict : null, t = ev ? ev.timing : null, b = n.baseline || {};
  const verdict = v ? (v.ok ? "ok" : v.reason) : n.status;
  const eagerUs = b.eager ? b.eager.median_us : null, compUs = b.compiled ? b.compiled.median_us : null;
  const crumbs = el("div", { class: "crumbs" }, "path: ", n.path.flatMap((id) => [nodeLink(id), " › "]), el("b", { text: "#" + n.id }),
    n.children.length ? el("span", { class: "muted" }, "   children: ", n.children.slice(0, 30).flatMap((id, i) => [i ? ", " : "", nodeLink(id)]), n.children.length > 30 ? " …" : "") : null);
  const title = el("div", { class: "card" },
    el("div", { class: "row" }, el("h2", { text: `Candidate #${n.id}` }), chip(verdict), n.best ? el("span", { class: "star", text: "★ best of hotspot" }) : null,
      link("show in tree", { view: "tree", hotspot: n.hotspot_id, node: n.id })),
    el("div", { class: "mono small", text: n.hotspot_pretty }),
    el("div", {}, el("span", { class: "muted", text: "move: " }), el("span", { class: "mono", text: n.move }), el("span", { class: "muted", text: `  ·  ${n.move_kind} · origin ${n.origin || "—"} · family ${n.family || "—"} · depth ${n.depth}` })),
    el("div", { class: "mono small muted", text: "params " + JSON.stringify(n.params || {}) }), crumbs);
  const stats = n.stats || {};
  const summary = el("div", { class: "card" }, el("h2", { text: "Timing" }), t ? kv([
    ["median", fmtUs(t.median_us)], ["IQR", fmtUs(t.iqr_us)], ["n", t.n], ["min", fmtUs(t.min_us)], ["clock", t.clock],
    ["eager", fmtUs(eagerUs)], ["torch.compile", fmtUs(compUs) + (b.compile_error ? " (failed)" : "")],
    ["vs eager", el("span", { class: ev.speedup_vs_eager > 1 ? "good" : "", text: fmtX(ev.speedup_vs_eager) })], ["vs compile", fmtX(ev.speedup_vs_compile)],
    ["bandwidth", fin(ev.bandwidth_fraction) ? fmtPct(ev.bandwidth_fraction) + " of copy bandwidth" : "—"], ["floor", fmtUs(b.floor_us)],
  ]) : el("p", { class: "muted", text: ev ? "not timed (failed before benchmarking)" : "not evaluated yet" }),
  el("h3", { text: "search" }), kv([["reward", fmtNum(ev && ev.reward)], ["visits", stats.visits ?? 0], ["mean value", fmtNum(stats.mean)], ["UCT score", fmtNum(stats.uct)],
    ["compile", ev ? fmtNum(ev.compile_s) + " s" : "—"], ["evaluation", ev ? fmtNum(ev.eval_s) + " s" : "—"]]));
  const verify = el("div", { class: "card" }, el("h2", { text: "Verification" }),
    v ? [el("div", {}, v.ok ? el("span", { class: "pass", text: "passed" }) : el("span", { class: "failtxt", text: v.reason }),
      el("span", { class: "muted", text: `   max abs err ${fmtNum(v.max_abs_err)} · max rel err ${fmtNum(v.max_rel_err)}` })),
    el("p", { class: "small muted", id: "tol-rule", text: TOLERANCE_RULE }),
    v.detail ? el("pre", { class: "block", id: "verdict-detail", text: v.detail }) : null,
    (v.checks || []).length ? el("div", { class: "table-wrap" }, el("table", { id: "checks" }, el("thead", {}, el("tr", {}, ["input", "result", "max abs", "max rel", "atol", "rtol", "mismatches", "NaN", "Inf", "why", "first mismatch"].map((h) => el("th", { text: h })))),
      el("tbody", {}, v.checks.map((c) => el("tr", {}, el("td", { class: "mono small", text: c.input_kind }), el("td", {}, c.passed ? el("span", { class: "pass", text: "pass" }) : el("span", { class: "failtxt", text: "FAIL" })),
        el("td", { class: "num", text: fmtNum(c.max_abs_err) }), el("td", { class: "num", text: fmtNum(c.max_rel_err) }), el("td", { class: "num", text: fmtNum(c.atol) }), el("td", { class: "num", text: fmtNum(c.rtol) }),
        el("td", { class: "num", text: fmtInt(c.mismatches) }), el("td", { class: "num", text: fmtInt(c.nan_count) }), el("td", { class: "num", text: fmtInt(c.inf_count) }),
        el("td", { class: "small why", text: explainCheck(c) }), el("td", { class: "mono small", text: c.first_mismatch || "" }))))))
      : el("p", { class: "muted", text: "no per-input checks recorded" })] : el("p", { class: "muted", text: "not evaluated yet" }));
  const res = ev && ev.resources && ev.resources.length ? el("table", { id: "resources" }, el("thead", {}, el("tr", {}, ["kernel", "registers", "spill stores", "spill loads", "shared mem", "stack"].map((h, i) => el("th", { class: i ? "num" : null, text: h })))),
    el("tbody", {}, ev.resources.map((k) => el("tr", {}, el("td", { class: "mono", text: k.name }), ...["registers", "spill_stores", "spill_loads", "smem_bytes", "stack_bytes"].map((f) =>
      el("td", { class: "num " + (f.startsWith("spill") && k[f] > 0 ? "bad" : ""), text: k[f] === undefined ? "—" : k[f] + (f.endsWith("bytes") || f.startsWith("spill") ? " B" : "") })))))) : el("p", { class: "muted", text: "no register / shared memory report in the compile log" });
  const compile = el("div", { class: "card" }, el("h2", { text: "Compile" }),
    ev ? [el("pre", { class: "block", id: "compile-cmd", text: ev.compile_cmd || "(command not recorded)" }), el("h3", { text: "resources" }), res,
      el("h3", { text: "log" }), el("pre", { class: "block", id: "compile-log", text: ev.compile_log || "(empty)" })] : el("p", { class: "muted", text: "not compiled yet" }));
  const src = n.candidate.source || "";
  const sourceCard = el("div", { class: "card" }, el("h2", {}, el("span", { text: `Source (${n.candidate.backend || ""}, ${src.split("\n").length} lines)` })), codeBlock(src, "source"),
    el("h3", { text: "launch spec" }), el("pre", { class: "block mono", id: "launch-spec", text: compactJson(n.candidate.spec) }));
  const against = S.route.against || (n.parent_id !== null ? String(n.parent_id) : "");
  const otherInput = el("input", { type: "number", id: "diff-against", min: 1, value: against, placeholder: "node id" });
  const diffBox = el("div", { id: "diff" }, el("p", { class: "muted", text: against ? "computing diff…" : "root candidate: enter another node id to compare" }));
  const diffCard = el("div", { class: "card" }, el("div", { class: "toolbar" }, el("h2", { text: "Diff" }), el("label", { text: "against" }), otherInput,
    n.parent_id !== null ? el("button", { type: "button", onclick: () => go({ against: "" }, true) }, `parent #${n.parent_id}`) : null,
    el("button", { type: "button", onclick: () => go({ against: otherInput.value }, true) }, "compare")), diffBox);
  otherInput.addEventListener("keydown", (e) => { if (e.key === "Enter") go({ against: otherInput.value }, true); });
  const llm = el("div", { class: "card" }, el("h2", { text: `LLM calls (${n.llm_calls.length})` }),
    n.llm_calls.length ? n.llm_calls.map((c) => el("div", { class: "llm" },
      el("div", { class: "small" }, el("b", { text: c.purpose || "call" }), ` (${c.relation}) · call ${c.id}`, ` · ${c.model || ""} · ${c.outcome || ""} · ${fmtInt(c.prompt_tokens)} in / ${fmtInt(c.completion_tokens)} out · $${(c.cost_usd || 0).toFixed(4)} · ${fmtNum(c.latency_s)} s`),
      c.error ? el("pre", { class: "block", text: c.error }) : null,
      el("details", {}, el("summary", { text: "prompt" }), el("pre", { class: "block llm-prompt", text: c.prompt || "" })),
      el("details", { open: c.relation === "produced this candidate" }, el("summary", { text: "reply" }), el("pre", { class: "block llm-reply", text: c.reply || "" })))) : el("p", { class: "muted", text: "No LLM call produced this candidate or expanded it." }));
  root.replaceChildren(title, el("div", { class: "grid2" }, summary, compile), verify, el("div", { class: "grid2" }, sourceCard, diffCard), llm);
  if (against) renderDiff(n.id, against, diffBox);
}
async function renderDiff(id, other, box) {
  try {
    const [a, b] = await Promise.all([sourceOf(other), sourceOf(id)]);
    const rows = diffLines(a.replace(/\n$/, "").split("\n"), b.replace(/\n$/, "").split("\n"));
    const adds = rows.filter((r) => r[0] === "+").length, dels = rows.filter((r) => r[0] === "-").length;
    const view = el("div", { class: "code", id: "diff-code" });
    for (const r of collapse(rows, 3)) {
      if (r[0] === "gap") { view.append(el("div", { class: "l gap" }, el("span", { class: "ln", text: "" }), el("span", { class: "ln ln2", text: "" }), el("span", { class: "tx", text: `… ${r[1]} unchanged lines …` }))); continue; }
      const cls = r[0] === "+" ? "add" : r[0] === "-" ? "del" : "same";
      view.append(el("div", { class: "l " + cls }, el("span", { class: "ln", text: r[1] ?? "" }), el("span", { class: "ln ln2", text: r[2] ?? "" }), el("span", { class: "tx", text: r[3] })));
    }
    box.replaceChildren(el("div", { class: "small muted", id: "diff-stat" }, `#${other} → #${id}: `, el("span", { class: "good", text: `+${adds}` }), " ", el("span", { class: "bad", text: `−${dels}` }), adds + dels === 0 ? "  (identical sources)" : ""), view);
  } catch (e) {
    box.replaceChildren(el("p", { class: "bad", text: e.status === 404 ? `no candidate #${other}` : "diff failed: " + e.message }));
  }
}
// Line diff (Myers, O((N+M)·D)) after trimming the common prefix and suffix.
// Rows: ["=", oldNo, newNo, text] | ["-", oldNo, null, text] | ["+", null, newNo, text].
function diffLines(a, b) {
  let pre = 0;
  while (pre < a.length && pre < b.length && a[pre] === b[pre]) pre++;
  let suf = 0;
  while (suf < a.length - pre && suf < b.length - pre && a[a.length - 1 - suf] === b[b.length - 1 - suf]) suf++;
  const A = a.slice(pre, a.length - suf), B = b.slice(pre, b.length - suf);
  const out = [];
  for (let i = 0; i < pre; i++) out.push(["=", i + 1, i + 1, a[i]]);
  for (const [op, i, j] of myers(A, B)) {
    if (op === "=") out.push(["=", pre + i + 1, pre + j + 1, A[i]]);
    else if (op === "-") out.push(["-", pre + i + 1, null, A[i]]);
    else out.push(["+", null, pre + j + 1, B[j]]);
  }
  for (let k = 0; k < suf; k++) out.push(["=", a.length - suf + k + 1, b.length - suf + k + 1, a[a.length - suf + k]]);
  return out;
}
function myers(a, b) {
  const n = a.length, m = b.length, max = n + m, off = max + 1, LIMIT = 4000;
  if (!n) return b.map((_, j) => ["+", null, j]);
  if (!m) return a.map((_, i) => ["-", i, null]);
  const v = new Int32Array(2 * max + 3), trace = [];
  for (let d = 0; d <= Math.min(max, LIMIT); d++) {
    trace.push(v.slice());
    for (let k = -d; k <= d; k += 2) {
      let x = k === -d || (k !== d && v[off + k - 1] < v[off + k + 1]) ? v[off + k + 1] : v[off + k - 1] + 1;
      let y = x - k;
      while (x < n && y < m && a[x] === b[y]) { x++; y++; }
      v[off + k] = x;
      if (x >= n && y >= m) return backtrack(trace, n, m, off);
    }
  }
  return [...a.map((_, i) => ["-", i, null]), ...b.map((_, j) => ["+", null, j])];  // too different: replace all
}
function backtrack(trace, n, m, off) {
  const ops = [];
  let x = n, y = m;
  for (let d = trace.length - 1; d >= 0; d--) {
    const v = trace[d], k = x - y;
    const pk = k === -d || (k !== d && v[off + k - 1] < v[off + k + 1]) ? k + 1 : k - 1;
    const px = v[off + pk], py = px - pk;
    while (x > px && y > py) { x--; y--; ops.push(["=", x, y]); }
    if (d > 0) { if (x === px) ops.push(["+", null, py]); else ops.push(["-", px, null]); }
    x = px; y = py;
  }
  return ops.reverse();
}
function collapse(rows, ctx) {
  const out = [];
  let i = 0;
  while (i < rows.length) {
    if (rows[i][0] !== "=") { out.push(rows[i++]); continue; }
    let j = i;
    while (j < rows.length && rows[j][0] === "=") j++;
    const run = j - i, head = i === 0 ? 0 : ctx, tail = j === rows.length ? 0 : ctx;
    if (run > head + tail + 2) {
      out.push(...rows.slice(i, i + head), ["gap", run - head - tail], ...rows.slice(j - tail, j));
    } else out.push(...rows.slice(i, j));
    i = j;
  }
  return out;
}

// ---------------------------------------------------------------- failures view

async function loadFailures() { S.failures = await api("/api/failures", { hotspot: S.route.hotspot }); }
function renderFailures() {
  const root = $("view-failures"), f = S.failures, s = S.summary;
  const hs = el("select", { id: "fail-hotspot", onchange: (e) => go({ hotspot: e.target.value }, true) }, el("option", { value: "", text: "all hotspots" }), s.hotspots.map((h) => el("option", { value: h.id, text: `#${h.rank} ${h.pretty}` })));
  hs.value = S.route.hotspot || "";
  const total = Object.values(f.by_reason).reduce((a, b) => a + b, 0);
  const maxN = Math.max(1, ...Object.values(f.by_reason));
  const bars = el("div", { class: "bars" }, Object.entries(f.by_reason).sort((a, b) => b[1] - a[1]).map(([reason, n]) => {
    const bar = el("div", { class: "b" });
    bar.style.width = (100 * n) / maxN + "%";
    bar.style.background = verdictColour(reason);
    return el("div", { class: "barrow" }, el("a", { href: routeHash({ view: "candidates", verdict: reason, hotspot: S.route.hotspot }), text: reason }), el("div", {}, bar), el("span", { class: "num", text: n }));
  }));
  const groups = el("table", { id: "fail-groups" }, el("thead", {}, el("tr", {}, ["reason", "message (numbers blanked as #)", "count", "hotspots", "examples"].map((h, i) => el("th", { class: i === 2 ? "num" : null, text: h })))),
    el("tbody", {}, f.groups.map((g) => el("tr", {},
      el("td", {}, chip(g.reason)),
      el("td", {}, el("div", { class: "mono small", text: g.message || "(no message)" }), el("details", {}, el("summary", { text: "first example" }), el("pre", { class: "block", text: g.example }))),
      el("td", { class: "num", text: g.count }),
      el("td", { class: "small" }, g.hotspots.map((h, i) => [i ? ", " : "", (hotspotById(h) || {}).op || h])),
      el("td", {}, g.node_ids.flatMap((id, i) => [i ? " " : "", nodeLink(id)]), g.count > g.node_ids.length ? " …" : "")))));
  root.replaceChildren(el("div", { class: "toolbar" }, el("label", { text: "hotspot" }), hs, el("span", { class: "muted", text: `${fmtInt(total)} failed evaluations in ${f.groups.length} groups` })),
    el("div", { class: "card" }, el("h2", { text: "Failures by reason" }), total ? bars : el("p", { class: "muted", text: "No failed evaluations." })),
    el("div", { class: "card" }, el("h2", { text: "Grouped by reason and message" }), groups));
}

// ---------------------------------------------------------------- routing, loading, live updates

const VIEWS = {
  hotspots: { load: null, render: renderHotspots },
  progress: { load: loadProgress, render: renderProgress, keep: () => !!S.progress },
  tree: { load: () => loadTree(treeHotspot()), render: renderTree, keep: () => S.tree && S.tree.hotspot_id === treeHotspot() },
  candidates: { load: loadCandidates, render: renderCandidates },
  failures: { load: loadFailures, render: renderFailures },
  node: { load: () => loadNode(S.route.node), render: renderNode, keep: () => S.node && String(S.node.id) === String(S.route.node) },
};
async function onRoute() {
  const prev = S.route;
  S.route = parseRoute();
  const r = S.route, view = VIEWS[r.view] ? r.view : "hotspots";
  for (const a of document.querySelectorAll("#tabs a")) a.classList.toggle("active", a.dataset.view === view);
  const nodeId = view === "node" ? r.node : S.node && S.node.id;
  $("tab-node").hidden = !nodeId;
  if (nodeId) { $("tab-node").textContent = "Candidate #" + nodeId; $("tab-node").href = routeHash({ view: "node", node: nodeId }); }
  for (const k of Object.keys(VIEWS)) $("view-" + k).hidden = k !== view;
  hideTip();
  if (!S.summary) return;
  const same = prev.view === view && JSON.stringify(prev) === JSON.stringify(r);
  await showView(view, !same);
}
async function showView(view, force) {
  const v = VIEWS[view];
  try {
    if (v.load && (force || S.dirty[view] || !(v.keep && v.keep()))) {
      if (view === "node" && S.node && String(S.node.id) !== String(S.route.node)) S.node = null;
      if (view === "node" && !S.node) renderNode();
      await v.load();
    }
    S.dirty[view] = false;
    S.lastRender[view] = Date.now();
    if (VIEWS[S.route.view] === v) v.render();
    notice("");
  } catch (e) {
    notice(e.status === 404 ? "Not found: " + e.message : "Could not load this view: " + e.message);
  }
}
async function refreshSummary() {
  S.summary = await api("/api/summary");
  S.summaryAt = Date.now();
  if (!S.cursor) S.cursor = S.summary.cursor;
  renderHeader();
}
function handleEvents(evs) {
  const kinds = new Set(evs.map((e) => e[2]));
  const hids = new Set(evs.map((e) => e[3]));
  const nids = new Set(evs.map((e) => e[4]));
  S.dirty.summary = true;
  if (progressFromEvents(evs)) S.dirty.progressRender = true;
  if (S.tree && hids.has(S.tree.hotspot_id)) S.dirty.tree = true;
  if (kinds.has("node_added") || kinds.has("eval_done") || kinds.has("eval_start")) S.dirty.candidates = true;
  if (kinds.has("eval_done")) S.dirty.failures = true;
  if (S.node && (nids.has(S.node.id) || evs.some((e) => e[5] && e[5].parent_id === S.node.id))) S.dirty.node = true;
  if (kinds.has("hotspot_start") || kinds.has("hotspot_done") || kinds.has("run_end") || kinds.has("run_start")) S.dirty.hotspots = true;
}
async function tick() {
  const now = Date.now();
  if (S.dirty.summary || now - S.summaryAt > SUMMARY_EVERY_MS) {
    S.dirty.summary = false;
    await refreshSummary();
    if (S.route.view === "hotspots") renderHotspots();
  } else renderHeader();  // ages and elapsed time move on
  const view = S.route.view;
  if (now - (S.lastRender[view] || 0) < RERENDER_MIN_MS) return;
  if (view === "progress" && S.dirty.progressRender) { S.dirty.progressRender = false; S.lastRender.progress = now; renderProgress(); }
  else if (view !== "progress" && view !== "hotspots" && S.dirty[view]) await showView(view, false);
}
async function poll() {
  let delay = POLL_IDLE_MS;
  try {
    const r = await api("/api/events", { after: S.cursor });
    $("h-conn").hidden = true;
    S.cursor = r.cursor;
    if (r.events.length) handleEvents(r.events);
    await tick();
    const live = S.summary && S.summary.run && S.summary.run.state === "running";
    delay = r.more ? 50 : live ? POLL_LIVE_MS : POLL_IDLE_MS;
  } catch (e) {
    $("h-conn").hidden = false;
    if (e.status === 401) { notice("The server refused the token: open the URL that `forge-pack ui` printed."); return; }
  }
  S.timers.poll = setTimeout(poll, delay);
}
function main() {
  S.token = takeToken();
  $("c-pause").addEventListener("click", () => sendControl("pause"));
  $("c-resume").addEventListener("click", () => sendControl("resume"));
  $("c-stop").addEventListener("click", () => sendControl("stop"));
  window.addEventListener("hashchange", onRoute);
  if (!S.token) { notice("No access token: open the URL that `forge-pack ui` printed (it ends in #token=…)."); return; }
  start();
}
async function start() {
  try { await refreshSummary(); } catch (e) {
    notice(e.status === 401 ? "The server refused the token: open the URL that `forge-pack ui` printed." : "Cannot reach the dashboard server: " + e.message);
    if (e.status !== 401) S.timers.poll = setTimeout(start, POLL_IDLE_MS);
    return;
  }
  await onRoute();
  document.body.dataset.ready = "1";
  S.timers.poll = setTimeout(poll, POLL_LIVE_MS);
}
document.addEventListener("DOMContentLoaded", main);
