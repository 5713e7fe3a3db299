"""An MCP server over stdio written against the protocol itself (JSON-RPC lines), for what
the SDKs will not send: hostile listings and results, a server that never answers. The MCP
tests start it as `python raw_server.py MODE`.

  plain    tools over two pages (nextCursor): pid (read-only), hang (read-only, never
           answers), unannotated; every notifications/cancelled is appended to $CANCEL_LOG

$PROTOCOL_VERSION makes it answer initialize with that version whatever was asked.
  hostile  a 10 MB description, a tool named "search/files now", a 10 MB result
  deep     a tool whose input schema is 200 levels deep
  silent   never answers initialize
"""
import json
import os
import sys

MODE = sys.argv[1]
VERSIONS = ["2025-11-25", "2025-06-18"]


def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def tool(name, annotations=None, description="", schema=None):
    t = {"name": name, "description": description,
         "inputSchema": schema or {"type": "object", "properties": {}}}
    if annotations is not None:
        t["annotations"] = annotations
    return t


RO = {"readOnlyHint": True}


def deep_schema(levels):
    s = {"type": "string"}
    for _ in range(levels):
        s = {"type": "object", "properties": {"x": s}}
    return s


def listing(cursor):
    if MODE == "plain":
        if cursor is None:
            return {"tools": [tool("pid", RO, "This server's process id"),
                              tool("hang", RO, "Never answers")], "nextCursor": "page-2"}
        return {"tools": [tool("unannotated", None, "Says it ran")]}
    if MODE == "hostile":
        return {"tools": [tool("big", RO, "D" * (10 * 1024 * 1024)),
                          tool("search/files now", RO, "A name with a slash and spaces"),
                          tool("huge_result", RO, "Answers 10 MB")]}
    if MODE == "deep":
        return {"tools": [tool("deep", RO, "Deep", deep_schema(200))]}
    return {"tools": []}


def call(name, args):
    if name == "pid":
        return {"content": [{"type": "text", "text": str(os.getpid())}]}
    if name == "unannotated":
        return {"content": [{"type": "text", "text": "unannotated ran"}]}
    if name == "search/files now":
        return {"content": [{"type": "text", "text": "found: " + json.dumps(args)}]}
    if name == "huge_result":
        return {"content": [{"type": "text", "text": "R" * (10 * 1024 * 1024)}]}
    return None


for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    method, mid = msg.get("method"), msg.get("id")
    if method == "initialize":
        if MODE == "silent":
            continue
        asked = msg["params"].get("protocolVersion")
        # PROTOCOL_VERSION: answer that version whatever the client asked (an older server).
        answer = os.environ.get("PROTOCOL_VERSION") or (asked if asked in VERSIONS else VERSIONS[0])
        send({"jsonrpc": "2.0", "id": mid, "result": {
            "protocolVersion": answer,
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": "raw-" + MODE, "version": "1"}}})
    elif method == "notifications/cancelled":
        log = os.environ.get("CANCEL_LOG")
        if log:
            with open(log, "a") as f:
                f.write(json.dumps(msg.get("params", {})) + "\n")
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": mid,
              "result": listing((msg.get("params") or {}).get("cursor"))})
    elif method == "tools/call":
        p = msg["params"]
        if p["name"] == "hang":
            continue
        r = call(p["name"], p.get("arguments") or {})
        if r is None:
            send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32602, "message": "Unknown tool"}})
        else:
            send({"jsonrpc": "2.0", "id": mid, "result": r})
    elif method == "ping":
        send({"jsonrpc": "2.0", "id": mid, "result": {}})
    elif mid is not None:
        send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "Method not found"}})
