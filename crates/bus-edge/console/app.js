// The agent-harness console: one page that speaks the bus protocol over a WebSocket
// (engine-gateway/PROTOCOL.md) as any client does. Everything it shows comes from function
// IDs on the bus, so it works the same against the embedded engine and the deployed
// WebSocket API. Text from the bus is always set as text, never as markup: model output and
// tool arguments are hostile input.
"use strict";

// ------------------------------------------------------------------ small helpers
const $ = (sel) => document.querySelector(sel);

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "style") el.style.cssText = v; // CSSOM: allowed under the page's CSP, unlike a style attribute
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const fmt = {
  int: (n) => (Number.isFinite(n) ? Math.round(n).toLocaleString("en") : "–"),
  usd: (n) => (Number.isFinite(n) ? "$" + n.toFixed(n < 1 ? 4 : 2) : "–"),
  ms: (n) => (!Number.isFinite(n) ? "–" : n < 1000 ? n.toFixed(n < 10 ? 2 : 0) + " ms" : (n / 1000).toFixed(2) + " s"),
  age(ms) {
    if (!ms) return "–";
    const s = Math.max(0, (Date.now() - ms) / 1000);
    if (s < 60) return Math.floor(s) + "s ago";
    if (s < 3600) return Math.floor(s / 60) + "m ago";
    if (s < 86400) return Math.floor(s / 3600) + "h ago";
    return Math.floor(s / 86400) + "d ago";
  },
  json(v) {
    try { return JSON.stringify(v, null, 2); } catch { return String(v); }
  },
};

// A run's state in words; the raw state in the tooltip.
const STATE_WORDS = {
  provisioning: "starting", assistant_streaming: "the model is answering", function_execute: "running tools",
  function_awaiting_approval: "waiting for your approval", steering_check: "between turns",
  stopped: "stopped", failed: "failed", "no run": "no run",
};
function badge(state) {
  const raw = String(state || "none");
  return h("span", { class: "badge " + raw.replace(/[^a-z_]/g, ""), title: raw }, STATE_WORDS[raw] || raw || "–");
}

// Tool calls of a run so far: those decided, and the ones parked for approval.
function toolCalls(turn) {
  if (!turn) return NaN;
  return ((turn.totals && turn.totals.tool_calls) || 0) + ((turn.awaiting_approval && turn.awaiting_approval.length) || 0);
}

// Errors are shown, never swallowed: a list under the header, each dismissable.
function showError(where, err) {
  const text = `${where}: ${err && err.code ? err.code + ": " : ""}${(err && err.message) || err}`;
  const box = h("div", { class: "error" }, h("p", {}, text),
    h("button", { type: "button", "aria-label": "Dismiss", onclick: (e) => e.target.closest(".error").remove() }, "×"));
  const list = $("#errors");
  list.append(box);
  while (list.children.length > 5) list.firstElementChild.remove();
  console.warn(text);
}

// ------------------------------------------------------------------ the bus
// What makes an `invocationresultpart` unusable for the call `p` (null: nothing).
function partProblem(msg, p) {
  const { count, index, text } = msg;
  if (!Number.isInteger(count) || count < 1 || count > 128) return `a part's count ${JSON.stringify(count)} is not a whole number from 1 to 128`;
  if (!Number.isInteger(index) || index < 0 || index >= count) return `a part's index ${JSON.stringify(index)} is not from 0 to ${count - 1}`;
  if (typeof text !== "string") return `part ${index}'s text is not a string`;
  if (p.parts && p.parts.length !== count) return `part ${index} says ${count} parts where an earlier one said ${p.parts.length}`;
  if (p.parts && p.parts[index] !== null) return `part ${index} came twice`;
  return null;
}

class Bus {
  constructor(url) {
    this.url = url;
    this.pending = new Map();
    this.seq = 0;
    this.subs = new Map(); // "stream|group" -> Set(handler)
    this.closed = false;
    this.backoff = 500;
    this.ready = this.open();
  }

