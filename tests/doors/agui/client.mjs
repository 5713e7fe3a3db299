// The AG-UI door, driven by the official AG-UI client (@ag-ui/client's HttpAgent, which
// itself enforces the protocol's event order) with every event checked again against
// @ag-ui/core's schemas. Prints what it saw as one JSON object; tests/doors.rs asserts on it.
// Usage: node client.mjs <http base> <token>
import { HttpAgent } from "@ag-ui/client";
import { EventSchemas } from "@ag-ui/core/schemas";

const [base, token] = process.argv.slice(2);
const url = `${base}/ag-ui`;
const headers = { Authorization: `Bearer ${token}` };

// One run: every event validated, the text, the calls and how the run ended.
async function run(agent, params = {}) {
  const seen = { types: [], text: "", thinking: "", calls: [], results: [], snapshots: [], invalid: [] };
  const subscriber = {
    onEvent({ event }) {
      const checked = EventSchemas.safeParse(event);
      if (!checked.success) seen.invalid.push({ type: event.type, error: String(checked.error).slice(0, 300) });
      seen.types.push(event.type);
      switch (event.type) {
        case "TEXT_MESSAGE_CONTENT": seen.text += event.delta; break;
        case "REASONING_MESSAGE_CONTENT": seen.thinking += event.delta; break;
        case "TOOL_CALL_START": seen.calls.push({ id: event.toolCallId, name: event.toolCallName }); break;
        case "TOOL_CALL_RESULT": seen.results.push({ id: event.toolCallId, content: event.content }); break;
        case "STATE_SNAPSHOT": seen.snapshots.push(event.snapshot.state); break;
        case "RUN_STARTED": seen.protocolVersion = event.protocolVersion; break;
        case "RUN_FINISHED": seen.outcome = event.outcome; seen.usage = event.usage; break;
        case "RUN_ERROR": seen.error = { code: event.code, message: event.message }; break;
      }
    },
  };
  try {
    await agent.runAgent(params, subscriber);
  } catch (e) {
    seen.thrown = String(e && e.message ? e.message : e).slice(0, 500);
  }
  return seen;
}

const out = {};
// A turn with a tool call and thinking, then a second turn in the same thread.
const agent = new HttpAgent({ url, headers, threadId: "agui-1" });
agent.addMessage({ id: "u1", role: "user", content: "list files" });
out.listed = await run(agent);
agent.addMessage({ id: "u2", role: "user", content: "say hello" });
out.hello = await run(agent);
out.messages = agent.messages.map((m) => m.role);

// A call that needs approval: the run ends with an interrupt; the next run resumes it.
const writer = new HttpAgent({ url, headers, threadId: "agui-2" });
writer.addMessage({ id: "w1", role: "user", content: "write a file" });
out.parked = await run(writer);
const interrupt = out.parked.outcome && out.parked.outcome.interrupts && out.parked.outcome.interrupts[0];
// The client refuses to run on while an interrupt is unanswered.
writer.addMessage({ id: "w2", role: "user", content: "say hello" });
out.unanswered = await run(writer);
writer.messages = writer.messages.filter((m) => m.id !== "w2");
out.resumed = await run(writer, {
  resume: [{ interruptId: interrupt.id, status: "resolved", payload: { decision: "allow" } }],
});
// The same answer again, sent by hand (the client would not): nothing is pending.
const again = await fetch(url, {
  method: "POST",
  headers: { ...headers, "Content-Type": "application/json", Accept: "text/event-stream" },
  body: JSON.stringify({ threadId: "agui-2", runId: "again", messages: [], resume: [{ interruptId: interrupt.id, status: "resolved", payload: { decision: "allow" } }] }),
});
out.again = { status: again.status, body: await again.text() };

// Cancelling an interrupt denies the call: it never runs.
const cancelled = new HttpAgent({ url, headers, threadId: "agui-3" });
cancelled.addMessage({ id: "c1", role: "user", content: "write a file" });
out.parked2 = await run(cancelled);
const i2 = out.parked2.outcome.interrupts[0];
out.cancelled = await run(cancelled, { resume: [{ interruptId: i2.id, status: "cancelled" }] });

// A wrong credential: the client's run fails with the HTTP status.
const intruder = new HttpAgent({ url, headers: { Authorization: "Bearer nope" }, threadId: "agui-4" });
intruder.addMessage({ id: "x1", role: "user", content: "say hello" });
out.badKey = await run(intruder);

console.log(JSON.stringify(out));
