"""The official OpenAI Python client (PyPI `openai`, pinned in tests/clients/requirements.lock)
against the harness's OpenAI-compatible door. Prints one JSON object with what it saw.

    python openai_client.py <http base> <token>
"""

import json
import sys
import threading

import httpx
import openai

base, token = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=f"{base}/v1", api_key=token, max_retries=0, timeout=60)
out = {}

# GET /v1/models: harness and the catalogue's.
out["models"] = [m.id for m in client.models.list().data]

# Not streaming: the whole turn's text and usage.
r = client.chat.completions.create(
    model="harness", messages=[{"role": "user", "content": "say hello"}]
)
out["plain"] = {
    "text": r.choices[0].message.content,
    "finish": r.choices[0].finish_reason,
    "prompt_tokens": r.usage.prompt_tokens,
    "completion_tokens": r.usage.completion_tokens,
}

# Streaming with usage, in a session named by the client: a tool call appears as a line.
raw = client.chat.completions.with_raw_response.create(
    model="harness",
    messages=[
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "list files"},
    ],
    stream=True,
    stream_options={"include_usage": True},
    extra_headers={"X-Session-Id": "oai-stream-1"},
)
out["stream_session"] = raw.headers.get("x-session-id")
chunks, usage, finish = [], None, None
for chunk in raw.parse():
    if chunk.usage is not None:
        usage = chunk.usage.model_dump()
    for c in chunk.choices:
        if c.delta and c.delta.content:
            chunks.append(c.delta.content)
        if c.finish_reason:
            finish = c.finish_reason
out["stream"] = {"text": "".join(chunks), "chunks": len(chunks), "usage": usage, "finish": finish}

# A bad key: the client's own AuthenticationError.
try:
    openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0).chat.completions.create(
        model="harness", messages=[{"role": "user", "content": "say hello"}]
    )
    out["bad_key"] = "accepted"
except openai.AuthenticationError as e:
    out["bad_key"] = {"status": e.status_code, "type": e.body.get("type") if isinstance(e.body, dict) else None}

# A bad body: BadRequestError naming what is wrong.
try:
    client.chat.completions.create(model="harness", messages=[])
    out["bad_body"] = "accepted"
except openai.BadRequestError as e:
    out["bad_body"] = {"status": e.status_code, "message": str(e)}

# An unknown model: NotFoundError.
try:
    client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "say hello"}])
    out["bad_model"] = "accepted"
except openai.NotFoundError as e:
    out["bad_model"] = {"status": e.status_code}

# A parked call keeps the stream open until someone decides it (here, over the HTTP API,
# once the stream says the call waits).
decided = {}


def decide(sid, cid):
    r = httpx.post(
        f"{base}/api/approvals/{sid}/{cid}",
        headers={"Authorization": f"Bearer {token}"},
        json={"decision": "allow", "reason": "from the test"},
    )
    decided["status"] = r.status_code


stream = client.chat.completions.create(
    model="harness",
    messages=[{"role": "user", "content": "write a file"}],
    stream=True,
    extra_headers={"X-Session-Id": "oai-park-1"},
)
text = ""
for chunk in stream:
    for c in chunk.choices:
        if c.delta and c.delta.content:
            text += c.delta.content
            if "waits for approval" in text and "status" not in decided:
                line = text[text.index("POST /api/approvals/"):].split()[1]
                _, _, _, sid, cid = line.split("/")[:5]
                threading.Thread(target=decide, args=(sid, cid)).start()
out["parked"] = {"text": text, "decided": decided.get("status")}

# The session is busy while a turn runs: 409 (here: a second request into the parked one is
# not needed; a conflict is checked by the Rust side).
print(json.dumps(out))
