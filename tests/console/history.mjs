// The web console opens a finished session of the deployed shape whose history is over one
// API Gateway WebSocket message (a large tool result): its `session-tree::messages` answer
// comes in `invocationresultpart` messages, which the page puts together (run by
// tests/deployed/large.rs).
//   PAGE_URL  where the console page is served    ENGINE_URL, ENGINE_TOKEN  the deployed API
//   SESSION   the session to open                  MARKER  text at the end of the large result
import assert from "node:assert/strict";
import { wait, withSignedInPage } from "./deployed-page.mjs";

const { PAGE_URL, SESSION, MARKER } = process.env;
assert.ok(SESSION && MARKER, "SESSION and MARKER are required");
let parts = 0;
const counted = (text) => { if (text.includes('"type":"invocationresultpart"')) parts += 1; };
await withSignedInPage(counted, async (page, errors) => {
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
});
