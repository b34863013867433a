#!/usr/bin/env python3
"""Drives `tavern-bridge mcp` with the official Python MCP SDK (and, for what the SDK will not
send, raw JSON-RPC lines), as a harness nobody here wrote would. Exits non-zero on any failure.

Usage: client_check.py BRIDGE DATA_DIR ASSETS_DIR
"""
import asyncio
import json
import re
import subprocess
import sys

import jsonschema
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
try:  # the SDK renamed its error in 2.x
    from mcp.shared.exceptions import McpError
except ImportError:
    from mcp.shared.exceptions import MCPError as McpError

bridge, data, assets = sys.argv[1], sys.argv[2], sys.argv[3]
args = ["mcp", "--data", data, "--assets", assets, "--session", "py-1", "--character", "Mira", "--chat", "Mira - py"]
failures, passed = [], []


def g(obj, camel):
    """An attribute by its wire name: SDK 1.x spells them camelCase, 2.x snake_case."""
    snake = re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), camel)
    return getattr(obj, snake) if hasattr(obj, snake) else getattr(obj, camel)


def check(ok, what):
    (passed if ok else failures).append(what)
    print(("ok   " if ok else "FAIL ") + what, flush=True)


def patterns(schema):
    if isinstance(schema, dict):
        if isinstance(schema.get("pattern"), str):
            yield schema["pattern"]
        for v in schema.values():
            yield from patterns(v)
    elif isinstance(schema, list):
        for v in schema:
            yield from patterns(v)


async def session(fn):
    params = StdioServerParameters(command=bridge, args=args, env={"RUST_LOG": "warn"})
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            init = await s.initialize()
            return await fn(s, init)


async def first(s, init):
    check(g(init, "serverInfo").name == "agent-tavern", "initialize names the server")
    tools = (await s.list_tools()).tools
    check(len(tools) == 14, f"fourteen tools listed ({len(tools)})")
    drafts = [jsonschema.Draft202012Validator, jsonschema.Draft7Validator]
    for t in tools:
        try:
            for draft in drafts:
                draft.check_schema(g(t, "inputSchema"))
                draft.check_schema(g(t, "outputSchema"))
            # What a stock client does with a pattern: Python's `re` (no `\p{…}`), as the
            # SDK's validator uses it when nothing else is installed.
            for p in patterns(g(t, "inputSchema")):
                re.compile(p)
            valid = True
        except (jsonschema.SchemaError, re.error) as e:
            valid = False
            print(e, file=sys.stderr)
        check(valid, f"{t.name}: schemas valid on Draft 2020-12 and 7, patterns compile in Python")
        check(bool(t.title) and t.annotations is not None, f"{t.name}: title and annotations")
    # Client-side argument validation, as a harness does before calling: good arguments pass
    # on both drafts, a Chinese variable name among them.
    by_name = {t.name: t for t in tools}
    samples = {
        "variable_set": {"name": "basic.好感度", "value": 3},
        "variable_get": {"name": "hp"},
        "memory_write": {"content": "The lantern is blue."},
        "memory_search": {"query": "lantern"},
    }
    for name, sample in samples.items():
        try:
            for draft in drafts:
                draft(g(by_name[name], "inputSchema")).validate(sample)
            ok = True
        except (jsonschema.ValidationError, re.error) as e:
            ok = False
            print(e, file=sys.stderr)
        check(ok, f"{name}: a valid call validates client-side on Draft 2020-12 and 7")
    ro = {t.name: g(t.annotations, "readOnlyHint") for t in tools}
    check(ro["memory_search"] is True and ro["memory_write"] is False, "readOnlyHint says which tools write")
    check(g(next(t for t in tools if t.name == "memory_forget").annotations, "destructiveHint") is True, "memory_forget is marked destructive")

    wrote = await s.call_tool("memory_write", {"content": "The lantern is blue."})
    check(not g(wrote, "isError") and g(wrote, "structuredContent") is not None, "memory_write answers with structuredContent")
    schema = g(next(t for t in tools if t.name == "memory_write"), "outputSchema")
    jsonschema.validate(g(wrote, "structuredContent"), schema)
    check(True, "the structured result validates against its outputSchema")
    mem = g(wrote, "structuredContent")
    forgot = await s.call_tool("memory_forget", {"id": mem["id"], "revision": mem["revision"]})
    check(not g(forgot, "isError"), "memory_forget with the current revision")

    bad = await s.call_tool("memory_write", {"content": "x", "sessionId": "other"})
    check(g(bad, "isError") is True and "invalid-arguments" in bad.content[0].text, "bad arguments are a tool error the model can read")
    structured = g(bad, "structuredContent")
    check(isinstance(structured, dict) and structured.get("error", {}).get("code") == "invalid-arguments",
          "a tool error carries structuredContent with the declared error")
    jsonschema.validate(structured, g(by_name["memory_write"], "outputSchema"))
    check(True, "the tool error validates against the tool's outputSchema")
    # A name the core refuses is refused by the server, with the rule in words.
    bad_name = await s.call_tool("variable_get", {"name": "a b"})
    check(g(bad_name, "isError") is True and "invalid-arguments" in bad_name.content[0].text,
          "a variable name the rule refuses is refused by the server")
    try:
        await s.call_tool("no_such_tool", {})
        check(False, "an unknown tool is a protocol error")
    except McpError:
        check(True, "an unknown tool is a protocol error")

    errors = 0
    for i in range(500):
        r = await s.call_tool("variable_list", {})
        errors += bool(g(r, "isError"))
    check(errors == 0, f"500 calls in one process without a limit error ({errors} errors)")
    return mem


async def second(s, init):
    # A new process writes what the first wrote and forgot: a new memory, not a collision.
    again = await s.call_tool("memory_write", {"content": "The lantern is blue."})
    check(not g(again, "isError"), "write → forget → write again from a new process succeeds")
    return g(again, "structuredContent")


def raw(lines):
    """Sends raw JSON-RPC lines, returns the answers (one JSON value per line)."""
    p = subprocess.run([bridge] + args, input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=60)
    return [json.loads(l) for l in p.stdout.splitlines() if l.strip()]


def init_line(version, id_=1):
    return json.dumps({"jsonrpc": "2.0", "id": id_, "method": "initialize",
                       "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})


first_mem = asyncio.run(session(first))
second_mem = asyncio.run(session(second))
check(second_mem["id"] != first_mem["id"], "the second process's call id is its own")

old = raw([init_line("2024-11-05")])
check(old and old[0]["result"]["protocolVersion"] == "2024-11-05", "an old supported version is answered with itself")
unknown = raw([init_line("1999-01-01")])
answered = unknown[0].get("result", {}).get("protocolVersion")
check(answered not in (None, "1999-01-01"), f"an unknown version is answered with one we support ({answered})")
batch = raw([init_line("2025-06-18"), json.dumps([{"jsonrpc": "2.0", "id": 2, "method": "ping"}])])
check(any(a.get("error", {}).get("code") == -32600 for a in batch), "a batch is refused with -32600")

print(f"mcp clients: {len(passed)} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
