#!/usr/bin/env python3
"""Assertions for run.sh: what the real host logged, what the model saw, what was projected."""
import glob
import json
import sys

work = sys.argv[1]
failures = []


passed = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    (passed if ok else failures).append(what)


def jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def session_log(session):
    paths = glob.glob(f"{work}/home/sessions-raw/*/{session}/session.jsonl")
    check(len(paths) == 1, f"the host persisted one log for {session}")
    return [e for e in jsonl(paths[0]) if "seq" in e] if paths else []


def requests(run, session):
    return [r for r in jsonl(f"{work}/requests-{run}.jsonl") if r["session"] == session and r["body"].get("tools")]


def tool_results(request):
    out = []
    for m in request["body"]["messages"]:
        if m["role"] == "tool":
            content = m["content"]
            text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
            out.append(json.loads(text))
    return out


def chat(name):
    paths = [p for p in glob.glob(f"{work}/data/chats/*/*.jsonl") if name in p]
    check(len(paths) == 1, f"one SillyTavern chat for {name}")
    if not paths:
        return []
    with open(paths[0], encoding="utf-8") as f:
        text = f.read()
    check(not text.endswith("\n"), f"{name}: SillyTavern style, no trailing newline")
    return [json.loads(line) for line in text.split("\n")[1:]]


# --- the host's own log: one set of native events per turn ---------------------------------
log = session_log("e2e-session-1")
types = [e["type"] for e in log]
check([e["seq"] for e in log] == list(range(len(log))), "session log seqs are contiguous from 0")
check(types.count("turn/start") == 3 and types.count("turn/end") == 3, "three turns (runs 1, 2, 4), each started and ended once")
check(types.count("tool/call") == 6, "six tool calls (2 in turn 1, 4 in turn 2), each logged once")
check(all(e["data"]["reason"]["kind"] == "completed" for e in log if e["type"] == "turn/end"), "every turn completed")

# --- turn 1: the model had the kernel and the tools, and wrote ---------------------------------
first = requests(1, "e2e-session-1")
check(len(first) == 2, "turn 1 took two model requests")
system = first[0]["body"]["messages"][0]["content"]
check("AgentTavern roleplay kernel" in system and "You are Mira" in system, "the kernel is in the system prompt")
check("You are {{char}}" in system, "the tavern-mode persona keeps {{char}} literal")
names = {t["function"]["name"] for t in first[0]["body"]["tools"]}
check({"memory_write", "variable_set", "tavern_lore_search"} <= names, "AgentTavern tools are offered")
wrote = tool_results(first[1])
check(wrote[0].get("content") == "Kai's lantern is blue." and wrote[0].get("deduplicated") is False, "memory_write stored the memory")
check(wrote[1].get("name") == "trust" and wrote[1].get("value") == 1, "variable_set stored the variable")

# --- a plain session: no kernel, no AgentTavern tools, no chat -------------------------------------
plain = requests(1, "plain-1")
check(len(plain) == 1, "the plain session made one model request")
plain_system = plain[0]["body"]["messages"][0]["content"]
plain_tools = {t["function"]["name"] for t in plain[0]["body"]["tools"]}
check("AgentTavern" not in plain_system and "{{" not in plain_system, "a plain session gets no kernel or persona")
check(not (plain_tools & {"memory_write", "memory_search", "variable_set", "tavern_lore_search"}), "a plain session is offered no AgentTavern tool")
check(not glob.glob(f"{work}/data/chats/*/*plain-1*"), "a plain session gets no chat")

# --- turn 2, a new host process: found again; forged identity reaches nothing ------------------
second = requests(2, "e2e-session-1")
check(len(second) == 2, "turn 2 took two model requests")
found = tool_results(second[1])[-4:]
check(any(i["content"] == "Kai's lantern is blue." for i in found[0].get("items", [])), "memory_search finds the memory after the restart")
check(found[1].get("value") == 1, "variable_get finds the variable after the restart")
check(found[2].get("error", {}).get("code") == "invalid-arguments" and found[2]["error"].get("field") == "sessionId",
      "a forged sessionId in tool arguments is refused")
check(found[3].get("items") == [], "another session's memory is invisible")

# --- the projected chats: each message exactly once ---------------------------------------------
lines = chat("e2e-session-1")
projected = [l for l in lines if "eventSeq" in l.get("extra", {}).get("agentTavern", {})]
check([l["mes"] for l in projected] == [
    "My lantern is blue. Remember it, and that I trust you a little.",
    "I will remember your blue lantern, Kai.",
    "What colour is my lantern, and how much do I trust you?",
    "Your lantern is blue, and you trust me a little.",
    "A riddle, please.",
    "What walks on four legs at dawn?",
], "the chat holds each user and final assistant message exactly once, in order")
seqs = [l["extra"]["agentTavern"]["eventSeq"] for l in projected]
check(len(set(seqs)) == len(seqs), "no idempotency key repeats")
check(all(l["extra"]["agentTavern"]["sessionId"] == "e2e-session-1" for l in projected), "lines carry their session")
other = [l["mes"] for l in chat("e2e-other") if "eventSeq" in l.get("extra", {}).get("agentTavern", {})]
check(other == ["Keep this secret: the vault code is 4471.", "Your secret is safe with me."], "the other session has its own chat")