  open() {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(this.url);
      this.ws = ws;
      let opened = false;
      // Open means accepted: $connect checked the token and origin before the upgrade. (The
      // local engine also says `workerregistered`; the deployed API Gateway cannot.)
      ws.onopen = () => { opened = true; setConn(true); resolve(); };
      ws.onmessage = (ev) => this.receive(ev.data);
      ws.onerror = () => {};
      ws.onclose = (ev) => {
        setConn(false, ev.code === 1000 ? "closed" : `offline (${ev.code})`);
        for (const [, p] of this.pending) p.reject({ code: "disconnected", message: "the connection to the engine closed" });
        this.pending.clear();
        if (!opened) { reject({ code: "connect_failed", message: `cannot connect to ${redact(this.url)} (code ${ev.code}): wrong token, origin not allowed, or engine down` }); return; }
        if (!this.closed) setTimeout(() => this.reconnect(), this.backoff);
      };
    });
  }

  async reconnect() {
    this.backoff = Math.min(this.backoff * 2, 10000);
    try {
      await (this.ready = this.open());
      this.backoff = 500;
      for (const key of this.subs.keys()) {
        const [stream, group] = key.split("|");
        this.send({ type: "streamsubscribe", stream_name: stream, group_id: group || null, batch: true });
      }
      router();
    } catch {
      if (!this.closed) setTimeout(() => this.reconnect(), this.backoff);
    }
  }

  close() { this.closed = true; if (this.ws) this.ws.close(1000); }

  send(msg) { this.ws.send(JSON.stringify(msg)); }

  receive(text) {
    let msg;
    try { msg = JSON.parse(text); } catch { return; }
    switch (msg.type) {
      case "workerregistered": break;
      case "invocationresult": {
        const p = this.pending.get(msg.invocation_id);
        if (!p) return;
        this.pending.delete(msg.invocation_id);
        clearTimeout(p.timer);
        if (msg.error) p.reject(msg.error); else p.resolve(msg.result ?? null);
        break;
      }
      // An answer over one WebSocket message (the deployed API Gateway's 128 KB), in parts
      // of its JSON text: kept with its call, whole once every part came. A part that cannot
      // be one fails its call at once, naming what is wrong (not a wait for the timeout).
      case "invocationresultpart": {
        const p = this.pending.get(msg.invocation_id);
        if (!p) return;
        const wrong = partProblem(msg, p);
        if (wrong) { this.fail(msg.invocation_id, wrong); return; }
        if (!p.parts) { p.parts = new Array(msg.count).fill(null); p.got = 0; }
        p.parts[msg.index] = msg.text;
        p.got += 1;
        if (p.got === msg.count) {
          const whole = p.parts.join("");
          p.parts = null;
          let answer;
          try { answer = JSON.parse(whole); } catch { answer = null; }
          if (!answer || answer.type !== "invocationresult" || answer.invocation_id !== msg.invocation_id) {
            this.fail(msg.invocation_id, `its parts (${msg.count}) do not join into this call's invocationresult`);
            return;
          }
          this.receive(whole);
        }
        break;
      }
      case "streamevent": this.dispatch(msg); break;
      case "streamevents": {
        const events = Array.isArray(msg.events) ? msg.events : [];
        for (const e of events) {
          this.dispatch({ type: "streamevent", stream_name: msg.stream_name, group_id: msg.group_id, item_id: e && e.item_id, event: e && e.event });
        }
        break;
      }
      case "ping": this.send({ type: "pong" }); break;
      case "error": showError("bus", msg.error || msg); break;
      default: break;
    }
  }

  // A pending call ends with an answer that could not be read.
  fail(invocationId, what) {
    const p = this.pending.get(invocationId);
    if (!p) return;
    this.pending.delete(invocationId);
    clearTimeout(p.timer);
    p.reject({ code: "invalid_message", message: `the answer came in parts, and ${what}` });
  }

  // One stream event to the subscribers of its group and of every group.
  dispatch(msg) {
    for (const key of [`${msg.stream_name}|${msg.group_id}`, `${msg.stream_name}|`]) {
      for (const fn of this.subs.get(key) || []) {
        try { fn(msg); } catch (e) { console.error(e); }
      }
    }
  }

  async call(functionId, data, timeoutMs = 30000) {
    await this.ready;
    const id = `c${Date.now().toString(36)}-${++this.seq}`;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject({ code: "timeout", message: `${functionId} did not answer in ${timeoutMs / 1000} s` });
      }, timeoutMs);
      this.pending.set(id, { resolve, reject, timer });
      try {
        this.send({ type: "invokefunction", invocation_id: id, function_id: functionId, data: data || {}, timeout_ms: timeoutMs, accept_parts: true });
      } catch (e) {
        clearTimeout(timer);
        this.pending.delete(id);
        reject({ code: "disconnected", message: String(e) });
      }
    });
  }

  // Subscribe to a stream (group null: every group). Returns the unsubscribe function.
  subscribe(stream, group, fn) {
    const key = `${stream}|${group || ""}`;
    if (!this.subs.has(key)) {
      this.subs.set(key, new Set());
      // `batch`: the deployed shape may post a write's events in one `streamevents` message.
      this.ready.then(() => this.send({ type: "streamsubscribe", stream_name: stream, group_id: group || null, batch: true }));
    }
    this.subs.get(key).add(fn);
    return () => {
      const set = this.subs.get(key);
      if (!set) return;
      set.delete(fn);
      if (set.size === 0) {
        this.subs.delete(key);
        try { this.send({ type: "streamunsubscribe", stream_name: stream, group_id: group || null }); } catch { /* closed */ }
      }
    };
  }
}

function redact(url) { return String(url).replace(/token=[^&]*/, "token=…"); }

function setConn(online, text) {
  const c = $("#conn");
  c.textContent = online ? "online" : text || "offline";
  c.className = "conn " + (online ? "online" : "offline");
}

// ------------------------------------------------------------------ sign-in
const app = { bus: null, who: null, cleanups: [] };

