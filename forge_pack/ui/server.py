"""The search dashboard's HTTP server: standard library only, read-only over a run store.

Security model (the page shows kernel sources and LLM text a model wrote, and may run on a shared
GPU box):
- binds 127.0.0.1 unless told otherwise; a random token is required on every /api call
  (``X-Forge-Token`` header or ``token`` query parameter); the page reads it once from the URL;
- the Host header must name a loopback address (defeats DNS rebinding); when bound to a
  non-loopback address, IP literals are accepted too (rebinding needs a domain name);
- read-only: the store is opened with ``mode=ro``; the only write is ``control.json``, and only
  with ``--allow-control`` (the endpoint is absent, 404, without it), by POST with the token;
- no filesystem path ever comes from the browser: static files are a fixed in-memory table and
  everything else is read from SQLite by id;
- responses are JSON (``<``, ``>``, ``&`` escaped) or the fixed static files, with nosniff, a
  strict Content-Security-Policy (no inline script), no CORS headers; NaN/Inf become null.
"""

from __future__ import annotations

import hmac
import http.server
import ipaddress
import json
import secrets
import socket
import sqlite3
import threading
import webbrowser
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

from forge_pack.search import control
from forge_pack.ui import data as ui_data
from forge_pack.core.errors import ForgeError
from forge_pack.store.run_queries import check_readable
from forge_pack.store.run_store import STORE_FILE, check_store, finite, open_readonly

DEFAULT_PORT = 8765
PORT_TRIES = 50  # a busy default port moves up to this many ports on
STATIC_DIR = Path(__file__).parent / "static"
STATIC_FILES = {  # URL path -> (file name, content type); nothing else is ever read from disk
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/app.css": ("app.css", "text/css; charset=utf-8"),
    "/static/icon.svg": ("icon.svg", "image/svg+xml"),
}
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}
MAX_BODY = 4096
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1  # what a SQLite INTEGER parameter can hold



def to_json_bytes(v: Any) -> bytes:
    text = json.dumps(finite(v), allow_nan=False, separators=(",", ":"))
    # JSON is never HTML here, but escaping markup characters keeps a mis-sniffed body inert too.
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").encode()