# --- MCP mode through DSH's own MCP client ------------------------------------------------------
mcp = requests(3, "e2e-mcp-host")
names = {t["function"]["name"] for t in mcp[0]["body"]["tools"]}
check("mcp__tavern__memory_write" in names and "mcp__tavern__memory_search" in names, "dsh-mcp-client lists the bridge's tools")
results = tool_results(mcp[-1])
check(results[0].get("content") == "The bridge works over MCP.", "memory_write over MCP")
check(any(i["content"] == "The bridge works over MCP." for i in results[1].get("items", [])), "memory_search over MCP finds it")

# --- tavern mode's route on the web profile, then used by the next request ------------------------
with open(f"{work}/web.json", encoding="utf-8") as f:
    web = json.load(f)
check(web["save"][0] == 200 and web["save"][1]["custom"] is True, "the web route saves a custom prompt")
check(web["read"][1]["text"] == "Speak as {{char}}, in riddles, to {{user}}.", "the route reads it back literally")
check(web["other"][1]["custom"] is False, "other sessions keep the preset default")
for case, status, code in [("get", 405, "method-not-allowed"), ("not-json", 400, "bad-request"),
                           ("bad-session", 400, "bad-session"), ("unknown-action", 400, "unknown-action"),
                           ("too-long", 413, "too-long")]:
    check(web[case][0] == status and web[case][1]["error"] == code, f"the route answers {status} {code}")
check(web["anonymous-huge"][0] == 401, "an unauthenticated oversized request gets 401, not 413")
check(web["wrong-token"][0] == 401, "a wrong token gets 401")
check(web["capital-bearer"][0] == 200 and web["read"][0] == 200, "the bearer scheme is matched in any case")
check(web["cross-site"][0] == 403 and web["cross-site"][1]["error"] == "cross-site", "a request from another origin gets 403")
check(web["text-plain"][0] == 415, "a text/plain body (a page's simple request) gets 415")
check(web["same-origin"][0] == 200, "a request from the route's own origin is served")
check(web["same-origin"][1]["text"] == web["read"][1]["text"], "no refused request changed the prompt")
# --- the management API, forwarded by the plugin to the bridge on DSH's web server ---------------
status, sessions = web["api-sessions"]
listed = {s["session"]: s for s in sessions.get("sessions", [])} if status == 200 else {}
check("e2e-session-1" in listed and listed["e2e-session-1"]["architecture"] == "agent-tavern",
      f"the API lists the played session with its architecture: {status}")
managed = [m for m in listed.get("e2e-session-1", {}).get("modes", []) if m["mode"] == "agent-managed"]
check(bool(managed) and (managed[0]["available"] or bool(managed[0]["reason"])),
      "and says whether agent-managed is available, with the reason when not")
mem_contents = [i["memory"]["content"] for i in web["api-memories"][1].get("items", [])]
check(web["api-memories"][0] == 200 and "Kai's lantern is blue." in mem_contents,
      "the API shows the memory the model wrote in that session")
check(not any("4471" in c for c in mem_contents), "and nothing of another session's chat")
check(any("4471" in i["memory"]["content"] for i in web["api-other-memories"][1].get("items", [])),
      "the other session sees its own")
check(web["api-anonymous"][0] == 401, "the API needs the route token")
check(web["api-cross-site"][0] == 403, "a page on another origin cannot write through the API")
check("api-edit" in web and web["api-edit"][0] == 200 and web["api-edit"][1]["source"]["kind"] == "user",
      "a memory corrected through the API is the user's")
check("api-stale" in web and web["api-stale"][0] == 409 and web["api-stale"][1]["error"]["current"] == web["api-edit"][1]["revision"],
      "an edit at a stale revision is 409 with the current revision")
check(web["api-openapi"][0] == 200 and "/api/v1/memories" in web["api-openapi"][1].get("paths", {}),
      "the OpenAPI document is served")
check(web["panel-redirect"] == [303, "/agent-tavern/panel/login"],
      "a browser without the bearer header is sent to the panel's sign-in page")
check(web["panel-login-form"] == 200 and web["panel-login-wrong"] == 401, "the sign-in page refuses a wrong token")
check(web["panel-login"][0] == 303 and web["panel-login"][2].startswith("tavern_session=")
      and "Path=/agent-tavern/panel" in web["panel-login"][2] and "e2e-route-token" not in web["panel-login"][2],
      "signing in with the routeToken gives a session cookie for the panel, never the token")