function sameOriginWs() {
  return (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/";
}

async function login(body) {
  const resp = await fetch("/api/login", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  const answer = await resp.json().catch(() => ({}));
  if (!resp.ok) throw answer.error || { code: String(resp.status), message: resp.statusText };
  return answer;
}

async function connect(engineUrl, token, who) {
  const url = new URL(engineUrl);
  url.searchParams.set("token", token);
  const bus = new Bus(url.toString());
  await bus.ready;
  app.bus = bus;
  app.who = who;
  $("#who").textContent = who ? `${who.name} (${who.role})` : "";
  $("#signin").hidden = true;
  $("#nav").hidden = false;
  $("#signout").hidden = false;
  if (!location.hash.startsWith("#/")) location.hash = "#/sessions";
  else router();
}

async function signIn(engineUrl, token) {
  const same = new URL(engineUrl).host === location.host;
  // On the engine's own origin the credential is exchanged for a session token of the same
  // role, kept for this tab; against another engine (the deployed API) it is used as given.
  if (same) {
    const s = await login({ token });
    sessionStorage.setItem("console.session", JSON.stringify({ url: engineUrl, token: s.session_token, who: { name: s.name, role: s.role } }));
    await connect(engineUrl, s.session_token, { name: s.name, role: s.role });
  } else {
    sessionStorage.setItem("console.session", JSON.stringify({ url: engineUrl, token, who: null }));
    await connect(engineUrl, token, null);
  }
}

// A one-time link: #code=… signs in once, then leaves the address bar. → whether it did.
async function linkSignIn() {
  const code = new URLSearchParams(location.hash.slice(1)).get("code");
  if (!code) return false;
  history.replaceState(null, "", location.pathname + "#/sessions");
  try {
    const s = await login({ code });
    const url = sameOriginWs();
    if (app.bus) app.bus.close();
    sessionStorage.setItem("console.session", JSON.stringify({ url, token: s.session_token, who: { name: s.name, role: s.role } }));
    await connect(url, s.session_token, { name: s.name, role: s.role });
    return true;
  } catch (e) { showError("sign-in link", e); return false; }
}

async function start() {
  $("#engine-url").value = sameOriginWs();
  $("#signin-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const button = ev.target.querySelector("button");
    button.disabled = true;
    try { await signIn($("#engine-url").value.trim(), $("#token").value.trim()); $("#token").value = ""; }
    catch (e) { showError("sign-in", e); }
    finally { button.disabled = false; }
  });
  $("#signout").addEventListener("click", async () => {
    const saved = JSON.parse(sessionStorage.getItem("console.session") || "null");
    sessionStorage.removeItem("console.session");
    if (saved && saved.who) fetch("/api/logout", { method: "POST", headers: { authorization: "Bearer " + saved.token } }).catch(() => {});
    if (app.bus) app.bus.close();
    location.hash = "";
    location.reload();
  });
  window.addEventListener("hashchange", () => { if (new URLSearchParams(location.hash.slice(1)).has("code")) linkSignIn(); else router(); });
  if (await linkSignIn()) return;
  const saved = JSON.parse(sessionStorage.getItem("console.session") || "null");
  if (saved) {
    try { await connect(saved.url, saved.token, saved.who); return; }
    catch (e) { sessionStorage.removeItem("console.session"); showError("reconnect", e); }
  }
  $("#token").focus();
}

// ------------------------------------------------------------------ routing
function router() {
  if (!app.bus) return;
  for (const f of app.cleanups.splice(0)) f();
  const [, page, ...rest] = location.hash.split("/");
  const arg = rest.map(decodeURIComponent).join("/");
  for (const a of document.querySelectorAll("nav a")) {
    const here = a.getAttribute("href") === `#/${page}` || (page === "session" && a.getAttribute("href") === "#/sessions") || (page === "tree" && a.getAttribute("href") === "#/sessions") || (page === "trace" && a.getAttribute("href") === "#/traces");
    if (here) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  const view = $("#view");
  view.replaceChildren();
  const pages = { sessions: viewSessions, session: viewSession, tree: viewTree, budgets: viewBudgets, traces: viewTraces, trace: viewTrace, workers: viewWorkers, queues: viewQueues };
  (pages[page] || viewSessions)(view, arg).catch((e) => showError(page || "sessions", e));
}

const call = (fid, data, t) => app.bus.call(fid, data, t);
const onCleanup = (f) => app.cleanups.push(f);

// ------------------------------------------------------------------ sessions
const PAGE = 50;
const newSessionId = () => "web-" + Math.random().toString(36).slice(2, 10);
const userMessage = (text) => ({ role: "user", content: [{ type: "text", text }], timestamp: Date.now() });

async function startTurn(sid, text, budgetId) {
  const payload = { session_id: sid, messages: [userMessage(text)] };
  if (budgetId) payload.budget_id = budgetId;
  const answer = await call("harness::trigger", { session_id: sid, payload }, 60000);
  if (answer && answer.status_code === 409) throw { code: "session_busy", message: `session ${sid} is busy: steer it instead, or wait` };
  return answer;
}

async function viewSessions(view, arg) {
  const offset = Math.max(0, parseInt(arg || "0", 10) || 0);
  const form = h("form", { class: "row", onsubmit: async (ev) => {
    ev.preventDefault();
    const text = ev.target.task.value.trim();
    if (!text) return;
    const sid = newSessionId();
    try { await startTurn(sid, text, ev.target.budget.value); location.hash = `#/session/${encodeURIComponent(sid)}`; }
    catch (e) { showError("start a session", e); }
  } },
    h("label", { for: "task", class: "sr" }, "New session"),
    h("input", { id: "task", name: "task", placeholder: "What should the agent do?", autocomplete: "off" }),
    h("label", { for: "budget", class: "sr" }, "Budget"),
    h("select", { id: "budget", name: "budget", style: "width:auto" }, h("option", { value: "" }, "no budget")),
    h("button", { type: "submit" }, "Start session"));
  // Budgets to run under, when the budget worker runs and this credential may list them.
  call("budget::list", {}).then((r) => {
    for (const b of r.budgets || []) form.budget.append(h("option", { value: b.budget_id }, `budget: ${b.name || b.budget_id} (${fmt.usd(b.remaining_usd)} left)`));
  }).catch(() => { form.budget.hidden = true; });
  const tbody = h("tbody");
  const pager = h("div", { class: "pager" });
  view.append(h("section", { class: "card" }, h("h1", {}, "Sessions"), form),
    h("section", { class: "card" }, h("table", { "aria-label": "Sessions" },
      h("thead", {}, h("tr", {}, h("th", {}, "Session"), h("th", {}, "State"), h("th", { class: "num" }, "Turns"), h("th", { class: "num" }, "Tool calls"), h("th", { class: "num" }, "Tokens in / out"), h("th", { class: "num" }, "Cost"), h("th", {}, "Updated"))),
      tbody), pager));
  const rows = new Map();
  const listed = await call("session-tree::list", { limit: PAGE, offset });
  const sessions = listed.sessions || [];
  if (!sessions.length) tbody.append(h("tr", {}, h("td", { colspan: 7, class: "muted" }, "No sessions yet: start one above.")));
  const fill = (sid, meta, turn) => {
    const t = (turn && turn.totals) || {};
    const row = h("tr", { "data-sid": sid },
      h("td", {}, h("a", { href: `#/session/${encodeURIComponent(sid)}` }, sid), meta && meta.copied_from ? h("span", { class: "muted" }, " (fork)") : null),
      h("td", {}, badge(turn ? turn.state : "no run")),
      h("td", { class: "num" }, fmt.int(turn ? turn.turn_count : NaN)),
      h("td", { class: "num" }, fmt.int(toolCalls(turn))),
      h("td", { class: "num" }, `${fmt.int(t.input_tokens)} / ${fmt.int(t.output_tokens)}`),
      h("td", { class: "num" }, fmt.usd(t.cost_usd)),
      h("td", {}, fmt.age((turn && turn.updated_at_ms) || (meta && meta.updated_at_ms))));
    const old = rows.get(sid);
    if (old) old.row.replaceWith(row); else tbody.append(row);
    rows.set(sid, { row, meta });
  };
  const turns = await Promise.all(sessions.map((m) => call("turn::get_state", { session_id: m.session_id }).catch((e) => { showError(`turn::get_state ${m.session_id}`, e); return null; })));
  sessions.forEach((m, i) => fill(m.session_id, m, turns[i]));
  const total = listed.total ?? sessions.length;
  pager.append(
    h("button", { type: "button", disabled: offset === 0, onclick: () => { location.hash = `#/sessions/${Math.max(0, offset - PAGE)}`; } }, "← Newer"),
    h("span", { class: "muted" }, `${total ? offset + 1 : 0}–${offset + sessions.length} of ${total}`),
    h("button", { type: "button", disabled: listed.next_offset == null, onclick: () => { location.hash = `#/sessions/${listed.next_offset}`; } }, "Older →"));
  // Live: each visible row follows its own session's events (50 subscriptions at most, so a
  // busy system's token deltas elsewhere never reach this page); the first page looks for new
  // sessions every few seconds.
  const follow = (sid) => onCleanup(app.bus.subscribe("agent::events", sid, (msg) => {
    const data = msg.event && msg.event.data;
    if (data && data.type === "turn_state_changed" && rows.has(sid)) fill(sid, rows.get(sid).meta, data.new_value);
  }));
  for (const m of sessions) follow(m.session_id);
  if (offset === 0) {
    const known = new Set(sessions.map((m) => m.session_id));
    const poll = setInterval(async () => {
      try {
        const fresh = await call("session-tree::list", { limit: PAGE, offset: 0 });
        if ((fresh.sessions || []).some((m) => !known.has(m.session_id))) router();
      } catch (e) { clearInterval(poll); showError("session-tree::list", e); }
    }, 4000);
    onCleanup(() => clearInterval(poll));
  }
}

// ------------------------------------------------------------------ one session
function textOf(block) { return block && typeof block.text === "string" ? block.text : ""; }

// A pushed event's field the deployed engine left out for size ({"omitted": {"bytes": n}}):
// n, else null.
function omittedBytes(v) {
  const o = v && typeof v === "object" && !Array.isArray(v) && Object.keys(v).length === 1 ? v.omitted : undefined;
  return o && typeof o === "object" && Number.isInteger(o.bytes) && o.bytes >= 0 ? o.bytes : null;
}

function denialOf(result) {
  const r = result && result.details !== undefined ? result.details : result;
  return r && typeof r === "object" && r.status === "denied" ? r : null;
}

function decisionBadge(info) {
  if (!info) return null;
  const a = info.approval; // who decided a parked call (approval_applied, stored)
  const denial = denialOf(info.result);
  if (denial) {
    const by = a && a.decided_by && denial.denied_by === "user" ? a.decided_by : denial.denied_by;
    const rule = denial.rule_name || denial.rule_id;
    return h("span", { class: "badge deny", title: denial.reason || "" }, `denied by ${by}${rule ? " · " + rule : ""}`);
  }
  const d = info.decision || {};
  if (info.awaiting) return h("span", { class: "badge needs_approval" }, "needs approval");
  if (a && a.decision === "allow") return h("span", { class: "badge allow", title: a.reason || "" }, `approved by ${a.decided_by || "someone"}`);
  if (d.decision === "allow") {
    const rule = d.rule_name || d.rule_id;
    return h("span", { class: "badge allow", title: d.rule_id || "" }, `allowed${rule ? " · " + rule : ""}`);
  }
  if (info.approvedBy) return h("span", { class: "badge allow" }, "approved");
  if (info.result !== undefined) return h("span", { class: "badge allow" }, "ran");
  return h("span", { class: "badge" }, "running");
}

async function viewSession(view, sid) {
  if (!sid) { location.hash = "#/sessions"; return; }
  const header = h("section", { class: "card" });
  const convo = h("div", { class: "conversation", "aria-live": "polite" });
  const composer = h("form", { class: "row" },
    h("label", { for: "say", class: "sr" }, "Message"),
    h("textarea", { id: "say", name: "say", rows: 2, placeholder: "Steer the running turn, or start the next one" }),
    h("button", { type: "submit" }, "Send"));
  view.append(header, h("section", { class: "card" }, convo), h("section", { class: "card" }, composer));
  const calls = new Map(); // function_call_id -> {decision, awaiting, result, is_error, duration_ms, function_id, args}
  let turn = null;
  let history = [];
  let streaming = null;
  const fallbacks = [];
  // One event, stored or live, into what the page draws.
  const apply = (data) => {
    switch (data.type) {
      case "function_execution_start": {
        const i = info(data.function_call_id);
        Object.assign(i, { decision: data.decision, function_id: data.function_id, args: data.args });
        if (i.result === undefined) i.awaiting = !!data.awaiting_approval;
        break;
      }
      case "function_execution_end": Object.assign(info(data.function_call_id), { result: data.result, is_error: data.is_error, duration_ms: data.duration_ms, awaiting: false }); break;
      case "approval_applied": Object.assign(info(data.function_call_id), { approval: { decision: data.decision, decided_by: data.decided_by, reason: data.reason } }); break;
      case "model_fallback": if (data.from && data.to) { fallbacks.push(data); if (fallbacks.length > 20) fallbacks.shift(); } break;
      default: break;
    }
  };

  const info = (id) => { if (!calls.has(id)) calls.set(id, {}); return calls.get(id); };

  function renderHeader() {
    const t = (turn && turn.totals) || {};
    const running = turn && !["stopped", "failed"].includes(turn.state);
    header.replaceChildren(
      h("div", { class: "row" }, h("h1", {}, sid), badge(turn ? turn.state : "no run"),
        h("span", { style: "flex:1" }),
        h("a", { href: `#/tree/${encodeURIComponent(sid)}` }, "Tree"),
        h("button", { type: "button", onclick: () => openTrace(sid) }, "Trace"),
        h("button", { type: "button", class: "danger", disabled: !running, onclick: async () => {
          try { await call("run::abort", { session_id: sid }); } catch (e) { showError("abort", e); }
        } }, "Abort")),
      h("div", { class: "stats" },
        stat(fmt.int(turn ? turn.turn_count : NaN), "turns"), stat(fmt.int(toolCalls(turn)), "tool calls"),
        stat(fmt.int(t.input_tokens), "tokens in"), stat(fmt.int(t.output_tokens), "tokens out"),
        t.cache_read_tokens || t.cache_write_tokens
          ? stat(`${fmt.int(t.cache_read_tokens || 0)} / ${fmt.int(t.cache_write_tokens || 0)}`, "cache read / written") : "",
        stat(fmt.usd(t.cost_usd), "cost"), stat(fmt.age(turn && turn.started_at_ms), "started")),
      turn && turn.error ? h("p", { class: "error" }, `${turn.error.kind}: ${turn.error.message}`) : "");
  }

  function toolCard(block) {
    const id = block.id;
    const i = calls.get(id) || {};
    // The model calls every function through one tool, agent_trigger {function, payload}.
    const viaTrigger = block.function_id === "agent_trigger" && block.arguments && typeof block.arguments.function === "string";
    const target = i.function_id || (viaTrigger ? block.arguments.function : block.function_id) || "?";
    const args = viaTrigger ? block.arguments.payload : block.arguments ?? i.args;
    const parked = turn && (turn.awaiting_approval || []).some((c) => c.function_call_id === id);
    // An MCP server's tool: mcp::<server>::<tool> (the tool's name percent-encoded).
    const mcp = /^mcp::([^:]+)::(.+)$/.exec(target);
    const mcpTool = mcp ? (() => { try { return decodeURIComponent(mcp[2]); } catch { return mcp[2]; } })() : null;
    const card = h("div", { class: "tool", "data-call": id },
      h("div", { class: "head" }, h("span", {}, mcp ? "MCP tool" : "tool call"), h("code", {}, target),
        mcp ? h("span", { class: "muted mcp" }, `server ${mcp[1]} · tool ${mcpTool}`) : null, decisionBadge({ ...i, awaiting: parked || (i.awaiting && i.result === undefined) }),
        i.duration_ms !== undefined ? h("span", { class: "muted" }, fmt.ms(i.duration_ms)) : null),
      h("details", {}, h("summary", {}, "arguments"), h("pre", {}, fmt.json(args))),
      i.result === undefined ? null
        : omittedBytes(i.result) !== null ? h("p", { class: "muted omitted" }, `${i.is_error ? "result (error)" : "result"}: ${fmt.int(omittedBytes(i.result))} bytes, too large to push; it shows once the session is read again`)
        : h("details", { open: !!i.is_error }, h("summary", {}, i.is_error ? "result (error)" : "result"), h("pre", {}, fmt.json(i.result))));
    if (parked) {
      const decide = (decision) => async (ev) => {
        for (const b of card.querySelectorAll("button")) b.disabled = true;
        try {
          const r = await call("approval::resolve", { session_id: sid, function_call_id: id, decision, reason: `from the console (${app.who ? app.who.name : "console"})` });
          if (r && r.ok === false) throw { code: r.error, message: `approval::resolve answered ${r.error}` };
          info(id).approvedBy = decision === "allow";
        } catch (e) { showError("approval", e); for (const b of card.querySelectorAll("button")) b.disabled = false; }
      };
      card.append(h("div", { class: "row", role: "group", "aria-label": "Approval" },
        h("span", {}, "This call waits for your decision."),
        h("button", { type: "button", class: "allow", onclick: decide("allow") }, "Allow"),
        h("button", { type: "button", class: "deny", onclick: decide("deny") }, "Deny")));
    }
    return card;
  }

  function messageView(m, live) {
    if (m.role === "user") return h("div", { class: "msg user" }, h("div", { class: "role" }, "you"), h("div", { class: "text" }, (m.content || []).map(textOf).join("\n")));
    if (m.role === "assistant") {
      const parts = [];
      for (const b of m.content || []) {
        if (b.type === "text") parts.push(h("div", { class: "text" }, b.text));
        else if (b.type === "thinking") parts.push(h("details", { class: "thinking" }, h("summary", {}, "thinking"), h("div", { class: "text" }, b.text)));
        else if (b.type === "function_call") parts.push(toolCard(b));
      }
      const u = m.usage;
      return h("div", { class: "msg assistant" + (live ? " streaming" : "") },
        h("div", { class: "role" }, `assistant${m.model ? " · " + (m.provider ? m.provider + " · " : "") + m.model : ""}${u ? ` · ${fmt.int(u.input + (u.cache_read || 0) + (u.cache_write || 0))} in${u.cache_read ? ` (${fmt.int(u.cache_read)} cached)` : ""} / ${fmt.int(u.output)} out` : ""}${m.stop_reason && m.stop_reason !== "function_call" && m.stop_reason !== "end" ? " · " + m.stop_reason : ""}`),
        parts, m.error_message ? h("p", { class: "error" }, m.error_message) : null);
    }
    if (m.role === "custom") return h("div", { class: "msg" }, h("div", { class: "role" }, m.custom_type || "note"), h("div", { class: "text" }, typeof m.content === "string" ? m.content : fmt.json(m.content)));
    return null; // function results are shown on their call's card
  }

  function render() {
    for (const m of history) {
      if (m.role === "function_result") {
        const i = info(m.function_call_id);
        if (i.result === undefined || omittedBytes(i.result) !== null) { i.result = m.details ?? (m.content || []).map(textOf).join(""); i.is_error = m.is_error; }
      }
    }
    const nodes = history.map((m) => messageView(m, false)).filter(Boolean);
    // A model that failed before answering, and the one the step went on with (live only:
    // the answer below names the model that gave it).
    for (const f of fallbacks) nodes.push(h("p", { class: "muted fallback" }, `${f.from.provider} · ${f.from.model} failed (${f.reason}); the step went on with ${f.to.provider} · ${f.to.model}`));
    if (streaming) nodes.push(messageView(streaming, true));
    if (!nodes.length) nodes.push(h("p", { class: "muted" }, "Nothing said yet."));
    convo.replaceChildren(...nodes);
    renderHeader();
  }

  async function loadHistory() {
    try {
      const r = await call("session-tree::messages", { session_id: sid });
      history = r.messages || [];
    } catch (e) {
      if (e.code !== "not_found") showError("session-tree::messages", e);
    }
  }

  // One message as stored and as an event carries it: its role, time and text are the same.
  const sameMessage = (a, b) => a.role === b.role && a.timestamp === b.timestamp &&
    JSON.stringify(a.content) === JSON.stringify(b.content);
  let refetch = null;
  const soon = () => { if (!refetch) refetch = setTimeout(async () => { refetch = null; await loadHistory(); render(); }, 80); };
  onCleanup(() => clearTimeout(refetch));
  onCleanup(app.bus.subscribe("agent::events", sid, (msg) => {
    const ev = msg.event || {};
    const stored = ev.type === "create" || ev.type === "update";
    const data = stored ? ev.data || {} : { ...(ev.data || {}), type: ev.type };
    switch (data.type) {
      case "message_update": streaming = data.message; render(); break;
      // The final message stays on screen until the stored history (fetched next) has it.
      // A fetch can come back with it before its event arrives (the message is stored in the
      // session before the step's events go out): then it is not added twice.
      case "message_complete":
        if (data.message && data.message.role === "assistant" && !history.some((m) => sameMessage(m, data.message)))
          history = history.concat([data.message]);
        streaming = null; render(); soon(); break;
      case "function_execution_start": case "function_execution_end": case "approval_applied": apply(data); render(); break;
      case "turn_state_changed": turn = data.new_value; render(); break;
      case "turn_end": case "agent_end": case "compaction_done": soon(); break;
      case "model_fallback": apply(data); render(); break;
      default: break;
    }
  }));
  composer.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const box = ev.target.say;
    const text = box.value.trim();
    if (!text) return;
    const running = turn && !["stopped", "failed"].includes(turn.state);
    try {
      if (running) await call("session-inbox::push", { name: "steering", session_id: sid, item: text });
      else await startTurn(sid, text);
      box.value = "";
    } catch (e) { showError(running ? "steer" : "start a turn", e); }
  });
  const [t, stored] = await Promise.all([
    call("turn::get_state", { session_id: sid }).catch((e) => { showError("turn::get_state", e); return null; }),
    call("ui::history", { session_id: sid }).catch((e) => { if (e.code !== "not_found") showError("ui::history", e); return null; }),
    loadHistory()]);
  turn = t;
  // What a live page saw, from the stored events: decisions, approvals, fallbacks.
  for (const ev of (stored && stored.events) || []) apply(ev);
  for (const c of (turn && turn.awaiting_approval) || []) {
    const i = info(c.function_call_id);
    if (i.result === undefined) Object.assign(i, { awaiting: true, function_id: c.function_id, args: c.args });
  }
  render();
}

