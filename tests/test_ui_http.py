"""The dashboard's HTTP surface: token, Host check, no paths from the browser, read-only unless
--allow-control, JSON that is always valid (no NaN/Inf) and inert (no markup)."""

from __future__ import annotations

import http.client
import json
import math
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from forge_pack.search import control
from forge_pack.ui import server as ui_server
from forge_pack.core.errors import ForgeError
from forge_pack.store.run_store import Store
from ui_fixtures import PAYLOAD, add_markup_node, append_evaluations, make_run

TOKEN = "test-token-123"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ui-run")
    make_run(d, n_candidates=30, seed=3)
    return d


def _serve(run_dir, **kw):
    server = ui_server.start_server_thread(run_dir, port=0, token=TOKEN, **kw)
    return server


@pytest.fixture(scope="module")
def server(run_dir):
    s = _serve(run_dir)
    yield s
    s.shutdown()
    s.server_close()


def request(server, path, method="GET", headers=None, body=None, host=None):
    port = server.server_address[1]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", host if host is not None else f"127.0.0.1:{port}")
        for k, v in (headers or {}).items():
            conn.putheader(k, v)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def api(server, path, **kw):
    headers = dict(kw.pop("headers", {}) or {})
    headers.setdefault("X-Forge-Token", TOKEN)
    status, h, body = request(server, path, headers=headers, **kw)
    return status, h, body


def strict_json(body: bytes):
    """json.loads that refuses NaN and Infinity (what browsers' JSON.parse does)."""
    def bad(c):
        raise ValueError(f"non-JSON constant {c}")
    return json.loads(body, parse_constant=bad)


# ---------------------------------------------------------------- token


def test_api_requires_token(server):
    for headers in ({}, {"X-Forge-Token": "wrong"}, {"X-Forge-Token": ""}, {"Authorization": "Bearer nope"}):
        status, _, body = request(server, "/api/summary", headers=headers)
        assert status == 401, headers
        assert b"hotspots" not in body
    assert request(server, "/api/summary?token=wrong")[0] == 401
    assert api(server, "/api/summary")[0] == 200
    assert request(server, f"/api/summary?token={TOKEN}")[0] == 200
    assert request(server, "/api/summary", headers={"Authorization": f"Bearer {TOKEN}"})[0] == 200


def test_every_api_endpoint_is_token_protected(server):
    for path in ("/api/summary", "/api/progress", "/api/tree?hotspot=x", "/api/candidates", "/api/node?id=1",
                 "/api/source?id=1", "/api/failures", "/api/events?after=0"):
        assert request(server, path)[0] == 401, path
        assert api(server, path)[0] == 200, path


def test_static_page_needs_no_token_and_holds_no_data(server):
    status, h, body = request(server, "/")
    assert status == 200 and h["Content-Type"].startswith("text/html")
    assert TOKEN.encode() not in body and b"softmax" not in body
    assert b"<script src=\"/static/app.js\"" in body and b"<script>" not in body  # no inline script
    for path, ctype in (("/static/app.js", "text/javascript"), ("/static/app.css", "text/css"),
                        ("/static/icon.svg", "image/svg+xml")):
        status, h, _ = request(server, path)
        assert status == 200 and h["Content-Type"].startswith(ctype)


def test_security_headers_and_no_cors(server):
    for path, headers in (("/", {}), ("/api/summary", {"X-Forge-Token": TOKEN}), ("/api/nothing", {})):
        _, h, _ = request(server, path, headers={**headers, "Origin": "http://evil.example"})
        csp = h["Content-Security-Policy"]
        assert "default-src 'self'" in csp and "script-src 'self'" in csp and "unsafe" not in csp
        assert "frame-ancestors 'none'" in csp
        assert h["X-Content-Type-Options"] == "nosniff"
        assert not any(k.lower().startswith("access-control-") for k in h)
    status, h, _ = request(server, "/api/summary", method="OPTIONS",
                           headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "GET"})
    assert status >= 400
    assert not any(k.lower().startswith("access-control-") for k in h)


# ---------------------------------------------------------------- Host header (DNS rebinding)


