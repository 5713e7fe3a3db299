"""The A2A door, driven by the official A2A Python SDK (PyPI `a2a-sdk`, pinned in
tests/clients/requirements.lock) over its JSON-RPC binding. Prints what it saw as one JSON
object; tests/doors.rs asserts on it. Usage: python a2a_client.py <http base> <token>"""

import asyncio
import json
import sys
import uuid

import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    TaskState,
)
from google.protobuf import json_format, struct_pb2


def text_message(text, context_id=None, task_id=None):
    m = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(text=text)])
    if context_id:
        m.context_id = context_id
    if task_id:
        m.task_id = task_id
    return m


def data_message(data, context_id, task_id):
    value = struct_pb2.Value()
    json_format.ParseDict(data, value)
    return Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(data=value)],
                   context_id=context_id, task_id=task_id)


def state_name(s):
    return TaskState.Name(s)


def task_seen(t):
    text = "".join(p.text for a in t.artifacts for p in a.parts)
    return {"id": t.id, "context": t.context_id, "state": state_name(t.status.state), "text": text,
            "status_text": "".join(p.text for p in t.status.message.parts)}


async def collect(stream):
    """A streamed task: the kinds of update, the answer's text, the last state."""
    out = {"kinds": [], "text": "", "notes": [], "states": []}
    async for ev in stream:
        kind = ev.WhichOneof("payload")
        out["kinds"].append(kind)
        if kind == "task":
            out["task"] = ev.task.id
            out["context"] = ev.task.context_id
            out["states"].append(state_name(ev.task.status.state))
        elif kind == "status_update":
            out["states"].append(state_name(ev.status_update.status.state))
            out["notes"].append("".join(p.text for p in ev.status_update.status.message.parts))
        elif kind == "artifact_update":
            out["text"] += "".join(p.text for p in ev.artifact_update.artifact.parts)
    return out


async def main(base, token):
    out = {}
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    # The card is public: fetched without the credential.
    async with httpx.AsyncClient() as anonymous:
        card = await A2ACardResolver(anonymous, base).get_agent_card()
    out["card"] = {"name": card.name, "url": card.supported_interfaces[0].url,
                   "binding": card.supported_interfaces[0].protocol_binding,
                   "streaming": card.capabilities.streaming,
                   "skills": [s.id for s in card.skills],
                   "schemes": list(card.security_schemes.keys())}

    streaming = ClientFactory(ClientConfig(httpx_client=http, streaming=True)).create(card)
    blocking = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)

    # Streamed: the task, working updates for the call, the answer as artifact chunks, completed.
    out["stream"] = await collect(streaming.send_message(SendMessageRequest(message=text_message("list files", "a2a-1"))))
    # Not streamed: one task, completed, its answer as an artifact; the same context goes on.
    [ev] = [e async for e in blocking.send_message(SendMessageRequest(message=text_message("say hello", "a2a-1")))]
    out["blocking"] = task_seen(ev.task)
    out["got"] = task_seen(await blocking.get_task(GetTaskRequest(id=ev.task.id)))
    out["earlier"] = task_seen(await blocking.get_task(GetTaskRequest(id=out["stream"]["task"])))

    # A call that needs approval: input-required; a data part answers it; the call runs once.
    parked = await collect(streaming.send_message(SendMessageRequest(message=text_message("write a file", "a2a-2"))))
    out["parked"] = parked
    try:
        [e async for e in blocking.send_message(SendMessageRequest(message=text_message("just go on", "a2a-2", parked["task"])))]
        out["text_answer"] = "accepted"
    except Exception as e:  # noqa: BLE001
        out["text_answer"] = repr(e)[:300]
    out["answered"] = await collect(streaming.send_message(SendMessageRequest(message=data_message({"decision": "allow"}, "a2a-2", parked["task"]))))
    try:
        [e async for e in blocking.send_message(SendMessageRequest(message=data_message({"decision": "allow"}, "a2a-2", parked["task"])))]
        out["answer_again"] = "accepted"
    except Exception as e:  # noqa: BLE001
        out["answer_again"] = repr(e)[:300]

    # Cancelling a task whose call waits: the call never runs, the task is canceled.
    [ev] = [e async for e in blocking.send_message(SendMessageRequest(message=text_message("write a file", "a2a-3")))]
    out["parked_blocking"] = task_seen(ev.task)
    out["cancelled"] = task_seen(await blocking.cancel_task(CancelTaskRequest(id=ev.task.id)))
    try:
        await blocking.cancel_task(CancelTaskRequest(id=ev.task.id))
        out["cancel_again"] = "accepted"
    except Exception as e:  # noqa: BLE001
        out["cancel_again"] = repr(e)[:300]
    try:
        await blocking.get_task(GetTaskRequest(id="nope.nowhere"))
        out["missing"] = "found"
    except Exception as e:  # noqa: BLE001
        out["missing"] = repr(e)[:300]

    # A wrong credential: refused.
    async with httpx.AsyncClient(headers={"Authorization": "Bearer nope"}) as bad:
        intruder = ClientFactory(ClientConfig(httpx_client=bad, streaming=False)).create(card)
        try:
            [e async for e in intruder.send_message(SendMessageRequest(message=text_message("say hello")))]
            out["bad_key"] = "accepted"
        except Exception as e:  # noqa: BLE001
            out["bad_key"] = repr(e)[:300]
    await http.aclose()
    print(json.dumps(out))


asyncio.run(main(sys.argv[1], sys.argv[2]))