function stat(value, label) { return h("div", {}, h("b", {}, value), h("span", {}, label)); }

async function openTrace(sid) {
  try {
    const g = await call("engine::traces::group_by", { attribute: "iii.session.id", limit: 1000 });
    const group = (g.groups || []).find((x) => x.value === sid);
    if (!group || !group.trace_ids || !group.trace_ids.length) throw { code: "not_found", message: `no spans of session ${sid} are kept` };
    location.hash = `#/trace/${encodeURIComponent(group.trace_ids[group.trace_ids.length - 1])}`;
  } catch (e) { showError("trace", e); }
}

// ------------------------------------------------------------------ session tree
async function viewTree(view, sid) {
  const card = h("section", { class: "card" });
  view.append(card);
  const t = await call("session-tree::tree", { session_id: sid });
  const entries = t.entries || [];
  const byId = new Map(entries.map((e) => [e.id, e]));
  const roots = entries.filter((e) => !e.parent_id || !byId.has(e.parent_id));
  const fork = async (entryId, resume) => {
    try {
      const f = await call("session-tree::fork", { source_session_id: sid, from_entry_id: entryId });
      location.hash = `#/session/${encodeURIComponent(f.session_id)}`;
      if (resume) setTimeout(() => { const box = $("#say"); if (box) box.focus(); }, 200);
    } catch (e) { showError("fork", e); }
  };
  const node = (e, depth) => {
    if (depth > 400) return h("li", {}, "…");
    return h("li", {},
      h("span", { class: "node" + (e.id === t.leaf_id ? " leaf" : ""), "data-entry": e.id },
        h("span", { class: "kind" }, e.type), h("span", {}, e.label || e.id),
        e.id === t.leaf_id ? h("span", { class: "badge" }, "leaf") : null,
        h("button", { type: "button", onclick: () => fork(e.id, false), "aria-label": `Fork from ${e.label || e.id}` }, "Fork here"),
        (e.children || []).length === 0 && e.id !== t.leaf_id ? h("button", { type: "button", onclick: () => fork(e.id, true) }, "Resume branch") : null),
      (e.children || []).length ? h("ul", {}, (e.children || []).map((c) => byId.get(c)).filter(Boolean).map((c) => node(c, depth + 1))) : null);
  };
  const exportHtml = async () => {
    try {
      const r = await call("session-tree::export_html", { session_id: sid });
      const a = h("a", { href: URL.createObjectURL(new Blob([r.html], { type: "text/html" })), download: `${sid}.html` });
      document.body.append(a); a.click(); a.remove();
    } catch (e) { showError("export", e); }
  };
  card.append(h("div", { class: "row" }, h("h1", {}, `Tree of ${sid}`), h("span", { style: "flex:1" }),
    h("a", { href: `#/session/${encodeURIComponent(sid)}` }, "Conversation"), h("button", { type: "button", onclick: exportHtml }, "Export HTML")),
    h("p", { class: "muted" }, `${entries.length} entries; a fork copies the path from the root to the entry into a new session.`),
    h("div", { class: "tree" }, h("ul", {}, roots.map((r) => node(r, 0)))));
}