@pytest.mark.parametrize("host", ["evil.example.com", "evil.example.com:8765", "127.0.0.1.nip.io",
                                  "localhost.evil.com", "10.0.0.5", ""])
def test_foreign_host_refused(server, host):
    for path in ("/", "/static/app.js", "/api/summary"):
        status, h, body = api(server, path, host=host)
        assert status == 403, (host, path)
        assert b"hotspots" not in body


@pytest.mark.parametrize("host", ["localhost", "localhost:1234", "127.0.0.1", "127.0.0.2:80", "[::1]:8765"])
def test_loopback_hosts_accepted(server, host):
    assert api(server, "/api/summary", host=host)[0] == 200


def test_ip_literals_accepted_only_when_bound_beyond_loopback(run_dir):
    app = ui_server.UIApp(run_dir, TOKEN, bind_host="0.0.0.0")
    assert app.host_allowed("192.168.1.20:8765")
    assert not app.host_allowed("evil.example.com")
    assert not ui_server.UIApp(run_dir, TOKEN).host_allowed("192.168.1.20:8765")


# ---------------------------------------------------------------- no paths from the browser


@pytest.mark.parametrize("path", [
    "/run.db", "/static/../run.db", "/static/..%2frun.db", "/%2e%2e/run.db", "/static/%2e%2e/%2e%2e/etc/passwd",
    "/static/app.js/../../run.db", "//etc/passwd", "/static/", "/static/index.html", "/ui_static/app.js",
    "/static/app.js%00.db", "/../../../../etc/passwd", "/api/../run.db", "/control.json",
])
def test_path_traversal_refused(server, path):
    status, _, body = api(server, path)
    assert status == 404
    assert b"SQLite format" not in body and b"root:" not in body


def test_parameters_are_never_paths(server):
    status, _, _ = api(server, "/api/node?id=../../run.db")
    assert status == 400
    status, _, body = api(server, "/api/tree?hotspot=../../../../etc/passwd")
    assert status == 200 and strict_json(body)["nodes"] == []
    status, _, body = api(server, "/api/source?id=999999")
    assert status == 404


# ---------------------------------------------------------------- control


def test_control_endpoint_absent_without_flag(server, run_dir):
    body = json.dumps({"action": "stop"}).encode()
    for method in ("POST", "GET"):
        status, _, _ = api(server, "/api/control", method=method, body=body if method == "POST" else None,
                           headers={"Content-Type": "application/json"})
        assert status == 404
    assert not (run_dir / control.CONTROL_FILE).exists()
    summary = strict_json(api(server, "/api/summary")[2])
    assert summary["control"] == {"allowed": False, "current": None}


def test_control_with_flag_writes_control_file(tmp_path):
    make_run(tmp_path, n_candidates=6, running=True)
    server = _serve(tmp_path, allow_control=True)
    try:
        body = json.dumps({"action": "pause"}).encode()
        json_ct = {"Content-Type": "application/json"}
        assert request(server, "/api/control", "POST", json_ct, body)[0] == 401  # token still required
        assert api(server, "/api/control", method="POST", host="evil.example.com", headers=json_ct,
                   body=body)[0] == 403
        assert api(server, "/api/control", method="POST", headers={"Content-Type": "text/plain"},
                   body=body)[0] == 400  # a plain form post cannot trigger it
        assert api(server, "/api/control", method="POST", headers=json_ct,
                   body=b'{"action": "rm -rf"}')[0] == 400
        assert not (tmp_path / "control.json").exists()
        status, _, out = api(server, "/api/control", method="POST", headers=json_ct, body=body)
        assert status == 200 and strict_json(out)["control"]["action"] == "pause"
        assert control.read_control(tmp_path)["action"] == "pause"
        assert strict_json(api(server, "/api/summary")[2])["control"]["current"]["action"] == "pause"
        for action in ("resume", "stop"):
            api(server, "/api/control", method="POST", headers=json_ct, body=json.dumps({"action": action}).encode())
            assert control.read_control(tmp_path)["action"] == action
        assert api(server, "/api/control", method="GET")[0] == 404  # POST only
    finally:
        server.shutdown()
        server.server_close()