check(web["panel-page"] == [200, True], "the cookie opens the panel, showing the session's memories")
check(web["panel-cookie-api"] == 401, "the cookie does not open the JSON API")
fourth = requests(4, "e2e-session-1")
check(bool(fourth) and "Speak as {{char}}, in riddles, to {{user}}." in fourth[0]["body"]["messages"][0]["content"],
      "the next request carries the custom prompt with its braces")
check(bool(fourth) and "AgentTavern roleplay kernel" in fourth[0]["body"]["messages"][0]["content"], "and still the kernel")

# --- the plugin added the documented way (dsh plugin add + a config patch) -------------------------
bundle = requests(6, "e2e-bundle-1")
check(bool(bundle) and "AgentTavern roleplay kernel" in bundle[0]["body"]["messages"][0]["content"],
      "a plugin added with `dsh plugin add` mounts the kernel")
added = tool_results(bundle[-1]) if bundle else []
check(bool(added) and added[0].get("content") == "The gate is silver.", "and its tools work")

import os
# --- a SillyTavern chat continued from DSH, written into the user's folder ---------------------
st_name = "Seraphina - 2024-09-19@20h03m29s"
with open(os.path.join(os.path.dirname(__file__), "../../../../shared/fixtures/chats", st_name + ".jsonl"), "rb") as f:
    original = f.read()
with open(f"{work}/st/chats/default_Seraphina/{st_name}.jsonl", "rb") as f:
    continued = f.read()
check(continued.startswith(original + b"\n"), "the user's SillyTavern chat keeps every byte it had")
new_lines = [json.loads(l) for l in continued[len(original) + 1:].decode("utf-8").split("\n")]
check(any(l.get("is_user") and "back from the village" in l.get("mes", "") for l in new_lines)
      and any(not l.get("is_user") and "Welcome back to the glade" in l.get("mes", "") for l in new_lines),
      "and gains the turn, the user's message and the reply")
check(bool(new_lines) and new_lines[0].get("is_user") and not any("chat_metadata" in l for l in new_lines),
      "no greeting or new header is written into a continued chat: the user's message comes first")
check(continued[-1:] != b"\n", "SillyTavern style, no trailing newline")
check(not glob.glob(f"{work}/data-st/chats/*/*.jsonl"), "nothing of the chat is kept under `data`")
st_requests = requests(9, "e2e-st-1")
history = tool_results(st_requests[-1]) if st_requests else []
last_original = json.loads(original.decode("utf-8").split("\n")[-1])["mes"]
check(bool(history) and any(last_original[:40] in m.get("text", "") for m in history[0].get("items", [])),
      "the model reads the chat's own history through its tools")

st_tools = {t["function"]["name"] for r in st_requests for t in r["body"]["tools"]}
check(bool(st_tools) and all(n.startswith(("tavern_", "memory_", "variable_")) for n in st_tools),
      f"with roleplay.patch.yml the model sees only AgentTavern's tools: {sorted(st_tools)}")
check(bool(glob.glob(f"{work}/home/sessions/*/e2e-st-1/session.jsonl.zstd")),
      "stock DSH kept that session as a zstd log under sessions/")
with open(f"{work}/replay-st.json", encoding="utf-8") as f:
    replay = json.load(f)
check(replay["alreadyPresent"] >= 2 and replay["appended"] == 0 and replay["waiting"] == 0
      and replay["status"] == "ok", f"tavern chat replay reads the stock log whole, in order: {replay}")

# --- the plugin's `sentenceEncoder`: the real model reorders what the words found -----------------
by_meaning = requests(11, "e2e-encoder-1")
found = tool_results(by_meaning[-1]) if by_meaning else []
contents = [i["content"] for i in found[-1].get("items", [])] if found else []
check(len(contents) == 2 and "camera" in contents[0],
      f"with sentenceEncoder the memory the query means comes first: {contents}")

# --- the plugin's `store`: PostgreSQL instead of the files under `data` --------------------------
in_pg = requests(8, "e2e-pg-1")
pg_results = tool_results(in_pg[-1]) if in_pg else []
check(bool(pg_results) and pg_results[0].get("content") == "The bridge is made of oak.",
      "with `store` set, the tools work on PostgreSQL")
in_pg_by_scope = requests(10, "e2e-pg-1")
by_scope = tool_results(in_pg_by_scope[-1]) if in_pg_by_scope else []
check(bool(by_scope) and any(i["content"] == "The bridge is made of oak."
                             for i in by_scope[-1].get("items", [])),
      "a bridge holding memories by scope (storeMaxLoadedMemories) loads the session's and finds it")
with open(f"{work}/pg.json", encoding="utf-8") as f:
    pg = json.load(f)
check(pg["memories"] == 1, "the memory is one operation row in the database")
check(pg["chatLines"] >= 3 and pg["oakLines"] >= 1, "the turn is projected into the database's chat")
check(not glob.glob(f"{work}/data-pg/memory.log") and not glob.glob(f"{work}/data-pg/chats/*"),
      "and nothing is kept under `data`")

print(f"e2e: {len(passed)} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
