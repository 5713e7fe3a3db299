// The web console in a real browser: Debian's chromium driven by playwright-core.
// Starts the harness (`--serve-only`, embedded backend, the scripted model with this folder's
// cassette), opens the console, signs in with the one-time link the harness prints, starts a
// session, sees tokens stream, approves the parked call with the button, sees the turn finish,
// forks it from the tree view and resumes the fork, opens its trace waterfall, and loads every
// other page without a bus error. CONSOLE_SCREENSHOTS=<dir> saves a screenshot of each page.
//
//   HARNESS_BIN   the harness binary (default: $CARGO_TARGET_DIR/debug/harness)
//   CHROMIUM      the browser (default: /usr/bin/chromium)
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, "../..");
const bin = process.env.HARNESS_BIN || join(process.env.CARGO_TARGET_DIR || join(root, "target"), "debug", "harness");
const browserPath = process.env.CHROMIUM || "/usr/bin/chromium";
const shots = process.env.CONSOLE_SCREENSHOTS ? resolve(process.env.CONSOLE_SCREENSHOTS) : null;
if (shots) mkdirSync(shots, { recursive: true });

const dir = mkdtempSync(join(tmpdir(), "console-test-"));
const harnesses = [];
let browser;
after(async () => {
  if (browser) await browser.close().catch(() => {});
  for (const h of harnesses) h.kill("SIGKILL");
  rmSync(dir, { recursive: true, force: true });
});

// No real model, no configuration file from the caller's environment.
function cleanEnv() {
  const env = { ...process.env, RUST_LOG: "warn" };
  for (const k of ["ANTHROPIC_API_KEY", "OPENAI_API_KEY", "MOONSHOT_API_KEY", "HARNESS_CONFIG", "ENGINE_TOKEN"]) delete env[k];
  return env;
}