def test_read_control_ignores_stale_and_malformed(tmp_path):
    assert control.read_control(tmp_path) is None
    control.write_control(tmp_path, "pause")
    assert control.read_control(tmp_path, since=time.time() + 10) is None
    (tmp_path / "control.json").write_text("{not json")
    assert control.read_control(tmp_path) is None
    with pytest.raises(ValueError):
        control.write_control(tmp_path, "explode")


# ---------------------------------------------------------------- JSON safety

def test_nan_and_inf_serialised_as_null(tmp_path):
    make_run(tmp_path, n_candidates=6)
    nid = add_markup_node(tmp_path)
    server = _serve(tmp_path)
    try:
        hid = strict_json(api(server, "/api/summary")[2])["hotspots"][0]["id"]
        for path in ("/api/summary", "/api/progress", f"/api/tree?hotspot={hid}", "/api/candidates?sort=speedup",
                     f"/api/node?id={nid}", "/api/failures", "/api/events?after=0"):
            status, _, body = api(server, path)
            assert status == 200, path
            assert not re.search(rb"\bNaN\b|\bInfinity\b", body), path
            strict_json(body)
        node = strict_json(api(server, f"/api/node?id={nid}")[2])
        assert node["evaluation"]["timing"]["median_us"] is None
        assert node["evaluation"]["speedup_vs_eager"] is None
        assert node["evaluation"]["verdict"]["checks"][0]["max_abs_err"] is None
        assert node["llm_calls"][0]["cost_usd"] is None
        row = next(r for r in strict_json(api(server, "/api/candidates?limit=500")[2])["items"] if r["id"] == nid)
        assert row["median_us"] is None and row["speedup_vs_eager"] is None and row["iqr_us"] is None
    finally:
        server.shutdown()
        server.server_close()


def test_html_payload_in_kernel_source_is_served_inert(tmp_path):
    make_run(tmp_path, n_candidates=6)
    nid = add_markup_node(tmp_path)
    server = _serve(tmp_path)
    try:
        for path in (f"/api/node?id={nid}", f"/api/source?id={nid}", "/api/candidates", "/api/failures"):
            status, h, body = api(server, path)
            assert status == 200
            assert h["Content-Type"] == "application/json; charset=utf-8"
            assert h["X-Content-Type-Options"] == "nosniff"
            assert b"<" not in body and b">" not in body  # markup characters leave escaped (\u003c)
        node = strict_json(api(server, f"/api/node?id={nid}")[2])
        assert PAYLOAD in node["candidate"]["source"]  # round-trips exactly: shown as text, not dropped
        assert node["move"].startswith("move <b>bold</b>")
        assert node["llm_calls"][0]["reply"] == PAYLOAD
    finally:
        server.shutdown()
        server.server_close()


def test_front_end_never_parses_data_as_html():
    js = (Path(ui_server.STATIC_DIR) / "app.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                 "createContextualFragment", "DOMParser", "srcdoc"):
        assert sink not in js, sink
    html = (Path(ui_server.STATIC_DIR) / "index.html").read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)", html)  # no inline script
    assert not re.search(r"\son[a-z]+=", html)  # no inline handlers
    assert "http://" not in html.replace('xmlns="http://www.w3.org', "") and "https://" not in html
    assert "https://" not in js and "http://" not in js.replace("http://www.w3.org/2000/svg", "")


# ---------------------------------------------------------------- live cursor, ports, CLI


def test_events_cursor_returns_only_new_events(tmp_path):
    info = make_run(tmp_path, n_candidates=6, running=True)
    server = _serve(tmp_path)
    try:
        cur = strict_json(api(server, "/api/summary")[2])["cursor"]
        assert strict_json(api(server, f"/api/events?after={cur}")[2])["events"] == []
        new = append_evaluations(tmp_path, info["hotspots"][0], 2)
        ev = strict_json(api(server, f"/api/events?after={cur}")[2])
        done = [e for e in ev["events"] if e[2] == "eval_done"]
        assert [e[4] for e in done] == new
        assert ev["cursor"] > cur
        assert strict_json(api(server, f"/api/events?after={ev['cursor']}")[2])["events"] == []
    finally:
        server.shutdown()
        server.server_close()