// ------------------------------------------------------------------ budgets
async function viewBudgets(view) {
  const card = h("section", { class: "card" }, h("h1", {}, "Budgets"));
  view.append(card);
  const r = await call("budget::list", {});
  const budgets = r.budgets || [];
  const alerts = [];
  const rows = budgets.map((b) => {
    const pct = b.ceiling_usd > 0 ? b.spent_usd / b.ceiling_usd : 0;
    const fired = (b.alerts || []).filter((a) => pct >= a.threshold_pct);
    for (const a of fired) alerts.push(`${b.name || b.budget_id}: ${Math.round(pct * 100)}% of ${fmt.usd(b.ceiling_usd)} spent (alert at ${Math.round(a.threshold_pct * 100)}%)`);
    if (pct >= 1) alerts.push(`${b.name || b.budget_id}: ceiling reached`);
    return h("tr", {},
      h("td", {}, b.name || b.budget_id, h("div", { class: "muted" }, [b.workspace_id, b.agent_id].filter(Boolean).join(" · "))),
      h("td", {}, b.period),
      h("td", {}, h("div", { class: "bar" + (pct >= 1 ? " over" : pct >= 0.8 ? " warn" : ""), role: "meter", "aria-valuemin": 0, "aria-valuemax": 100, "aria-valuenow": Math.round(pct * 100), "aria-label": "spent" }, h("span", { style: `width:${Math.min(100, pct * 100).toFixed(1)}%` }))),
      h("td", { class: "num" }, `${fmt.usd(b.spent_usd)} / ${fmt.usd(b.ceiling_usd)}`),
      h("td", {}, b.paused ? "paused" : b.enforced ? "enforced" : "not enforced"),
      h("td", {}, (b.alerts || []).map((a) => `${Math.round(a.threshold_pct * 100)}%`).join(", ") || "–"));
  });
  if (alerts.length) card.append(h("div", { role: "alert" }, alerts.map((a) => h("p", { class: "error" }, a))));
  card.append(budgets.length ? h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "Budget"), h("th", {}, "Period"), h("th", {}, "Spent"), h("th", { class: "num" }, "Spent / ceiling"), h("th", {}, "Mode"), h("th", {}, "Alerts"))), h("tbody", {}, rows))
    : h("p", { class: "muted" }, "No budgets (budget::create, or `budgets:` in harness.yaml)."));
}