// Start the harness and read its banner: the console's address and the one-time link.
function startHarness(name = "a", extra = []) {
  assert.ok(existsSync(bin), `no harness binary at ${bin} (cargo build, or set HARNESS_BIN)`);
  const child = spawn(bin, [
    "--serve-only", "--listen", "127.0.0.1:0",
    "--data-dir", join(dir, name, "data"), "--workdir", join(dir, "work"),
    "--permissions", join(root, "iii-permissions.yaml"),
    "--cassette", join(here, "cassette.json"),
    ...extra,
  ], { env: cleanEnv(), stdio: ["ignore", "pipe", "pipe"] });
  harnesses.push(child);
  let out = "";
  child.stderr.on("data", (d) => { out += d; });
  return new Promise((resolvePromise, reject) => {
    const timer = setTimeout(() => reject(new Error(`the harness printed no console link in 60 s:\n${out}`)), 60000);
    child.stdout.on("data", (d) => {
      out += d;
      const m = out.match(/console: (http:\/\/[^ ]+) \(sign in with the token, or once with (http:\/\/\S+#code=[0-9a-f]+)\)/);
      if (m) { clearTimeout(timer); resolvePromise({ url: m[1], link: m[2] }); }
    });
    child.on("exit", (code) => { clearTimeout(timer); reject(new Error(`the harness exited (${code}):\n${out}`)); });
  });
}

// Debian's chromium has been seen to die of SIGSEGV while starting (once, in CI, before any
// page existed), which is the browser's start and not the console: a launch is tried three
// times, and each failure is printed.
async function launch() {
  for (let attempt = 1; !browser; attempt++) {
    try {
      browser = await chromium.launch({
        executablePath: browserPath,
        headless: true,
        args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
      });
    } catch (e) {
      if (attempt >= 3) throw e;
      console.error(`# the browser failed to start (attempt ${attempt} of 3): ${String(e).split("\n")[0]}`);
    }
  }
  return browser;
}

async function shot(page, name) {
  if (shots) await page.screenshot({ path: join(shots, `console-${name}.png`) });
}

// The thick preset with a budget, so the budgets page has spend to show, and an MCP server
// (the reference server-everything, installed in tests/mcp by scripts/test.sh).
function configWithBudget() {
  const text = readFileSync(join(root, "presets", "thick.yaml"), "utf8");
  assert.ok(text.includes("budgets: []"), "presets/thick.yaml lists no budgets");
  assert.ok(text.includes("mcp_servers: []"), "presets/thick.yaml lists no MCP servers");
  const everything = join(root, "tests", "mcp", "node_modules", "@modelcontextprotocol", "server-everything", "dist", "index.js");
  assert.ok(existsSync(everything), `${everything} is missing (npm ci --prefix tests/mcp)`);
  const path = join(dir, "harness.yaml");
  writeFileSync(path, text
    .replace("budgets: []", "budgets:\n  - budget_id: console-test\n    ceiling_usd: 0.02\n    period: day\n")
    .replace("mcp_servers: []", `mcp_servers:\n  - {name: everything, command: [node, ${JSON.stringify(everything)}, stdio]}\n`));
  return path;
}

// The page's socket to its engine, through playwright: every message passes as it is, but
// for what `rewrite` changes on its way to the page. `rewrite(msg, text, answersCall)` gets
// each message from the engine that is JSON (`answersCall`: it is the answer to a call of
// `functionId` the page made) and gives the messages to send instead, or null.
async function routeEngine(page, functionId, rewrite) {
  const calls = new Set();
  await page.routeWebSocket(/^wss?:/, (ws) => {
    const server = ws.connectToServer();
    ws.onMessage((m) => {
      try {
        const msg = JSON.parse(m);
        if (msg.type === "invokefunction" && msg.function_id === functionId) calls.add(msg.invocation_id);
      } catch { /* passed on as it is */ }
      server.send(m);
    });
    server.onMessage((m) => {
      let msg = null;
      try { msg = JSON.parse(m); } catch { /* passed on as it is */ }
      const instead = msg && rewrite(msg, String(m), msg.type === "invocationresult" && calls.delete(msg.invocation_id));
      if (!instead) { ws.send(m); return; }
      for (const out of instead) ws.send(JSON.stringify(out));
    });
  });
}

// No bus error may be on screen.
async function noErrors(page, where) {
  const errors = await page.locator("#errors .error").allTextContents();
  assert.deepEqual(errors, [], `${where}: errors shown`);
}

test("the console, end to end in a real browser", { timeout: 240000 }, async () => {
  const { url, link } = await startHarness("a", ["--config", configWithBudget()]);
  await launch();
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 }, acceptDownloads: true });
  const page = await context.newPage();
  const consoleErrors = [];
  page.on("pageerror", (e) => consoleErrors.push(String(e)));

  // 1–3. Open the console and sign in with the one-time link.
  await page.goto(url);
  await page.locator("#signin").waitFor({ state: "visible" });
  // Before sign-in: no navigation, and the card names where this engine's token really is.
  assert.equal(await page.locator("#nav").isVisible(), false, "no navigation before sign-in");
  assert.equal(await page.locator("#token-place").textContent(), join(dir, "a", "data", "engine.token"));
  await shot(page, "signin");
  await page.goto(link);
  await page.locator("#conn.online").waitFor({ timeout: 15000 });
  await page.locator("#who").filter({ hasText: "admin" }).waitFor();
  assert.ok(!page.url().includes("code="), "the code leaves the address bar");

  // The link is spent: a second use is refused, and says so.
  const second = await browser.newContext();
  const again = await second.newPage();
  await again.goto(link);
  await again.locator("#errors .error").filter({ hasText: "sign-in link" }).waitFor({ timeout: 15000 });
  await second.close();

  // 4. Start a scripted session.
  await page.locator("#task").fill("Summarize the working directory");
  await page.locator("#budget option[value='console-test']").waitFor({ state: "attached" });
  await page.locator("#budget").selectOption("console-test");
  await page.getByRole("button", { name: "Start session" }).click();
  await page.waitForURL(/#\/session\/web-/);
  const sid = decodeURIComponent(page.url().split("#/session/")[1]);

  // 5. Tokens appear as they stream (the bubble is there only while message_update events come).
  const streaming = page.locator(".msg.assistant.streaming .text").first();
  await streaming.waitFor({ timeout: 20000 });
  const partial = await streaming.textContent();
  assert.ok(partial.length > 0, "streamed text shows");
  // From the moment the first answer has streamed whole, it never leaves the page (no blank
  // between the stream's end and the stored message).
  await page.evaluate(() => {
    const said = "Let me look at the working directory before I write anything.";
    const has = () => [...document.querySelectorAll(".msg.assistant")].some((m) => m.textContent.includes(said));
    window.__answerBlanked = false;
    let seen = has();
    new MutationObserver(() => {
      if (has()) seen = true;
      else if (seen) window.__answerBlanked = true;
    }).observe(document.body, { childList: true, subtree: true, characterData: true });
  });
  await page.locator(".msg.assistant:not(.streaming)").filter({ hasText: "Let me look at the working directory" }).waitFor({ timeout: 20000 });
  await page.locator(".tool", { hasText: "fs::list" }).locator(".badge.allow").waitFor();
  // An MCP server's tool shows like any other call, its server and tool named, allowed by the
  // shipped rule for read-only tools, and its result as text (markup in it stays text).
  const mcpCard = page.locator(".tool", { hasText: "mcp::everything::echo" });
  await mcpCard.locator(".badge.allow").waitFor({ timeout: 20000 });
  assert.match(await mcpCard.locator(".head").textContent(), /MCP tool.*server everything · tool echo/);
  await mcpCard.locator("summary", { hasText: "result" }).click();
  const mcpResult = await mcpCard.locator("pre").last().textContent();
  assert.ok(mcpResult.includes("Echo: <b>not markup</b>"), mcpResult);
  assert.equal(await mcpCard.locator("b").count(), 0, "an MCP result is never rendered as markup");

  // 6. The write is parked: approve it with the button.
  const allow = page.getByRole("button", { name: "Allow" });
  await allow.waitFor({ timeout: 20000 });
  await page.locator(".stats").filter({ hasText: "tool calls" }).waitFor();
  // The state reads as words (the raw state in the tooltip), and the parked call is counted.
  const parkedBadge = page.locator("h1 + .badge");
  await parkedBadge.filter({ hasText: "waiting for your approval" }).waitFor({ timeout: 15000 });
  assert.equal(await parkedBadge.getAttribute("title"), "function_awaiting_approval");
  assert.equal(await page.locator(".stats div", { hasText: "tool calls" }).locator("b").textContent(), "3");
  await shot(page, "approval");
  await allow.click();

  // 7. The turn finishes.
  await page.locator("h1 + .badge.stopped").waitFor({ timeout: 30000 });
  await page.locator(".msg.assistant").filter({ hasText: "Done: I listed the directory" }).waitFor();
  await page.locator(".tool", { hasText: "fs::write" }).locator("summary", { hasText: "result" }).waitFor();
  // A session started from the console works in its own directory.
  assert.ok(existsSync(join(dir, "work", sid, "SUMMARY.md")), "the approved write ran");
  assert.equal(await page.evaluate(() => window.__answerBlanked), false, "the streamed answer never blanked");
  await noErrors(page, "session");
  // After a reload, each call still says how it was decided (from the stored events): the
  // rule's human name, and who approved.
  await page.reload();
  const badgeOf = (fid) => page.locator(".tool", { hasText: fid }).locator(".badge").first();
  await badgeOf("fs::list").filter({ hasText: "allowed · listing the workspace" }).waitFor({ timeout: 15000 });
  await badgeOf("mcp::everything::echo").filter({ hasText: "allowed · read-only MCP tools" }).waitFor();
  assert.match(await badgeOf("fs::write").textContent(), /^approved by \S+/);
  await noErrors(page, "session after a reload");
  await shot(page, "session");

  // The list shows it with its totals.
  await page.getByRole("link", { name: "Sessions" }).click();
  const row = page.locator(`tr[data-sid="${sid}"]`);
  await row.waitFor();
  assert.match(await row.textContent(), /stopped/);
  await shot(page, "sessions");

  // 8. Fork from the tree view, then resume the fork.
  await page.goto(`${url}#/tree/${encodeURIComponent(sid)}`);
  const leaf = page.locator(".node.leaf");
  await leaf.waitFor();
  await shot(page, "tree");
  const download = page.waitForEvent("download");
  await page.getByRole("button", { name: "Export HTML" }).click();
  const exported = await download;
  assert.equal(exported.suggestedFilename(), `${sid}.html`);
  const html = readFileSync(await exported.path(), "utf8");
  assert.ok(html.includes("Summarize the working directory"), "the export holds the conversation");
  await leaf.getByRole("button", { name: /Fork from/ }).click();
  await page.waitForURL((u) => u.hash.startsWith("#/session/") && !u.hash.endsWith(encodeURIComponent(sid)));
  const forkId = decodeURIComponent(page.url().split("#/session/")[1]);
  assert.notEqual(forkId, sid);
  assert.ok(existsSync(join(dir, "work", forkId, "SUMMARY.md")), "the fork starts from a copy of its parent's directory");
  await page.locator(".msg.user").filter({ hasText: "Summarize the working directory" }).waitFor();
  await page.locator("#say").fill("Thanks, that is all.");
  await page.getByRole("button", { name: "Send" }).click();
  await page.locator(".msg.user").filter({ hasText: "Thanks, that is all." }).waitFor({ timeout: 20000 });
  await page.locator("h1 + .badge.stopped").waitFor({ timeout: 30000 });
  await noErrors(page, "fork");

  // 9. The first session's trace, as a waterfall.
  await page.goto(`${url}#/session/${encodeURIComponent(sid)}`);
  await page.getByRole("button", { name: "Trace" }).click();
  await page.waitForURL(/#\/trace\//);
  const rows = page.locator(".span-row");
  await rows.first().waitFor({ timeout: 15000 });
  assert.ok((await rows.count()) >= 5, "the turn's spans are drawn");
  await shot(page, "trace");
  await page.locator(".span-row button.name", { hasText: "run::start" }).first().click();
  await page.locator("dl.attrs dt", { hasText: "iii.session.id" }).waitFor();
  await shot(page, "trace");

  // Every other page loads without a bus error.
  for (const [name, check] of [["workers", "td button.name"], ["queues", "table"], ["budgets", "td .bar"], ["traces", "table"]]) {
    await page.goto(`${url}#/${name}`);
    await page.locator(`#view ${check}`).first().waitFor({ timeout: 15000 });
    await noErrors(page, name);
    await shot(page, name);
  }
  // The session ran under the budget: the provider charged what the model reported.
  await page.goto(`${url}#/budgets`);
  await page.locator("#view td .bar").waitFor();
  const spent = await page.locator("#view td.num").first().textContent();
  assert.match(spent, /^\$0\.00[1-9]\d* \/ \$0\.0200$/, `budget spend: ${spent}`);
  await page.emulateMedia({ colorScheme: "dark" });
  await page.goto(`${url}#/session/${encodeURIComponent(sid)}`);
  await page.locator(".msg.assistant").first().waitFor();
  // The prompt cache's part of the input: per answer, and for the session.
  const cacheStat = page.locator(".stats div", { hasText: "cache read / written" });
  await cacheStat.waitFor({ timeout: 15000 });
  assert.match(await cacheStat.textContent(), /1,?800 \/ 0/, "the session read 800 + 1000 tokens from the cache");
  await page.locator(".msg.assistant .role", { hasText: "(800 cached)" }).waitFor();
  // Each answer names the provider and model that gave it (after a fallback, the one that answered).
  assert.match(await page.locator(".msg.assistant .role").first().textContent(), /^assistant · scripted · \S+ · /);
  await shot(page, "session-dark");

  // Keyboard: the skip link comes first in tab order, shows when focused, and leads to the content;
  // the sign-in form works from the keyboard alone (the token field has focus, Enter submits).
  const fresh = await context.newPage();
  await fresh.goto(url);
  await fresh.locator("#signin").waitFor();
  assert.equal(await fresh.evaluate(() => document.querySelector("a[href], button, input, textarea, select").className), "skip");
  assert.equal(await fresh.evaluate(() => document.activeElement.id), "token");
  await fresh.keyboard.type("wrong-token");
  await fresh.keyboard.press("Enter");
  await fresh.locator("#errors .error").filter({ hasText: "sign-in" }).waitFor();
  assert.deepEqual(consoleErrors, [], "no script errors");
});

// The console takes an engine URL: served by one engine, it drives another (as it drives the
// deployed WebSocket API) with that engine's token, once that engine admits the page's origin.
test("the console signs in to another engine by URL and token", { timeout: 120000 }, async () => {
  const { url } = await startHarness("page");
  const origin = url.replace(/\/$/, "");
  const other = await startHarness("other", ["--allowed-origins", origin]);
  const closed = await startHarness("closed");
  const tokenOf = (name) => readFileSync(join(dir, name, "data", "engine.token"), "utf8").trim();
  const wsOf = (u) => u.replace(/^http/, "ws");
  const context = await (await launch()).newContext();
  const page = await context.newPage();
  await page.goto(url);
  await page.locator("#engine-url").fill(wsOf(closed.url));
  await page.locator("#token").fill(tokenOf("closed"));
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.locator("#errors .error").filter({ hasText: "cannot connect" }).waitFor({ timeout: 15000 });
  await page.locator("#engine-url").fill(wsOf(other.url));
  await page.locator("#token").fill(tokenOf("other"));
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.locator("#conn.online").waitFor({ timeout: 15000 });
  await page.goto(`${url}#/workers`);
  await page.locator("#view td button.name", { hasText: "harness::trigger" }).waitFor({ timeout: 15000 });
  await page.goto(`${url}#/sessions`);
  await page.locator("#task").fill("Hello from another origin");
  await page.getByRole("button", { name: "Start session" }).click();
  await page.locator(".msg.assistant").first().waitFor({ timeout: 20000 });
  await context.close();
});

// The deployed WebSocket API answers over 128 KB in `invocationresultpart` messages (the
// embedded engine answers whole). Here the engine's answers to `engine::functions::list` are
// cut into parts on their way to the page, as `cut` says: good parts in any order are joined,
// and a part that cannot be one fails the call at once with what is wrong in it, not a wait
// for the call's 30 s timeout.
test("the console joins an answer in parts, and refuses parts that cannot be one", { timeout: 180000 }, async () => {
  const { url, link } = await startHarness("parts");
  const context = await (await launch()).newContext();
  const page = await context.newPage();
  const consoleErrors = [];
  page.on("pageerror", (e) => consoleErrors.push(String(e)));
  let cut = null;
  await routeEngine(page, "engine::functions::list", (msg, text, answersCall) =>
    cut && answersCall ? cut(text, msg.invocation_id).map((part) => ({ type: "invocationresultpart", invocation_id: msg.invocation_id, ...part })) : null);
  await page.goto(link);
  await page.locator("#conn.online").waitFor({ timeout: 15000 });
  const third = (t) => [t.slice(0, t.length / 3 | 0), t.slice(t.length / 3 | 0, 2 * t.length / 3 | 0), t.slice(2 * t.length / 3 | 0)];
  const workersPage = async () => {
    await page.goto(`${url}#/queues`);
    await page.goto(`${url}#/workers`);
  };

  // Three parts, the last first: the page is drawn from the joined answer.
  cut = (text) => { const [a, b, c] = third(text); return [{ index: 2, count: 3, text: c }, { index: 0, count: 3, text: a }, { index: 1, count: 3, text: b }]; };
  await workersPage();
  await page.locator("#view td button.name", { hasText: "harness::trigger" }).waitFor({ timeout: 15000 });
  await noErrors(page, "an answer joined from three parts");

  const hostile = [
    ["a count of 0", (t) => [{ index: 0, count: 0, text: t }], "count 0 is not a whole number from 1 to 128"],
    ["a count over 128", (t) => [{ index: 0, count: 129, text: t }], "count 129 is not a whole number from 1 to 128"],
    ["a count that is text", (t) => [{ index: 0, count: "2", text: t }], `count "2" is not a whole number from 1 to 128`],
    ["an index past the count", (t) => [{ index: 5, count: 2, text: t }], "index 5 is not from 0 to 1"],
    ["an index that is a fraction", (t) => [{ index: 0.5, count: 2, text: t }], "index 0.5 is not from 0 to 1"],
    ["text that is not a string", () => [{ index: 0, count: 2, text: 12 }], "part 0's text is not a string"],
    ["a count that changes", (t) => [{ index: 0, count: 3, text: t }, { index: 1, count: 2, text: t }], "part 1 says 2 parts where an earlier one said 3"],
    ["a part sent twice", (t) => [{ index: 0, count: 2, text: t }, { index: 0, count: 2, text: t }], "part 0 came twice"],
    ["parts that join into no JSON", () => [{ index: 0, count: 2, text: "{\"type\":" }, { index: 1, count: 2, text: "nothing" }], "its parts (2) do not join into this call's invocationresult"],
    ["parts that join into another call's answer", (t, id) => [{ index: 0, count: 1, text: t.replace(id, "someone-else") }], "its parts (1) do not join into this call's invocationresult"],
    ["parts that join into another message", () => [{ index: 0, count: 1, text: "{\"type\":\"ping\"}" }], "its parts (1) do not join into this call's invocationresult"],
  ];
  for (const [what, how, says] of hostile) {
    cut = how;
    const started = Date.now();
    await workersPage();
    // The page may ask more than once while it is shown: each asking fails alike.
    await page.locator("#errors .error").filter({ hasText: says }).first().waitFor({ timeout: 10000 });
    assert.ok(Date.now() - started < 10000, `${what}: failed at once`);
    const shown = await page.locator("#errors .error").filter({ hasText: says }).first().textContent();
    assert.match(shown, /^workers: invalid_message: the answer came in parts, and /, `${what}: ${shown}`);
    while (await page.locator("#errors .error").count()) await page.locator("#errors .error button").first().click();
  }
  // The connection lived through all of it, and answers whole again.
  cut = null;
  await workersPage();
  await page.locator("#view td button.name", { hasText: "harness::trigger" }).waitFor({ timeout: 15000 });
  await noErrors(page, "after the hostile parts");
  assert.deepEqual(consoleErrors, [], "no script errors");
  await context.close();
});

// The deployed engine leaves a field out of a pushed event that would pass API Gateway's
// 128 KB (`{"omitted": {"bytes": n}}`). Here the pushes of `function_execution_end` carry that
// marker on their way to the page, and the history reads carry no function results: the
// call's card says the result's size and that it is not shown, never the marker as the
// result. Read whole again, the history puts the result on the card.
test("a result left out of a pushed event shows as its size until the history has it", { timeout: 180000 }, async () => {
  const { url, link } = await startHarness("omitted");
  const context = await (await launch()).newContext();
  const page = await context.newPage();
  const consoleErrors = [];
  page.on("pageerror", (e) => consoleErrors.push(String(e)));
  let cutting = true;
  await routeEngine(page, "session-tree::messages", (msg, text, answersCall) => {
    if (!cutting) return null;
    if (msg.type === "streamevent" && msg.event) {
      const ev = msg.event;
      const data = ev.type === "create" || ev.type === "update" ? ev.data : ev.type === "function_execution_end" ? ev.data : null;
      if (data && (data.type === "function_execution_end" || ev.type === "function_execution_end") && "result" in data) {
        data.result = { omitted: { bytes: 131337 } };
        return [msg];
      }
    }
    if (answersCall && msg.result && Array.isArray(msg.result.messages)) {
      msg.result.messages = msg.result.messages.filter((x) => x.role !== "function_result");
      return [msg];
    }
    return null;
  });
  await page.goto(link);
  await page.locator("#conn.online").waitFor({ timeout: 15000 });
  await page.locator("#task").fill("Summarize the working directory");
  await page.getByRole("button", { name: "Start session" }).click();
  await page.waitForURL(/#\/session\/web-/);
  const sid = decodeURIComponent(page.url().split("#/session/")[1]);
  const card = page.locator(".tool", { hasText: "fs::list" });
  await card.locator(".omitted").filter({ hasText: "131,337 bytes, too large to push" }).waitFor({ timeout: 30000 });
  assert.equal(await card.locator("pre", { hasText: "omitted" }).count(), 0, "the marker is not shown as the result");
  // The history read whole: the card shows the listing itself.
  cutting = false;
  await page.goto(`${url}#/sessions`);
  await page.goto(`${url}#/session/${encodeURIComponent(sid)}`);
  await card.locator("summary", { hasText: "result" }).waitFor({ timeout: 20000 });
  assert.equal(await card.locator(".omitted").count(), 0, "no size note once the result is there");
  assert.deepEqual(consoleErrors, [], "no script errors");
  await context.close();
});
