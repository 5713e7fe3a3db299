// What the console scripts against the deployed shape share (deployed.mjs, history.mjs): a
// headless chromium, and a page served at PAGE_URL signed in to the deployed API at
// ENGINE_URL with ENGINE_TOKEN, as an operator signs in.
import assert from "node:assert/strict";
import { chromium } from "playwright-core";

export const wait = { timeout: 90000 };

// Run `body(page, errors)` on a signed-in page (`errors`: the page's script errors so far);
// `onFrame(text)` sees every text frame the page's WebSocket receives, from the start.
export async function withSignedInPage(onFrame, body) {
  const { PAGE_URL, ENGINE_URL, ENGINE_TOKEN } = process.env;
  assert.ok(PAGE_URL && ENGINE_URL && ENGINE_TOKEN, "PAGE_URL, ENGINE_URL and ENGINE_TOKEN are required");
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  try {
    const page = await browser.newPage();
    const errors = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    page.on("websocket", (ws) => ws.on("framereceived", (f) => {
      if (typeof f.payload === "string") onFrame(f.payload);
    }));
    await page.goto(PAGE_URL);
    await page.locator("#engine-url").fill(ENGINE_URL);
    await page.locator("#token").fill(ENGINE_TOKEN);
    await page.getByRole("button", { name: "Sign in" }).click();
    await page.locator("#conn.online").waitFor(wait);
    await body(page, errors);
  } finally {
    await browser.close();
  }
}
