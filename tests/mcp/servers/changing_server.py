"""A server built on the official MCP Python SDK (MCPServer) whose tool list changes: calling
`add_extra` adds the tool `extra`, `remove_extra` removes it; each sends
notifications/tools/list_changed."""
from mcp.server.mcpserver import MCPServer, Context

server = MCPServer("changing")


def extra() -> str:
    """A tool that comes and goes."""
    return "extra ran"


@server.tool()
async def add_extra(ctx: Context) -> str:
    """Adds the tool `extra`."""
    server.add_tool(extra, name="extra")
    await ctx.session.send_tool_list_changed()
    return "added"


@server.tool()
async def remove_extra(ctx: Context) -> str:
    """Removes the tool `extra`."""
    server.remove_tool("extra")
    await ctx.session.send_tool_list_changed()
    return "removed"


if __name__ == "__main__":
    server.run("stdio")
