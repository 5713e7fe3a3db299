// The web console opens a finished session of the deployed shape whose history is over one
// API Gateway WebSocket message (a large tool result): its `session-tree::messages` answer
// comes in `invocationresultpart` messages, which the page puts together (run by
// tests/deployed/large.rs).
//   PAGE_URL  where the console page is served    ENGINE_URL, ENGINE_TOKEN  the deployed API
//   SESSION   the session to open                  MARKER  text at the end of the large result
import assert from "node:assert/strict";
import { chromium } from "playwright-core";

const { PAGE_URL, ENGINE_URL, ENGINE_TOKEN, SESSION, MARKER } = process.env;
assert.ok(PAGE_URL && ENGINE_URL && ENGINE_TOKEN && SESSION && MARKER, "PAGE_URL, ENGINE_URL, ENGINE_TOKEN, SESSION and MARKER are required");
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const wait = { timeout: 90000 };
try {
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  let parts = 0;
  page.on("websocket", (ws) => ws.on("framereceived", (f) => {
    if (typeof f.payload === "string" && f.payload.includes('"type":"invocationresultpart"')) parts += 1;
  }));
  await page.goto(PAGE_URL);
  await page.locator("#engine-url").fill(ENGINE_URL);
  await page.locator("#token").fill(ENGINE_TOKEN);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.locator("#conn.online").waitFor(wait);
  await page.goto(`${PAGE_URL.replace(/\/$/, "")}/#/session/${encodeURIComponent(SESSION)}`);
  await page.locator("h1 + .badge.stopped").waitFor(wait);
  // The stored history, whole: the run's last answer and the large result's last line.
  await page.locator(".msg.assistant").filter({ hasText: "Read and written." }).waitFor(wait).catch(async (e) => {
    const shown = await page.locator("#errors .error").allTextContents();
    const body = (await page.locator("body").innerText()).slice(0, 2000);
    throw new Error(`${e.message}\nparts: ${parts}\nerrors shown: ${JSON.stringify(shown)}\nscript errors: ${JSON.stringify(errors)}\npage: ${body}`);
  });
  await page.getByText(MARKER, { exact: false }).first().waitFor({ state: "attached", ...wait });
  const shown = await page.locator("#errors .error").allTextContents();
  assert.deepEqual(shown, [], "no bus error shown");
  assert.deepEqual(errors, [], "no script errors");
  assert.ok(parts > 1, `the history came in parts (${parts})`);
  console.log(`console opens a large history: ok (${parts} parts)`);
} finally {
  await browser.close();
}
