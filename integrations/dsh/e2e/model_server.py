#!/usr/bin/env python3
"""A scripted OpenAI-style chat-completions model on loopback, for the real-host e2e test.

Usage: model_server.py SCRIPT.json REQUEST_LOG.jsonl PORT_FILE

SCRIPT.json is a list of steps, consumed in order by requests that offer tools (tool-less
requests are the host's auxiliary calls and get a short fixed reply). A step is either
{"content": "final text"} or {"tool_calls": [{"name": ..., "arguments": {...}}]}. Every
request is appended to REQUEST_LOG.jsonl. The chosen port is written to PORT_FILE. Responses
are server-sent events in the OpenAI streaming shape, ending with `data: [DONE]`. The server
exits by itself after 10 minutes so it can never outlive a test run.
"""
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SCRIPT_PATH, LOG_PATH, PORT_PATH = sys.argv[1], sys.argv[2], sys.argv[3]
with open(SCRIPT_PATH, encoding="utf-8") as f:
    STEPS = json.load(f)
LOCK = threading.Lock()
CALLS = {"n": 0}


def chunk(delta, finish=None):
    return {"id": "chatcmpl-e2e", "object": "chat.completion.chunk", "created": 0, "model": "scripted",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        session = self.headers.get("x-deepseek-harness-session-id", "")
        with LOCK:
            with open(LOG_PATH, "a", encoding="utf-8") as log:
                log.write(json.dumps({"path": self.path, "session": session, "body": body}, ensure_ascii=False) + "\n")
            if body.get("tools"):
                step = STEPS[CALLS["n"]] if CALLS["n"] < len(STEPS) else {"content": "(the script has no more steps)"}
                CALLS["n"] += 1
            else:
                step = {"content": "ok"}
        events = [chunk({"role": "assistant", "content": ""})]
        if "tool_calls" in step:
            for i, call in enumerate(step["tool_calls"]):
                call_id = "call_%d_%d" % (CALLS["n"], i)
                events.append(chunk({"tool_calls": [{"index": i, "id": call_id, "type": "function",
                                                     "function": {"name": call["name"], "arguments": ""}}]}))
                events.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": json.dumps(call["arguments"], ensure_ascii=False)}}]}))
            events.append(chunk({}, "tool_calls"))
        else:
            text = step["content"]
            for piece in (text[: len(text) // 2], text[len(text) // 2:]):
                events.append(chunk({"content": piece}))
            events.append(chunk({}, "stop"))
        usage = {"id": "chatcmpl-e2e", "object": "chat.completion.chunk", "created": 0, "model": "scripted", "choices": [],
                 "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}
        payload = "".join("data: %s\n\n" % json.dumps(e, ensure_ascii=False) for e in events + [usage]) + "data: [DONE]\n\n"
        data = payload.encode("utf-8")
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with open(PORT_PATH, "w", encoding="utf-8") as f:
        f.write(str(server.server_address[1]))
    threading.Timer(600, server.shutdown).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
