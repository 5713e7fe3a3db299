// The web console against the deployed shape (run by tests/deployed.rs, which brings up
// LocalStack, every function as a Lambda bootstrap and the emulated API Gateway WebSocket
// API): the page is served by one engine, and signs in to the deployed API by its URL and
// token, as an operator does. It starts a session, approves the parked call with its button
// and sees the turn finish; every call goes through the router Lambda and the functions'
// Lambdas, the approval through the DynamoDB stream trigger.
//   PAGE_URL  where the console page is served    ENGINE_URL, ENGINE_TOKEN  the deployed API
import assert from "node:assert/strict";
import { wait, withSignedInPage } from "./deployed-page.mjs";

// The console subscribes with `batch`: a step's stored events come in `streamevents`.
let batches = 0;
const counted = (text) => { if (text.includes('"type":"streamevents"')) batches += 1; };
await withSignedInPage(counted, async (page, errors) => {
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
});