// ------------------------------------------------------------------ traces
async function viewTraces(view) {
  const card = h("section", { class: "card" }, h("h1", {}, "Traces by session"));
  view.append(card);
  const g = await call("engine::traces::group_by", { attribute: "iii.session.id", limit: 200 });
  const groups = (g.groups || []).slice().sort((a, b) => b.last_seen_ms - a.last_seen_ms);
  card.append(groups.length ? h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "Session"), h("th", {}, "Traces"), h("th", { class: "num" }, "Spans"), h("th", { class: "num" }, "Duration"), h("th", { class: "num" }, "Errors"), h("th", {}, "Last seen"))),
    h("tbody", {}, groups.map((x) => h("tr", {},
      h("td", {}, h("a", { href: `#/session/${encodeURIComponent(x.value)}` }, x.value)),
      h("td", {}, (x.trace_ids || []).slice(-5).map((t) => h("a", { href: `#/trace/${t}`, style: "margin-right:8px" }, t.slice(0, 8)))),
      h("td", { class: "num" }, fmt.int(x.span_count)), h("td", { class: "num" }, fmt.ms(x.duration_ms)),
      h("td", { class: "num" }, fmt.int(x.error_count)), h("td", {}, fmt.age(x.last_seen_ms))))))
    : h("p", { class: "muted" }, "No spans kept yet."));
}