def test_busy_default_port_moves_on_and_explicit_busy_port_fails(run_dir, monkeypatch):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    busy = holder.getsockname()[1]
    try:
        with pytest.raises(ForgeError) as err:
            ui_server.make_server(run_dir, port=busy)
        assert str(busy) in err.value.message and "--port" in err.value.hint
        monkeypatch.setattr(ui_server, "DEFAULT_PORT", busy)
        s = ui_server.make_server(run_dir)
        try:
            assert s.server_address[1] > busy
        finally:
            s.server_close()
    finally:
        holder.close()


def test_missing_run_store_is_a_user_error(tmp_path):
    with pytest.raises(ForgeError) as err:
        ui_server.make_server(tmp_path / "nope")
    assert "run.db" in err.value.message


def test_banner_has_token_url_and_ssh_hint(server):
    text = ui_server.banner(server)
    port = server.server_address[1]
    assert f"http://127.0.0.1:{port}/#token={TOKEN}" in text
    assert f"ssh -N -L {port}:127.0.0.1:{port}" in text


def test_start_ui_in_background_returns_working_url(run_dir):
    url = ui_server.start_ui_in_background(run_dir, port=0)
    m = re.match(r"http://127\.0\.0\.1:(\d+)/#token=([\w-]+)$", url)
    assert m
    conn = http.client.HTTPConnection("127.0.0.1", int(m.group(1)), timeout=5)
    conn.request("GET", "/api/summary", headers={"X-Forge-Token": m.group(2)})
    assert conn.getresponse().status == 200
    conn.close()


