// The web console against the deployed shape (run by tests/deployed.rs, which brings up
// LocalStack, every function as a Lambda bootstrap and the emulated API Gateway WebSocket
// API): the page is served by one engine, and signs in to the deployed API by its URL and
// token, as an operator does. It starts a session, approves the parked call with its button
// and sees the turn finish; every call goes through the router Lambda and the functions'
// Lambdas, the approval through the DynamoDB stream trigger.
//   PAGE_URL  where the console page is served    ENGINE_URL, ENGINE_TOKEN  the deployed API
import assert from "node:assert/strict";
import { chromium } from "playwright-core";

const { PAGE_URL, ENGINE_URL, ENGINE_TOKEN } = process.env;
assert.ok(PAGE_URL && ENGINE_URL && ENGINE_TOKEN, "PAGE_URL, ENGINE_URL and ENGINE_TOKEN are required");
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
  // The console subscribes with `batch`: a step's stored events come in `streamevents`.
  let batches = 0;
  page.on("websocket", (ws) => ws.on("framereceived", (f) => {
    if (typeof f.payload === "string" && f.payload.includes('"type":"streamevents"')) batches += 1;
  }));
  await page.goto(PAGE_URL);
  await page.locator("#engine-url").fill(ENGINE_URL);
  await page.locator("#token").fill(ENGINE_TOKEN);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.locator("#conn.online").waitFor(wait);
  await page.locator("#task").fill("Write the file");
  await page.getByRole("button", { name: "Start session" }).click();
  await page.waitForURL(/#\/session\/web-/, wait);
  const allow = page.getByRole("button", { name: "Allow" });
  await allow.waitFor(wait);
  await allow.click();
  await page.locator("h1 + .badge.stopped").waitFor(wait);
  await page.locator(".msg.assistant").filter({ hasText: "Deployed done." }).waitFor(wait);
  const shown = await page.locator("#errors .error").allTextContents();
  assert.deepEqual(shown, [], "no bus error shown");
  // The session list comes from the session Lambda too.
  await page.getByRole("link", { name: "Sessions" }).click();
  await page.locator("tr[data-sid^='web-'] .badge.stopped").waitFor(wait);
  assert.deepEqual(errors, [], "no script errors");
  assert.ok(batches > 0, "some events came batched in one message");
  console.log(`console against the deployed shape: ok (${batches} batched messages)`);
} finally {
  await browser.close();
}
