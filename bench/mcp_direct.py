"""The baseline of bench/results/mcp.md: N calls of server-everything's `echo` made directly
with the official MCP Python SDK client over stdio (what an agent without the harness pays).
Usage: python mcp_direct.py <node> <server-everything index.js> <calls> → one JSON line."""
import asyncio
import json
import sys
import time

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def main():
    node, script, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
    params = StdioServerParameters(command=node, args=[script, "stdio"])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            for _ in range(50):
                await session.call_tool("echo", {"message": "warm"})
            start = time.perf_counter()
            for i in range(calls):
                r = await session.call_tool("echo", {"message": f"m{i}"})
                assert not r.is_error, r
            elapsed = time.perf_counter() - start
    print(json.dumps({"calls": calls, "seconds": elapsed, "per_call_ms": elapsed * 1000 / calls}))


asyncio.run(main())