async function viewTrace(view, traceId) {
  const card = h("section", { class: "card" }, h("h1", {}, `Trace ${traceId}`));
  const detail = h("section", { class: "card", "aria-live": "polite" }, h("p", { class: "muted" }, "Select a span to see its attributes."));
  view.append(card, detail);
  const r = await call("engine::traces::list", { trace_id: traceId });
  const spans = (r.spans || []).slice().sort((a, b) => a.start_unix_nanos - b.start_unix_nanos);
  if (!spans.length) { card.append(h("p", { class: "muted" }, "No spans of this trace are kept.")); return; }
  const t0 = spans[0].start_unix_nanos;
  const t1 = Math.max(...spans.map((s) => s.end_unix_nanos));
  const width = Math.max(1, t1 - t0);
  const ids = new Set(spans.map((s) => s.span_id));
  const children = new Map();
  for (const s of spans) {
    const p = s.parent_span_id && ids.has(s.parent_span_id) ? s.parent_span_id : "";
    if (!children.has(p)) children.set(p, []);
    children.get(p).push(s);
  }
  const plumbing = (s) => /^(state|stream)::/.test(s.name) && !(children.get(s.span_id) || []).length;
  const show = (s) => detail.replaceChildren(h("h2", {}, s.name),
    h("p", { class: "muted" }, `${s.service || "engine"} · ${fmt.ms((s.end_unix_nanos - s.start_unix_nanos) / 1e6)}${s.error ? " · error" : ""}`),
    h("dl", { class: "attrs" }, Object.entries(s.attributes || {}).sort().map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])));
  const filter = h("input", { id: "span-filter", placeholder: "Filter spans by name or attribute", "aria-label": "Filter spans" });
  const hide = h("input", { id: "hide-plumbing", type: "checkbox", checked: true });
  const rowsBox = h("div", { class: "waterfall", role: "list" });
  const summary = h("p", { class: "muted" });
  const draw = () => {
    const needle = filter.value.trim().toLowerCase();
    const ordered = [];
    const walk = (p, depth) => {
      for (const s of children.get(p) || []) {
        if (ordered.length >= 3000) return;
        const match = !needle || s.name.toLowerCase().includes(needle) || Object.entries(s.attributes || {}).some(([k, v]) => `${k}=${v}`.toLowerCase().includes(needle));
        if (!(hide.checked && plumbing(s)) && match) ordered.push([s, depth]);
        walk(s.span_id, depth + 1);
      }
    };
    walk("", 0);
    summary.textContent = `${spans.length} spans over ${fmt.ms(width / 1e6)}; ${ordered.length} shown`;
    rowsBox.replaceChildren(...ordered.map(([s, depth]) => {
      const left = ((s.start_unix_nanos - t0) / width) * 100;
      const w = Math.max(0.2, ((s.end_unix_nanos - s.start_unix_nanos) / width) * 100);
      const genai = Object.keys(s.attributes || {}).some((k) => k.startsWith("gen_ai."));
      return h("div", { class: "span-row", role: "listitem" },
        h("button", { type: "button", class: "name", style: `padding-left:${depth * 14}px`, title: `${s.name} (${s.service || "engine"})`, onclick: () => show(s) }, s.name, h("span", { class: "muted" }, ` · ${s.service || "engine"}`)),
        h("div", { class: "span-track" }, h("div", { class: "span-bar" + (s.error ? " error" : genai ? " gen_ai" : ""), style: `left:${left.toFixed(2)}%;width:${w.toFixed(2)}%` })),
        h("span", { class: "muted num" }, fmt.ms((s.end_unix_nanos - s.start_unix_nanos) / 1e6)));
    }));
  };
  filter.addEventListener("input", draw);
  hide.addEventListener("change", draw);
  card.append(summary, h("div", { class: "row" }, filter, h("label", { for: "hide-plumbing", class: "inline" }, hide, " hide state:: and stream:: leaves")), rowsBox);
  draw();
}

