"""A real HTTP server on 127.0.0.1 speaking the OpenAI chat-completions protocol, with scripted replies.

Actions (dicts), served one per chat request in order, then ``default`` (or a responder function
of the request body):
    {"reply": text}                       a completion (with usage unless "usage": False)
    {"status": 429, "body": {...}}        an HTTP error (optional "headers")
    {"hang": seconds}                     sleep before answering: the client times out first
    {"raw": bytes}                        a 200 with a body that is not JSON
    {"parts": [text, ...]}                a completion whose content is a list of text parts
                                          (some OpenAI-compatible servers send that)
    {"reply": text, "usage": {...}}       a completion with exactly this usage object
    {"trickle": seconds, "reply": text}   headers at once, then one keep-alive space every 0.1 s for
                                          that long, then the completion (every read is quick)
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeLLM:
    def __init__(self, script=(), default=None, models=("fake-model",), responder=None):
        self.script = list(script)
        self.default = default or {"reply": "I have nothing to add."}
        self.responder = responder
        self.models = list(models)
        self.requests: list[dict] = []  # {"path", "headers", "body"} per request
        self.active = 0  # chat requests being answered now
        self.max_active = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep pytest output clean
                pass

            def _send(self, status, payload, headers=None):
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_GET(self):
                outer._log(self, None)
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": [
                        {"id": m, "object": "model", "created": 0, "owned_by": "test"} for m in outer.models]})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                outer._log(self, body)
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": "not found"}})
                    return
                if body.get("model") not in outer.models:
                    self._send(404, {"error": {"message": f"model {body.get('model')} does not exist"}})
                    return
                with outer._lock:
                    outer.active += 1
                    outer.max_active = max(outer.max_active, outer.active)
                try:
                    self._answer(outer._next(body), body)
                finally:
                    with outer._lock:
                        outer.active -= 1

            def _answer(self, action, body):
                if "hang" in action:
                    outer._stop.wait(action["hang"])
                    action = {"reply": "too late"}
                if "status" in action:
                    self._send(action["status"], action.get("body", {"error": {"message": "scripted error"}}),
                               action.get("headers"))
                    return
                if "raw" in action:
                    self._send(200, action["raw"])
                    return
                text = action["reply"] if "reply" in action else "".join(action["parts"])
                content = [{"type": "text", "text": t} for t in action["parts"]] if "parts" in action else text
                payload = {"id": "chatcmpl-test", "object": "chat.completion", "created": int(time.time()),
                           "model": body["model"],
                           "choices": [{"index": 0, "finish_reason": action.get("finish_reason", "stop"),
                                        "message": {"role": "assistant", "content": content}}]}
                usage = action.get("usage", True)
                if isinstance(usage, dict):
                    payload["usage"] = usage
                elif usage:
                    prompt_chars = sum(len(str(m.get("content", ""))) for m in body.get("messages", []))
                    payload["usage"] = {"prompt_tokens": prompt_chars // 4, "completion_tokens": len(text) // 4,
                                        "total_tokens": prompt_chars // 4 + len(text) // 4}
                if "trickle" in action:
                    self._trickle(json.dumps(payload).encode(), action["trickle"])
                    return
                self._send(200, payload)

            def _trickle(self, data, seconds):
                spaces = int(seconds / 0.1)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(spaces + len(data)))
                self.end_headers()
                try:
                    for _ in range(spaces):  # leading whitespace is valid JSON: a keep-alive trick of proxies
                        self.wfile.write(b" ")
                        self.wfile.flush()
                        if outer._stop.wait(0.1):
                            return
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    def _log(self, handler, body):
        with self._lock:
            self.requests.append({"path": handler.path, "headers": {k.lower(): v for k, v in handler.headers.items()},
                                  "body": body})

    def _next(self, body):
        with self._lock:
            if self.script:
                return self.script.pop(0)
        if self.responder is not None:
            return self.responder(body)
        return self.default

    @property
    def chat_requests(self) -> list[dict]:
        return [r for r in self.requests if r["body"] is not None]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()


def free_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens (the endpoint is down)."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/v1"