def test_cli_ui_prints_url_and_serves(run_dir, forge_cmd, cli_env):
    proc = subprocess.Popen([*forge_cmd, "ui", str(run_dir), "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cli_env)
    try:
        line = proc.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/#token=([\w-]+)", line)
        assert m, line + proc.stderr.read() if proc.poll() is not None else line
        conn = http.client.HTTPConnection("127.0.0.1", int(m.group(1)), timeout=5)
        conn.request("GET", "/api/summary", headers={"X-Forge-Token": m.group(2)})
        r = conn.getresponse()
        assert r.status == 200 and strict_json(r.read())["evaluations"] == 30
        assert "ssh -N -L" in proc.stdout.readline() + proc.stdout.readline()
    finally:
        proc.terminate()
        proc.wait(10)


def test_cli_ui_explicit_busy_port_is_an_error(run_dir, forge_cmd, cli_env):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    try:
        r = subprocess.run([*forge_cmd, "ui", str(run_dir), "--port", str(holder.getsockname()[1])],
                           capture_output=True, text=True, env=cli_env, timeout=60)
        assert r.returncode == 1
        assert r.stderr.startswith("error: cannot listen on") and "hint:" in r.stderr
    finally:
        holder.close()


# ---------------------------------------------------------------- scale


@pytest.mark.slow
def test_scale_5000_candidates_summary_small_and_fast(tmp_path):
    make_run(tmp_path, n_candidates=5000, seed=1)
    server = _serve(tmp_path)
    try:
        sizes, times = {}, {}
        hid = strict_json(api(server, "/api/summary")[2])["hotspots"][0]["id"]
        for name, path in (("summary", "/api/summary"), ("candidates", "/api/candidates"),
                           ("best", "/api/candidates?best=1"), ("failures", "/api/failures"),
                           ("tree", f"/api/tree?hotspot={hid}"), ("progress", "/api/progress"),
                           ("node", "/api/node?id=2500")):
            t = time.perf_counter()
            status, _, body = api(server, path)
            times[name] = time.perf_counter() - t
            assert status == 200
            sizes[name] = len(body)
        assert strict_json(api(server, "/api/summary")[2])["evaluations"] == 5000
        assert sizes["summary"] < 20_000 and sizes["candidates"] < 80_000 and sizes["failures"] < 30_000
        assert sizes["progress"] < 400_000 and sizes["tree"] < 400_000  # one hotspot's tree only
        assert max(times.values()) < 5.0, times  # ~0.1 s each on an idle 2-core box; loose for loaded CI
    finally:
        server.shutdown()
        server.server_close()


def test_running_run_without_heartbeat_is_shown_stalled(tmp_path):
    from forge_pack.ui import data as ui_data
    from forge_pack.store.run_store import open_readonly

    make_run(tmp_path, n_candidates=4, running=True)
    conn = open_readonly(tmp_path)
    try:
        assert ui_data.summary(conn)["run"]["state"] == "running"
        later = time.time() + ui_data.STALE_AFTER_S + 5
        run = ui_data.summary(conn, now=later)["run"]
        assert run["status"] == "running" and run["state"] == "stalled"
    finally:
        conn.close()


# ---------------------------------------------------------------- errors found in review


@pytest.mark.parametrize("path", [
    "/api/node?id=99999999999999999999999", "/api/source?id=-99999999999999999999999",
    "/api/events?after=9223372036854775808", "/api/events?after=0&limit=99999999999999999999",
    "/api/candidates?offset=99999999999999999999", "/api/candidates?limit=99999999999999999999",
    "/api/candidates?depth=99999999999999999999",
])
def test_integers_past_64_bits_are_a_400_not_a_dropped_connection(server, path):
    status, h, body = api(server, path)
    assert status == 400 and "out of range" in strict_json(body)["error"]
    assert h["Content-Type"] == "application/json; charset=utf-8"
    status, _, _ = api(server, "/api/events?after=9223372036854775807")  # the largest 64-bit value is fine
    assert status == 200


def test_unexpected_error_is_a_500_json_answer(server, monkeypatch):
    from forge_pack.ui import data as ui_data

    def broken(conn, *a, **kw):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(ui_data, "progress", broken)
    status, h, body = api(server, "/api/progress")
    assert status == 500 and strict_json(body)["error"] == "internal error (ZeroDivisionError)"
    assert h["X-Content-Type-Options"] == "nosniff"
    monkeypatch.undo()
    assert api(server, "/api/progress")[0] == 200  # the server is still serving


def test_rejected_duplicate_reply_is_not_shown_as_producing_the_candidate(tmp_path):
    make_run(tmp_path, n_candidates=8)
    with Store(tmp_path) as store:
        hid = store.hotspots()[0]["id"]
        first, other = store.nodes(hid)[:2]
        store.record_llm_call(hotspot_id=hid, node_id=other["id"], model="m", purpose="rewrite", prompt="p",
                              reply="the same kernel again", outcome="duplicate", cand_hash=first["cand_hash"],
                              error="the reply repeats a kernel already in the tree")
    server = _serve(tmp_path)
    try:
        node = strict_json(api(server, f"/api/node?id={first['id']}")[2])
        assert not any(c["outcome"] == "duplicate" for c in node["llm_calls"])
        expanded = strict_json(api(server, f"/api/node?id={other['id']}")[2])
        (dup,) = [c for c in expanded["llm_calls"] if c["outcome"] == "duplicate"]
        assert dup["relation"] == "made while expanding this node"
    finally:
        server.shutdown()
        server.server_close()


def test_summary_counts_a_search_that_ran_dry_as_complete(tmp_path):
    """A hotspot whose proposers ran dry after fewer evaluations than its budget: its budget and the
    header's total become what ran, so the dashboard's bars end full; the planned budget stays."""
    import sqlite3

    from forge_pack.ui import data

    make_run(tmp_path, n_candidates=12, seed=3, hotspots=2)
    conn = sqlite3.connect(tmp_path / "run.db")
    conn.row_factory = sqlite3.Row
    try:
        hid = conn.execute("SELECT id FROM hotspots ORDER BY rank LIMIT 1").fetchone()[0]
        conn.execute("UPDATE hotspots SET stop_reason='exhausted' WHERE id=?", (hid,))
        conn.commit()
        s = data.summary(conn)
    finally:
        conn.close()
    dry = next(h for h in s["hotspots"] if h["id"] == hid)
    other = next(h for h in s["hotspots"] if h["id"] != hid)
    assert dry["budget"] == dry["evaluations"] == 6 and dry["planned_budget"] == 50
    assert dry["stop_reason"] == "exhausted" and other["budget"] == other["planned_budget"] == 50
    assert s["budget"] == 6 + 50
