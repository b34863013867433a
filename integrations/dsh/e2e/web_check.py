#!/usr/bin/env python3
"""Drives the tavern-mode route and the management API (/agent-tavern/api/v1) of a running
`dsh --profile web`: waits (bounded) until it answers, then records a set of requests and their
answers as JSON for check.py.

Usage: web_check.py PORT OUT.json TOKEN
"""
import http.client
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

port, out, token = sys.argv[1], sys.argv[2], sys.argv[3]
url = f"http://127.0.0.1:{port}/tavern-mode/system-prompt"


def call(method, body, auth=f"bearer {token}", extra=None):
    """A request; by default admitted with the scheme written in lowercase (RFC 7235 allows it)."""
    data = body.encode("utf-8") if body is not None else None
    headers = {"content-type": "application/json"}
    if auth is not None:
        headers["authorization"] = auth
    headers.update(extra or {})
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def call_huge_anonymous():
    """A 2 MiB body without credentials: the server may answer 401 and close before the body is
    sent (it never reads it), so a broken pipe while sending is expected; the answer is read."""
    conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=10)
    try:
        conn.request("POST", "/tavern-mode/system-prompt", body=b"x" * (2 << 20),
                     headers={"content-type": "application/json"})
    except (BrokenPipeError, ConnectionResetError):
        pass
    try:
        r = conn.getresponse()
        return r.status, json.loads(r.read() or b"null")
    except (ConnectionResetError, http.client.RemoteDisconnected) as e:
        return 0, {"error": f"no answer: {e}"}


deadline = time.monotonic() + 90
while True:
    try:
        status, _ = call("POST", json.dumps({"action": "read", "sessionId": "e2e-session-1"}))
        if status != 404:
            break
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        pass
    if time.monotonic() > deadline:
        sys.exit("web_check: the web profile never answered on the route")
    time.sleep(0.25)

results = {
    "save": call("POST", json.dumps({"action": "save", "sessionId": "e2e-session-1", "text": "Speak as {{char}}, in riddles, to {{user}}."})),
    "read": call("POST", json.dumps({"action": "read", "sessionId": "e2e-session-1"})),
    "other": call("POST", json.dumps({"action": "read", "sessionId": "e2e-other"})),
    "get": call("GET", None),
    "not-json": call("POST", "not json"),
    "bad-session": call("POST", json.dumps({"action": "read", "sessionId": "../x"})),
    "unknown-action": call("POST", json.dumps({"action": "delete", "sessionId": "e2e-session-1"})),
    "too-long": call("POST", json.dumps({"action": "save", "sessionId": "e2e-session-1", "text": "x" * 40000})),
    # Not admitted: 401 before anything about the body, even an oversized one.
    "anonymous-huge": call_huge_anonymous(),
    "wrong-token": call("POST", json.dumps({"action": "read", "sessionId": "e2e-session-1"}), auth="Bearer nope"),
    "capital-bearer": call("POST", json.dumps({"action": "read", "sessionId": "e2e-session-1"}), auth=f"Bearer {token}"),
    # What a web page on another origin can send to loopback (issue 30, F14): refused unread.
    "cross-site": call("POST", json.dumps({"action": "save", "sessionId": "e2e-session-1", "text": "pwned"}),
                       extra={"origin": "http://evil.example"}),
    "text-plain": call("POST", json.dumps({"action": "save", "sessionId": "e2e-session-1", "text": "pwned"}),
                       extra={"content-type": "text/plain"}),
    "same-origin": call("POST", json.dumps({"action": "read", "sessionId": "e2e-session-1"}),
                        extra={"origin": f"http://127.0.0.1:{port}"}),
}


def api(method, path, body=None, auth=f"Bearer {token}", extra=None):
    """A request to the management API the plugin forwards to the bridge."""
    data = json.dumps(body).encode("utf-8") if body is not None else None
    headers = {"content-type": "application/json"} if data is not None else {}
    if auth is not None:
        headers["authorization"] = auth
    headers.update(extra or {})
    req = urllib.request.Request(f"http://127.0.0.1:{port}/agent-tavern{path}", data=data,
                                 method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


results["api-sessions"] = api("GET", "/api/v1/sessions")
results["api-memories"] = api("GET", "/api/v1/memories?session=e2e-session-1")
results["api-other-memories"] = api("GET", "/api/v1/memories?session=e2e-other")
results["api-anonymous"] = api("GET", "/api/v1/memories", auth=None)
results["api-cross-site"] = api("POST", "/api/v1/memories", {"scope": {"kind": "global"}, "id": "x", "content": "pwned"},
                                extra={"origin": "http://evil.example"})
items = results["api-memories"][1].get("items", []) if results["api-memories"][0] == 200 else []
lantern = next((i["memory"] for i in items if "lantern" in i["memory"]["content"]), None)
if lantern:
    sc = lantern["scope"]
    q = urllib.parse.urlencode({k: v for k, v in {"scope": sc["kind"], "character": sc.get("character"),
                                                   "chat": sc.get("chat"), "session": "e2e-session-1"}.items() if v})
    edit = {"revision": lantern["revision"], "content": "Kai's lantern is deep blue."}
    results["api-edit"] = api("PUT", f"/api/v1/memories/{urllib.parse.quote(lantern['id'])}?{q}", edit)
    # The same revision again: someone else's edit came first.
    results["api-stale"] = api("PUT", f"/api/v1/memories/{urllib.parse.quote(lantern['id'])}?{q}", edit)
results["api-openapi"] = api("GET", "/api/v1/openapi.json")


def raw(method, path, body=None, headers=None):
    """A request as a browser makes it (no bearer header, redirects not followed): status,
    headers and body text."""
    conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=10)
    try:
        conn.request(method, f"/agent-tavern{path}", body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode("utf-8", "replace")
    finally:
        conn.close()


# A browser on the panel behind the routeToken: it cannot send the bearer header with a link,
# so it is sent to the sign-in page; the token typed there gives it a session cookie (never the
# token), which opens the panel and nothing else.
form = {"content-type": "application/x-www-form-urlencoded"}
first = raw("GET", "/panel")
results["panel-redirect"] = [first[0], first[1].get("location")]
results["panel-login-form"] = raw("GET", "/panel/login")[0]
results["panel-login-wrong"] = raw("POST", "/panel/login", "token=guess", form)[0]
signed = raw("POST", "/panel/login", urllib.parse.urlencode({"token": token}), form)
cookie = signed[1].get("set-cookie", "")
results["panel-login"] = [signed[0], signed[1].get("location"), cookie]
session_cookie = cookie.split(";")[0]
page = raw("GET", "/panel/memories?session=e2e-session-1", headers={"cookie": session_cookie})
results["panel-page"] = [page[0], "lantern" in page[2]]
results["panel-cookie-api"] = raw("GET", "/api/v1/sessions", headers={"cookie": session_cookie})[0]
with open(out, "w", encoding="utf-8") as f:
    json.dump(results, f)