// ------------------------------------------------------------------ workers and functions
async function viewWorkers(view) {
  const card = h("section", { class: "card" }, h("h1", {}, "Workers and functions"));
  const detail = h("section", { class: "card" }, h("p", { class: "muted" }, "Select a function to see its schemas."));
  view.append(card, detail);
  const [w, functions] = await Promise.all([call("engine::workers::list", {}), allFunctions()]);
  const workers = new Map((w.workers || []).map((x) => [x.worker_id, x]));
  card.append(h("p", { class: "muted" }, `${workers.size} connections, ${functions.length} functions`),
    h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "Function"), h("th", {}, "Worker"), h("th", {}, "Public"), h("th", {}, "Description"))),
      h("tbody", {}, functions.map((f) => {
        const owner = workers.get(f.worker_id) || {};
        return h("tr", {},
          h("td", {}, h("button", { type: "button", class: "name", onclick: () => detail.replaceChildren(h("h2", {}, f.function_id), h("p", {}, f.description || ""),
            h("h2", {}, "Request"), h("pre", {}, fmt.json(f.request_format)), h("h2", {}, "Answer"), h("pre", {}, fmt.json(f.response_format)), h("h2", {}, "Metadata"), h("pre", {}, fmt.json(f.metadata))) }, f.function_id)),
          h("td", {}, `${owner.name || owner.kind || "engine"}`, owner.remote_addr ? h("div", { class: "muted" }, owner.remote_addr) : null),
          h("td", {}, f.metadata && f.metadata.public ? "yes" : ""),
          h("td", { class: "muted" }, (f.description || "").slice(0, 140)));
      }))));
}

async function allFunctions() {
  const out = [];
  let after = null;
  for (let i = 0; i < 50; i++) {
    const page = await call("engine::functions::list", after ? { after } : {});
    out.push(...(page.functions || []));
    if (!page.next) break;
    after = page.next;
  }
  return out;
}

// ------------------------------------------------------------------ queues
async function viewQueues(view) {
  const card = h("section", { class: "card" }, h("h1", {}, "Queues"));
  const dead = h("section", { class: "card" }, h("p", { class: "muted" }, "Select a queue's dead letters to see them."));
  view.append(card, dead);
  const q = await call("engine::queue::list", {});
  const queues = q.queues || [];
  const stats = await Promise.all(queues.map((x) => call("engine::queue::stats", { queue: x.queue || x.name }).catch((e) => ({ error: e }))));
  const showDead = async (name) => {
    try {
      const d = await call("engine::queue::dead_letters", { queue: name });
      const msgs = d.messages || [];
      dead.replaceChildren(h("h2", {}, `Dead letters of ${name}`),
        msgs.length ? h("ul", {}, msgs.slice(0, 200).map((m) => h("li", {}, h("pre", {}, fmt.json(m))))) : h("p", { class: "muted" }, "None."));
    } catch (e) { showError("dead letters", e); }
  };
  card.append(queues.length ? h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "Queue"), h("th", {}, "Type"), h("th", { class: "num" }, "Depth"), h("th", { class: "num" }, "In flight"), h("th", { class: "num" }, "Dead letters"), h("th", {}, ""))),
    h("tbody", {}, queues.map((x, i) => {
      const name = x.queue || x.name;
      const s = stats[i] || {};
      return h("tr", {},
        h("td", {}, name), h("td", {}, x.type || x.queue_type || ""),
        h("td", { class: "num" }, s.error ? "error" : fmt.int(s.pending)), h("td", { class: "num" }, fmt.int(s.in_flight)), h("td", { class: "num" }, fmt.int(s.dead)),
        h("td", {}, h("button", { type: "button", onclick: () => showDead(name) }, "Dead letters"), " ",
          h("button", { type: "button", disabled: !s.dead, onclick: async () => {
            try { await call("engine::queue::redrive", { queue: name }); router(); } catch (e) { showError("redrive", e); }
          } }, "Redrive")));
    }))) : h("p", { class: "muted" }, "No queues declared."));
}

document.addEventListener("DOMContentLoaded", start);
