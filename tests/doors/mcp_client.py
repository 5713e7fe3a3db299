"""The MCP server door, driven by the official MCP Python SDK client (PyPI `mcp`, pinned in
tests/mcp/requirements.lock) over streamable HTTP. Prints what it saw as one JSON object;
tests/doors.rs asserts on it. Usage: python mcp_client.py <http base> <token>"""

import asyncio
import json
import sys

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


def client(base, token):
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(60.0))
    return Client(streamable_http_client(f"{base}/mcp", http_client=http))


def seen(r):
    return {"structured": r.structured_content, "text": r.content[0].text if r.content else None, "is_error": r.is_error}


async def main(base, token):
    out = {}
    async with client(base, token) as c:
        out["version"] = c.protocol_version
        listed = await c.list_tools()
        out["tools"] = sorted(t.name for t in listed.tools)

        progress = []

        async def on_progress(p, total, message):
            progress.append(message)

        r = await c.call_tool("run_agent", {"message": "list files", "session_id": "mcp-1"}, progress_callback=on_progress)
        out["listed"] = seen(r) | {"progress": progress}

        r = await c.call_tool("run_agent", {"message": "say hello"})
        out["fresh"] = seen(r)

        # A call that needs approval: the turn answers its pending calls; deciding one runs it.
        r = await c.call_tool("run_agent", {"message": "write a file", "session_id": "mcp-2"})
        out["parked"] = seen(r)
        out["pending"] = (await c.call_tool("list_pending_approvals", {})).structured_content
        cid = r.structured_content["pending"][0]["function_call_id"]
        r = await c.call_tool("resolve_approval", {"session_id": "mcp-2", "function_call_id": cid, "decision": "allow"})
        out["resolved"] = seen(r)
        r = await c.call_tool("resolve_approval", {"session_id": "mcp-2", "function_call_id": cid, "decision": "allow"})
        out["again"] = seen(r)
        out["session"] = seen(await c.call_tool("get_session", {"session_id": "mcp-2"}))
        out["missing"] = seen(await c.call_tool("get_session", {"session_id": "never-ran"}))

        # Hostile arguments: a tool error that names what is wrong.
        out["bad_type"] = seen(await c.call_tool("run_agent", {"message": 5}))
        out["bad_name"] = seen(await c.call_tool("run_agent", {"message": "x", "sesion_id": "y"}))
        out["bad_id"] = seen(await c.call_tool("get_session", {"session_id": "../etc"}))
        try:
            await c.call_tool("no_such_tool", {})
            out["unknown_tool"] = "answered"
        except Exception as e:  # the SDK raises the JSON-RPC error
            out["unknown_tool"] = str(e)

        # Cancelling a call (the SDK sends notifications/cancelled) aborts its turn.
        try:
            await asyncio.wait_for(c.call_tool("run_agent", {"message": "think slowly", "session_id": "mcp-3"}), 1.5)
            out["cancel"] = "finished"
        except (asyncio.TimeoutError, TimeoutError):
            out["cancel"] = "cancelled"
        for _ in range(50):
            s = (await c.call_tool("get_session", {"session_id": "mcp-3"})).structured_content
            if s and s["state"] != "running":
                break
            await asyncio.sleep(0.1)
        out["cancelled_session"] = s

    # A wrong credential: the client cannot connect.
    try:
        async with client(base, "nope") as c:
            await c.list_tools()
        out["bad_key"] = "connected"
    except BaseException as e:  # noqa: BLE001 (an ExceptionGroup from the task group)
        out["bad_key"] = repr(e)[:500]
    print(json.dumps(out))


asyncio.run(main(sys.argv[1], sys.argv[2]))