def _is_loopback_host(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    """'127.0.0.1:8765' -> '127.0.0.1'; '[::1]:80' -> '::1'."""
    header = header.strip()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class UIApp:
    """Routes and policy, independent of the socket (what the handler calls)."""

    def __init__(self, run_dir: str | Path, token: str, allow_control: bool = False, bind_host: str = "127.0.0.1"):
        self.run_dir = Path(run_dir)
        self.token = token
        self.allow_control = allow_control
        self.bind_host = bind_host
        self.static = {path: ((STATIC_DIR / name).read_bytes(), ctype) for path, (name, ctype) in STATIC_FILES.items()}
        self.routes: dict[str, Callable[[sqlite3.Connection, dict], Any]] = {
            "/api/summary": self._summary,
            "/api/progress": lambda c, q: ui_data.progress(c),
            "/api/tree": lambda c, q: ui_data.tree(c, _str(q, "hotspot")),
            "/api/candidates": self._candidates,
            "/api/node": lambda c, q: ui_data.node_detail(c, _int(q, "id")),
            "/api/source": lambda c, q: ui_data.source(c, _int(q, "id")),
            "/api/failures": lambda c, q: ui_data.failures(c, _str(q, "hotspot") or None),
            "/api/events": lambda c, q: ui_data.events(c, _int(q, "after", 0), _int(q, "limit", 1000)),
        }

    def host_allowed(self, header: str | None) -> bool:
        if not header:
            return False
        host = _host_name(header)
        if _is_loopback_host(host):
            return True
        if _is_loopback_host(self.bind_host):
            return False
        try:  # bound to a LAN address or 0.0.0.0: IP literals cannot be rebound
            ipaddress.ip_address(host)
            return True
        except ValueError:
            return host == self.bind_host

    def token_ok(self, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(given.encode(), self.token.encode())

    def _summary(self, conn: sqlite3.Connection, q: dict) -> dict:
        out = ui_data.summary(conn)
        out["control"] = {"allowed": self.allow_control,
                          "current": control.read_control(self.run_dir) if self.allow_control else None}
        return out

    def _candidates(self, conn: sqlite3.Connection, q: dict) -> dict:
        depth = _str(q, "depth")
        return ui_data.candidates(
            conn, hotspot=_str(q, "hotspot") or None, verdict=_str(q, "verdict") or None,
            depth=_int(q, "depth") if depth.lstrip("-").isdigit() else None, best_only=_str(q, "best") in ("1", "true"),
            sort=_str(q, "sort") or "id", desc=_str(q, "dir") == "desc", offset=_int(q, "offset", 0),
            limit=_int(q, "limit", 100))

    def query(self, path: str, q: dict) -> tuple[int, Any]:
        conn = open_readonly(self.run_dir)
        try:
            result = self.routes[path](conn, q)
        finally:
            conn.close()
        return (404, {"error": "not found"}) if result is None else (200, result)


class BadRequest(Exception):
    pass


def _str(q: dict, key: str) -> str:
    v = q.get(key)
    return v[0] if v else ""


def _int(q: dict, key: str, default: int | None = None) -> int:
    v = _str(q, key)
    if not v:
        if default is None:
            raise BadRequest(f"missing parameter {key}")
        return default
    try:
        n = int(v)
    except ValueError:
        raise BadRequest(f"parameter {key} must be an integer")
    if not INT64_MIN <= n <= INT64_MAX:  # SQLite raises OverflowError (not sqlite3.Error) past 64 bits
        raise BadRequest(f"parameter {key} is out of range")
    return n


class Handler(http.server.BaseHTTPRequestHandler):
    app: UIApp  # set on a subclass per server
    server_version = "forge-pack-ui"
    sys_version = ""
    protocol_version = "HTTP/1.1"

    def version_string(self) -> str:
        return self.server_version

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet: URLs may carry the token
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json; charset=utf-8") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Cross-Origin-Resource-Policy", "same-origin")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, to_json_bytes(obj))

    def _gate(self) -> tuple[str, dict] | None:
        """Host check for everything; returns (path, query) or None when a response was sent."""
        if not self.app.host_allowed(self.headers.get("Host")):
            self._json(403, {"error": "host not allowed"})
            return None
        parts = urlsplit(self.path)
        return parts.path, parse_qs(parts.query, keep_blank_values=True)

    def _authorised(self, q: dict) -> bool:
        given = self.headers.get("X-Forge-Token") or _str(q, "token")
        auth = self.headers.get("Authorization", "")
        if not given and auth.startswith("Bearer "):
            given = auth[7:].strip()
        if self.app.token_ok(given):
            return True
        self._json(401, {"error": "token required", "hint": "open the URL that `forge-pack ui` printed"})
        return False

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        gated = self._gate()
        if gated is None:
            return
        path, q = gated
        if path in self.app.static:
            body, ctype = self.app.static[path]
            self._send(200, body, ctype)
            return
        if path not in self.app.routes:
            self._json(404, {"error": "not found"})
            return
        if not self._authorised(q):
            return
        try:
            status, result = self.app.query(path, q)
        except BadRequest as e:
            status, result = 400, {"error": str(e)}
        except sqlite3.Error as e:
            status, result = 503, {"error": f"run store unavailable: {e}"}
        except Exception as e:  # a bug or a store nobody foresaw: an answer, not a dropped connection
            status, result = 500, {"error": f"internal error ({type(e).__name__})"}
        self._json(status, result)

    def do_POST(self) -> None:
        gated = self._gate()
        if gated is None:
            return
        path, q = gated
        if path != "/api/control" or not self.app.allow_control:
            self._json(404, {"error": "not found"})
            return
        if not self._authorised(q):
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 < length <= MAX_BODY or not self.headers.get("Content-Type", "").startswith("application/json"):
            self._json(400, {"error": "expected a small JSON body"})
            return
        try:
            action = json.loads(self.rfile.read(length)).get("action")
        except (ValueError, AttributeError):
            action = None
        if action not in control.ACTIONS:
            self._json(400, {"error": f"action must be one of {', '.join(control.ACTIONS)}"})
            return
        try:
            written = control.write_control(self.app.run_dir, action)
        except Exception as e:  # a full or read-only disk: say so rather than drop the connection
            self._json(500, {"error": f"cannot write the control file ({type(e).__name__})"})
            return
        self._json(200, {"control": written})


class UIServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True  # Linux still refuses a port someone listens on; this only skips TIME_WAIT

    def __init__(self, addr: tuple[str, int], app: UIApp):
        handler = type("BoundHandler", (Handler,), {"app": app})
        family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
        self.address_family = family
        super().__init__(addr, handler)
        self.app = app


def _check_run_dir(run_dir: str | Path) -> Path:
    run_dir = Path(run_dir)
    if not (run_dir / STORE_FILE).is_file():
        raise ForgeError(f"no run store in {run_dir} (run.db is missing)",
                         "pass the run directory that `forge-pack search` or `build` wrote")
    check_store(run_dir)  # empty, truncated, not SQLite: the same error + hint as every other command
    try:
        conn = open_readonly(run_dir)
        check_readable(conn)
        conn.close()
    except sqlite3.Error as e:
        raise ForgeError(f"cannot read the run store {run_dir / 'run.db'}: {e}",
                         "is it a forge-pack run directory, readable by you?")
    return run_dir


def make_server(run_dir: str | Path, host: str = "127.0.0.1", port: int | None = None,
                allow_control: bool = False, token: str | None = None) -> UIServer:
    """Bind the dashboard. port=None: DEFAULT_PORT or the next free one; an explicit port must be free
    (0 asks the OS for any free port)."""
    run_dir = _check_run_dir(run_dir)
    app = UIApp(run_dir, token or secrets.token_urlsafe(24), allow_control, host)
    ports = [port] if port is not None else list(range(DEFAULT_PORT, DEFAULT_PORT + PORT_TRIES))
    last: OSError | None = None
    for p in ports:
        try:
            return UIServer((host, p), app)
        except socket.gaierror as e:
            raise ForgeError(f"cannot listen on --host {host}: {e.strerror}", "use an IP address such as 127.0.0.1")
        except OSError as e:
            last = e
    if port is not None:
        raise ForgeError(f"cannot listen on {host}:{port}: {last.strerror if last else 'busy'}",
                         "choose another --port, or leave it out to take the next free one")
    raise ForgeError(f"no free port on {host} in {ports[0]}..{ports[-1]}", "pass --port P (0 picks any free port)")


def server_url(server: UIServer) -> str:
    host, port = server.server_address[:2]
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    return f"http://{shown}:{port}/#token={server.app.token}"


def banner(server: UIServer) -> str:
    host, port = server.server_address[:2]
    lines = [f"forge-pack ui: {server_url(server)}",
             f"  serving {server.app.run_dir} read-only"
             + (" (pause/resume/stop enabled)" if server.app.allow_control else "")]
    if _is_loopback_host(host):
        lines.append(f"  on a remote GPU box? forward the port from your laptop: ssh -N -L {port}:127.0.0.1:{port}"
                     f" USER@HOST, then open the URL above there")
    else:
        lines.append(f"  warning: listening on {host}, reachable from the network (token-protected, not encrypted);"
                     " prefer the default 127.0.0.1 with ssh -L port forwarding")
    return "\n".join(lines)


def serve(run_dir: str | Path, host: str = "127.0.0.1", port: int | None = None, allow_control: bool = False,
          open_browser: bool = False, echo: Callable[[str], Any] = print) -> None:
    """Serve in the foreground until interrupted (the `forge-pack ui` command)."""
    server = make_server(run_dir, host, port, allow_control)
    echo(banner(server))
    if open_browser:
        webbrowser.open(server_url(server))
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def start_ui_in_background(run_dir: str | Path, host: str = "127.0.0.1", port: int | None = None,
                           allow_control: bool = False, open_browser: bool = False,
                           echo: Callable[[str], Any] | None = None) -> str:
    """Serve the dashboard from a daemon thread of the calling process (`search --ui`, `build --ui`);
    returns the URL with its token. The run store must exist (create the Store first)."""
    server = start_server_thread(run_dir, host, port, allow_control)
    if echo is not None:
        echo(banner(server))
    url = server_url(server)
    if open_browser:
        webbrowser.open(url)
    return url


def start_server_thread(run_dir: str | Path, host: str = "127.0.0.1", port: int | None = None,
                        allow_control: bool = False, token: str | None = None) -> UIServer:
    """Like start_ui_in_background but returns the server (tests call .shutdown())."""
    server = make_server(run_dir, host, port, allow_control, token)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="forge-pack-ui",
                     daemon=True).start()
    return server
