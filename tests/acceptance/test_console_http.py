"""The web console over plain HTTP (aiohttp's client) against a real server: pages, filters, actions, security.

The server runs as a subprocess with `--http-listen 127.0.0.1:0`; runs are made and moved
through an Engine on the same database (as a worker would), and every assertion reads what
the console answers. The browser tests (test_console_browser.py) drive the same pages in
Chromium.
"""

from __future__ import annotations

import re
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
import pytest

from cyclone_server.store.engine import Engine

from console_helpers import (ADMIN_TOKEN, SUBMIT_TOKEN, WORKER_TOKEN, csrf_of, http_url, node_states,
                             start_console_server)
from test_auth import certs  # noqa: F401  (the session fixture: a CA and a server certificate)

HOSTILE = "<script>window.__pwned = 1</script><img src=x onerror=alert(1)>"


@pytest.fixture
def console(start_server: Callable[..., Any], db_url: str, tmp_path: Path) -> str:
    return start_console_server(start_server, db_url, tmp_path)[1]


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    # A cookie jar that keeps cookies of an IP address host (the CSRF cookie of 127.0.0.1).
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as s:
        yield s


async def get(http: aiohttp.ClientSession, url: str, **kw: Any) -> tuple[int, str]:
    async with http.get(url, allow_redirects=False, **kw) as r:
        return r.status, await r.text()


async def post(http: aiohttp.ClientSession, url: str, data: dict[str, str], **kw: Any) -> tuple[int, str]:
    async with http.post(url, data=data, allow_redirects=False, **kw) as r:
        return r.status, await r.text()


async def register(engine: Engine) -> None:
    await engine.register_workflow("etl", [
        {"id": "extract", "kind": "extract"},
        {"id": "transform", "kind": "transform", "deps": ["extract"]},
        {"id": "approve", "type": "signal", "signal": "approval", "deps": ["transform"]},
        {"id": "nap", "type": "sleep", "sleep": 30, "deps": ["transform"]},
        {"id": "load", "kind": "load", "deps": ["approve", "nap"]},
    ])


async def complete(engine: Engine, kind: str, output: Any = None) -> None:
    (lease,) = await engine.claim("test-worker", [kind], 1, 30)
    assert await engine.complete(str(lease["step_id"]), lease["lease_generation"], output) == "applied"


async def test_healthz_and_metrics_share_the_console_port(console: str, http: aiohttp.ClientSession) -> None:
    assert await get(http, console + "/healthz") == (200, "ok\n")
    async with http.get(console + "/metrics") as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        text = await r.text()
    assert "# TYPE cyclone_claims_total counter" in text
    assert re.search(r"^cyclone_connected_workers 0\.0$", text, re.M)


async def test_runs_page_lists_runs_with_state_workflow_and_progress(console: str, http: aiohttp.ClientSession,
                                                                   engine: Engine) -> None:
    await register(engine)
    run_id, _ = await engine.submit_run("etl", input={"day": 1})
    await complete(engine, "extract")
    job_id, _, _ = await engine.enqueue("emails.send", input={"to": "a@example.com"})
    status, html = await get(http, console + "/runs")
    assert status == 200
    row = re.search(rf'<tr data-run="{run_id}" data-state="running">(.*?)</tr>', html, re.S)
    assert row, html
    assert "etl" in row.group(1) and "1/5" in row.group(1)
    job = re.search(rf'<tr data-run="{job_id}" data-state="running">(.*?)</tr>', html, re.S)
    assert job and "emails.send" in job.group(1) and "0/1" in job.group(1)
    assert html.index(job_id) < html.index(run_id), "newest first"


async def test_runs_filters_by_state_workflow_id_prefix_and_time(console: str, http: aiohttp.ClientSession,
                                                               engine: Engine) -> None:
    await register(engine)
    a, _ = await engine.submit_run("etl", input=1)
    b, _ = await engine.submit_run("etl", input=2)
    job, _, _ = await engine.enqueue("solo")
    await engine.cancel_run(b)

    async def listed(query: str) -> set[str]:
        status, html = await get(http, console + "/runs?" + query)
        assert status == 200, html
        return set(re.findall(r'<tr data-run="([0-9a-f-]{36})"', html))

    assert await listed("") == {a, b, job}
    assert await listed("state=cancelled") == {b}
    assert await listed("state=running") == {a, job}
    assert await listed("workflow=etl") == {a, b}
    # Run ids are UUIDv7 (time first): the shortest prefix of `a` that no other run shares.
    n = next(n for n in range(1, 37) if not b.startswith(a[:n]) and not job.startswith(a[:n]))
    assert await listed(f"id={a[:n]}") == {a}
    assert await listed(f"id={a[:n - 1]}") == {a} | {r for r in (b, job) if r.startswith(a[:n - 1])}
    assert await listed(f"id={a}") == {a}
    assert await listed("from=2000-01-01T00:00&to=2001-01-01T00:00") == set()
    assert await listed("from=2000-01-01T00:00") == {a, b, job}
    status, html = await get(http, console + "/runs?id=xyz")
    assert status == 200 and "id_prefix: &#39;xyz&#39; is not the beginning of a run id" in html
    status, html = await get(http, console + "/runs?state=bogus")
    assert "state: &#39;bogus&#39; is not a run state" in html


async def test_runs_are_paged_newest_first(console: str, http: aiohttp.ClientSession, engine: Engine) -> None:
    ids = [(await engine.enqueue("paged", input=i))[0] for i in range(53)]
    status, html = await get(http, console + "/runs")
    first = re.findall(r'<tr data-run="([0-9a-f-]{36})"', html)
    assert first == ids[::-1][:50]
    nxt = re.search(r'<a href="([^"]+)" id="next-page">', html)
    assert nxt
    status, html = await get(http, console + nxt.group(1).replace("&amp;", "&"))
    assert status == 200
    assert re.findall(r'<tr data-run="([0-9a-f-]{36})"', html) == ids[::-1][50:]
    assert 'id="next-page"' not in html and 'id="first-page"' in html


async def test_run_page_shows_dag_states_wait_nodes_steps_and_input(console: str, http: aiohttp.ClientSession,
                                                                   engine: Engine) -> None:
    await register(engine)
    run_id, _ = await engine.submit_run("etl", input={"day": "2026-12-03"})
    await complete(engine, "extract", {"rows": 3})
    (lease,) = await engine.claim("worker-7", ["transform"], 1, 30)
    assert await engine.fail(str(lease["step_id"]), lease["lease_generation"], "Traceback: boom",
                             retry_delay=0) == "retried"
    (lease,) = await engine.claim("worker-7", ["transform"], 1, 30)
    status, html = await get(http, f"{console}/runs/{run_id}")
    assert status == 200
    assert node_states(html) == {"extract": "completed", "transform": "running", "approve": "pending",
                                 "nap": "pending", "load": "pending"}
    assert 'class="node type-signal state-pending wait"' in html and 'class="node type-sleep state-pending wait"' in html
    step = re.search(r'<tr data-node="transform" data-state="running">(.*?)</tr>', html, re.S)
    assert step and "2/25" in step.group(1) and "worker-7" in step.group(1)
    assert "Traceback: boom" in step.group(1) and "attempt 1" in step.group(1)
    assert "&#34;rows&#34;: 3" in html  # extract's output, escaped JSON
    assert "&#34;day&#34;: &#34;2026-12-03&#34;" in html
    assert 'data-terminal="false"' in html and 'data-live-url="/runs/' in html
    async with http.get(f"{console}/runs/{run_id}/live") as r:
        live = await r.json()
    assert live["state"] == "running" and live["terminal"] is False
    assert node_states(live["parts"]["graph"])["transform"] == "running"
    assert set(live["parts"]) == {"summary", "actions", "graph", "steps", "timeline", "io"}


async def test_child_node_links_to_its_child_run(console: str, http: aiohttp.ClientSession, engine: Engine) -> None:
    await engine.register_workflow("inner", [{"id": "work", "kind": "work"}])
    await engine.register_workflow("outer", [{"id": "kid", "type": "child", "workflow": "inner"}])
    run_id, _ = await engine.submit_run("outer")
    child = None
    for _ in range(200):
        run = await engine.get_run(run_id)
        child = run["steps"][0]["child_run_id"]
        if child:
            break
        await engine.settle_children()
    assert child
    status, html = await get(http, f"{console}/runs/{run_id}")
    assert f'<a href="/runs/{child}" class="child-link">' in html
    assert node_states(html) == {"kid": "waiting_child"}
    status, html = await get(http, f"{console}/runs/{child}")
    assert f'<a href="/runs/{run_id}">' in html  # the parent run, from the child's page


async def test_hostile_payloads_are_escaped_everywhere(console: str, http: aiohttp.ClientSession,
                                                     engine: Engine) -> None:
    job, _, _ = await engine.enqueue("hostile", input={"x": HOSTILE})
    (lease,) = await engine.claim("w", ["hostile"], 1, 30)
    await engine.fail(str(lease["step_id"]), lease["lease_generation"], HOSTILE, permanent=True)
    for page in (f"/runs/{job}", "/runs", f"/runs/{job}/live"):
        status, html = await get(http, console + page)
        assert status == 200
        assert "<script>window" not in html and "<img src=x" not in html, page
    status, html = await get(http, f"{console}/runs/{job}")
    assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in html
    assert "<script" not in html.replace('<script src="/static/console.js" defer></script>', "")


async def test_actions_confirm_then_apply_and_show_refusals_in_words(console: str, http: aiohttp.ClientSession,
                                                                     engine: Engine) -> None:
    await register(engine)
    run_id, _ = await engine.submit_run("etl")
    status, html = await get(http, f"{console}/runs/{run_id}")
    csrf = csrf_of(html)
    url = f"{console}/runs/{run_id}/actions"
    # First POST: a confirmation page; nothing happened yet.
    status, html = await post(http, f"{url}/pause", {"csrf": csrf})
    assert status == 200 and "Yes, pause run" in html and 'name="confirm" value="yes"' in html
    assert (await engine.get_run(run_id, steps=False))["state"] == "running"
    status, html = await post(http, f"{url}/pause", {"csrf": csrf, "confirm": "yes"})
    assert status == 200 and "Pause run: done. The run is now paused." in html
    assert (await engine.get_run(run_id, steps=False))["state"] == "paused"
    status, html = await post(http, f"{url}/pause", {"csrf": csrf, "confirm": "yes"})
    assert status == 200 and "Pause run: nothing to do, the server left the run as it was (paused)." in html
    status, html = await post(http, f"{url}/resume", {"csrf": csrf, "confirm": "yes"})
    assert status == 200 and "The run is now running." in html
    status, html = await post(http, f"{url}/resume", {"csrf": csrf, "confirm": "yes"})
    assert status == 409
    assert re.search(r"Resume run: refused by the server \(FAILED_PRECONDITION\): run \S+ is running: only a paused "
                     r"run can be resumed", html)
    status, html = await post(http, f"{url}/retry-step", {"csrf": csrf, "confirm": "yes", "node": "extract"})
    assert status == 409 and "only a discarded step can be retried" in html
    status, html = await post(http, f"{url}/retry-all", {"csrf": csrf, "confirm": "yes"})
    assert status == 409 and "has no discarded step to retry" in html
    status, html = await post(http, f"{url}/signal", {"csrf": csrf, "confirm": "yes", "name": "approval",
                                                      "payload": "{not json"})
    assert status == 400 and "payload: not JSON" in html
    status, html = await post(http, f"{url}/signal", {"csrf": csrf, "name": "approval", "payload": '{"ok": true}'})
    assert status == 200 and "Yes, send signal" in html and '{&#34;ok&#34;: true}' in html  # shown as typed
    status, html = await post(http, f"{url}/signal", {"csrf": csrf, "name": "approval", "payload": "[1,"})
    assert status == 400 and "Send signal: refused by the server (INVALID_ARGUMENT): payload: not JSON" in html
    assert "Yes, send signal" not in html  # a payload that cannot be sent is refused before the confirmation
    status, html = await post(http, f"{url}/signal", {"csrf": csrf, "confirm": "yes", "name": "approval",
                                                      "payload": '{"ok": true}'})
    assert status == 200 and "signal &#39;approval&#39; delivered" in html and "mailbox" in html
    status, html = await post(http, f"{url}/cancel", {"csrf": csrf, "confirm": "yes"})
    assert status == 200 and "Cancel run: done. The run is now cancelled." in html
    assert set(node_states(html).values()) == {"cancelled"}
    status, html = await post(http, f"{url}/cancel", {"csrf": csrf, "confirm": "yes"})
    assert status == 200 and "nothing to do" in html
    status, html = await post(http, f"{url}/pause", {"csrf": csrf, "confirm": "yes"})
    assert status == 409 and "only a running run can be paused" in html


async def test_retry_step_from_the_console_reopens_a_discarded_step(console: str, http: aiohttp.ClientSession,
                                                                    engine: Engine) -> None:
    job, _, _ = await engine.enqueue("flaky")
    (lease,) = await engine.claim("w", ["flaky"], 1, 30)
    await engine.fail(str(lease["step_id"]), lease["lease_generation"], "no", permanent=True)
    status, html = await get(http, f"{console}/runs/{job}")
    assert 'class="retry-step"' in html and node_states(html) == {"flaky": "discarded"}
    status, html = await post(http, f"{console}/runs/{job}/actions/retry-step",
                              {"csrf": csrf_of(html), "confirm": "yes", "node": "flaky"})
    assert status == 200 and "Retry step: done. The run is now running." in html
    assert node_states(html) == {"flaky": "available"}


async def test_posts_without_the_csrf_token_or_from_another_site_are_refused(console: str,
                                                                           http: aiohttp.ClientSession,
                                                                           engine: Engine) -> None:
    job, _, _ = await engine.enqueue("k")
    status, html = await get(http, f"{console}/runs/{job}")
    csrf = csrf_of(html)
    url = f"{console}/runs/{job}/actions/cancel"
    status, html = await post(http, url, {"confirm": "yes"})
    assert status == 403 and "CSRF token is missing" in html
    status, html = await post(http, url, {"confirm": "yes", "csrf": "x" * 43})
    assert status == 403 and "does not match" in html
    status, html = await post(http, url, {"confirm": "yes", "csrf": csrf}, headers={"Origin": "http://evil.example"})
    assert status == 403 and "another site" in html
    async with aiohttp.ClientSession() as stranger:  # no cookie: a token copied from a page is not enough
        status, html = await post(stranger, url, {"confirm": "yes", "csrf": csrf})
        assert status == 403
    assert (await engine.get_run(job, steps=False))["state"] == "running"
    status, html = await post(http, url, {"confirm": "yes", "csrf": csrf}, headers={"Origin": console})
    assert status == 200 and (await engine.get_run(job, steps=False))["state"] == "cancelled"


async def test_workflows_and_workers_pages(console: str, http: aiohttp.ClientSession, engine: Engine) -> None:
    await register(engine)
    await engine.register_workflow("etl", [{"id": "only", "kind": "extract"}])  # version 2
    await engine.submit_run("etl")
    await engine.enqueue("backlogged")
    await engine.enqueue("busy")
    await engine.claim("w", ["busy"], 1, 30)
    status, html = await get(http, console + "/workflows")
    assert status == 200
    assert '<a href="/workflows/etl?version=1">v1</a>' in html and '<a href="/workflows/etl?version=2">v2</a>' in html
    assert node_states(html) == {"only": ""}  # the latest version's graph
    status, html = await get(http, console + "/workflows/etl?version=1")
    assert status == 200 and set(node_states(html)) == {"extract", "transform", "approve", "nap", "load"}
    assert "signal approval" in html
    status, html = await get(http, console + "/workflows/nope")
    assert status == 404 and "is not registered" in html
    status, html = await get(http, console + "/workers")
    assert status == 200
    rows = dict(re.findall(r'<tr data-kind="([^"]+)"( class="stalled")?>', html))
    assert rows == {"backlogged": ' class="stalled"', "busy": "", "extract": ' class="stalled"'}


async def test_unknown_run_is_404(console: str, http: aiohttp.ClientSession) -> None:
    status, html = await get(http, console + "/runs/00000000-0000-0000-0000-000000000000")
    assert status == 404 and "not found" in html
    status, html = await get(http, console + "/runs/not-an-id")
    assert status == 404 and "is not a valid id" in html


# -- with tokens ---------------------------------------------------------------------


@pytest.fixture
def secured(start_server: Callable[..., Any], db_url: str, tmp_path: Path) -> str:
    return start_console_server(start_server, db_url, tmp_path, tokens=True)[1]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_with_tokens_pages_need_a_reader_token(secured: str, http: aiohttp.ClientSession) -> None:
    status, _ = await get(http, secured + "/runs?state=running")
    assert status == 303
    async with http.get(secured + "/runs?state=running", allow_redirects=False) as r:
        location = urlsplit(r.headers["Location"])
        assert location.path == "/login" and parse_qs(location.query) == {"next": ["/runs?state=running"]}
    assert (await get(http, secured + "/healthz"))[0] == 200  # probes and scrapers need no token
    assert (await get(http, secured + "/metrics"))[0] == 200
    assert (await get(http, secured + "/runs", headers=bearer(SUBMIT_TOKEN)))[0] == 200
    assert (await get(http, secured + "/runs", headers=bearer(ADMIN_TOKEN)))[0] == 200
    status, html = await get(http, secured + "/runs", headers=bearer(WORKER_TOKEN))
    assert status == 403 and "needs the role submit or admin" in html
    status, html = await get(http, secured + "/runs", headers=bearer("unknown-token-0123456789"))
    assert status == 401 and "not known" in html


async def test_sign_in_keeps_the_token_in_an_http_only_cookie(secured: str, http: aiohttp.ClientSession) -> None:
    status, html = await get(http, secured + "/login?next=/workflows")
    assert status == 200
    csrf = csrf_of(html)
    status, html = await post(http, secured + "/login", {"csrf": csrf, "token": "wrong-token-0123456789",
                                                         "next": "/workflows"})
    assert status == 401 and "not known to this server" in html
    async with http.post(secured + "/login", data={"csrf": csrf, "token": SUBMIT_TOKEN, "next": "/workflows"},
                         allow_redirects=False) as r:
        assert r.status == 303 and r.headers["Location"] == "/workflows"
        cookie = r.headers["Set-Cookie"]
    assert "cyclone_token=" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert "Secure" not in cookie  # plain HTTP: a Secure cookie would never come back
    async with aiohttp.ClientSession() as behind_tls_proxy:
        async with behind_tls_proxy.post(secured + "/login", data={"token": SUBMIT_TOKEN, "csrf": "c" * 43},
                                         headers={"X-Forwarded-Proto": "https", "Cookie": "cyclone_csrf=" + "c" * 43},
                                         allow_redirects=False) as r:
            assert r.status == 303
            assert "Secure" in r.headers["Set-Cookie"] and "HttpOnly" in r.headers["Set-Cookie"]
    assert (await get(http, secured + "/workflows"))[0] == 200
    async with http.post(secured + "/login", data={"csrf": csrf, "token": SUBMIT_TOKEN, "next": "//evil.example"},
                         allow_redirects=False) as r:
        assert r.headers["Location"] == "/runs"  # never off-site
    status, _ = await post(http, secured + "/logout", {"csrf": csrf})
    assert status == 303
    assert (await get(http, secured + "/workflows"))[0] == 303


async def test_with_tokens_actions_need_admin(secured: str, http: aiohttp.ClientSession, engine: Engine) -> None:
    job, _, _ = await engine.enqueue("k")
    status, html = await get(http, f"{secured}/login")
    csrf = csrf_of(html)
    await post(http, secured + "/login", {"csrf": csrf, "token": SUBMIT_TOKEN, "next": "/runs"})
    status, html = await get(http, f"{secured}/runs/{job}")
    assert status == 200 and 'id="actions"' not in html  # no buttons for a reader
    status, html = await post(http, f"{secured}/runs/{job}/actions/cancel", {"csrf": csrf, "confirm": "yes"})
    assert status == 403 and "needs the role admin" in html
    assert (await engine.get_run(job, steps=False))["state"] == "running"
    await post(http, secured + "/login", {"csrf": csrf, "token": ADMIN_TOKEN, "next": "/runs"})
    status, html = await get(http, f"{secured}/runs/{job}")
    assert 'id="actions"' in html
    status, html = await post(http, f"{secured}/runs/{job}/actions/cancel", {"confirm": "yes"})
    assert status == 403 and "CSRF" in html  # the cookie authenticates: the form needs its token
    status, html = await post(http, f"{secured}/runs/{job}/actions/cancel", {"csrf": csrf, "confirm": "yes"})
    assert status == 200 and "The run is now cancelled." in html
    # A bearer header carries no ambient credential: no CSRF token needed.
    job2, _, _ = await engine.enqueue("k")
    async with aiohttp.ClientSession() as api:
        status, html = await post(api, f"{secured}/runs/{job2}/actions/cancel", {"confirm": "yes"},
                                  headers=bearer(SUBMIT_TOKEN))
        assert status == 403
        status, html = await post(api, f"{secured}/runs/{job2}/actions/cancel", {"confirm": "yes"},
                                  headers=bearer(ADMIN_TOKEN))
        assert status == 200 and "The run is now cancelled." in html


def test_console_without_tokens_is_refused_on_a_non_loopback_address(db_url: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "cyclone_server", "--database-url", db_url,
                           "--http-listen", "0.0.0.0:0"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--http-listen: refusing to serve the web console on 0.0.0.0 without tokens" in proc.stderr


async def test_with_tls_the_console_port_serves_https_and_secure_cookies(start_server: Callable[..., Any],
                                                                         db_url: str, tmp_path: Path,
                                                                         certs: Path) -> None:
    srv, plain_url = start_console_server(start_server, db_url, tmp_path, tokens=True, extra_args=[
        "--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key")])
    url = plain_url.replace("http://", "https://")
    trust = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True),
                                     connector=aiohttp.TCPConnector(ssl=trust)) as https:
        assert await get(https, url + "/healthz") == (200, "ok\n")
        status, html = await get(https, url + "/login")
        async with https.post(url + "/login", data={"csrf": csrf_of(html), "token": ADMIN_TOKEN, "next": "/runs"},
                              allow_redirects=False) as r:
            assert r.status == 303
            cookie = r.headers["Set-Cookie"]
        assert "cyclone_token=" in cookie and "Secure" in cookie and "HttpOnly" in cookie
        assert (await get(https, url + "/runs"))[0] == 200
    async with aiohttp.ClientSession() as plain:  # plain HTTP to the TLS port gets no page
        with pytest.raises(aiohttp.ClientError):
            await get(plain, plain_url + "/healthz")


async def test_retry_all_reopens_a_failed_run_and_a_large_dag_is_listed_not_drawn(console: str,
                                                                                  http: aiohttp.ClientSession,
                                                                                  engine: Engine) -> None:
    job, _, _ = await engine.enqueue("fragile", options={"max_attempts": 1})
    (lease,) = await engine.claim("w", ["fragile"], 1, 30)
    await engine.fail(str(lease["step_id"]), lease["lease_generation"], "boom")
    status, html = await get(http, f"{console}/runs/{job}")
    assert 'id="action-retry-all"' in html and 'id="action-cancel"' not in html  # a failed run: retry only
    status, html = await post(http, f"{console}/runs/{job}/actions/retry-all", {"csrf": csrf_of(html), "confirm": "yes"})
    assert status == 200 and "Retry all discarded steps: done. The run is now running." in html
    assert node_states(html) == {"fragile": "available"}
    await engine.register_workflow("wide", [{"id": f"n{i}", "kind": "k"} for i in range(401)])
    run_id, _ = await engine.submit_run("wide")
    status, html = await get(http, f"{console}/runs/{run_id}")
    assert status == 200 and 'id="graph-too-large"' in html and "401 nodes" in html
    assert html.count('<tr data-node="') == 401


async def test_cyclone_http_listen_from_the_environment(start_server: Callable[..., Any], db_url: str,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        http: aiohttp.ClientSession) -> None:
    monkeypatch.setenv("CYCLONE_HTTP_LISTEN", "127.0.0.1:0")
    srv = start_server(db_url)
    assert (await get(http, http_url(srv) + "/healthz")) == (200, "ok\n")


async def test_workers_page_lists_connected_workers_and_flags_kinds_no_worker_runs(
        start_server: Callable[..., Any], db_url: str, tmp_path: Path, http: aiohttp.ClientSession,
        engine: Engine) -> None:
    import grpc

    from test_stream import RawWorker
    from waits_helpers import until

    srv, console = start_console_server(start_server, db_url, tmp_path)
    await engine.enqueue("resize")
    await engine.enqueue("shoutt")  # a typo: no worker runs it
    async with grpc.aio.insecure_channel(srv.address) as ch:
        raw = RawWorker(ch, ["resize", "thumbnail"], 3, worker_id="console-sees-me")
        try:
            await raw.connect()

            async def listed() -> bool:
                return 'data-worker="console-sees-me"' in (await get(http, console + "/workers"))[1]
            await until(listed, "the worker on the workers page")
            status, html = await get(http, console + "/workers")
            assert status == 200
            row = re.search(r'<tr data-worker="console-sees-me">(.*?)</tr>', html, re.S)
            assert row and "resize, thumbnail" in row.group(1) and "<td>3</td>" in row.group(1)
            kinds = dict(re.findall(r'<tr data-kind="([^"]+)"( class="stalled")?>', html))
            assert kinds == {"resize": "", "shoutt": ' class="stalled"'}
        finally:
            await raw.close()


# -- schedules -----------------------------------------------------------------------


def yearly(**kw: Any) -> Any:
    """Settings of a schedule that will not fire during a test (03:00 on the 1st of January, Paris time)."""
    from cyclone_server.schedule_spec import ScheduleSettings, Spec
    return ScheduleSettings(Spec(cron="0 3 1 1 *", time_zone="Europe/Paris"), **kw)


async def test_schedules_page_lists_schedules_with_target_spec_policy_and_counters(
        console: str, http: aiohttp.ClientSession, engine: Engine) -> None:
    from cyclone_server.schedule_spec import ScheduleSettings, Spec

    await register(engine)
    await engine.create_schedule("nightly-etl", yearly(workflow="etl", input={"full": True}, overlap="buffer_one",
                                                       note="the nightly load"))
    await engine.create_schedule("tick", ScheduleSettings(Spec(cron="0 3 1 1 *"), kind="emails.digest"),
                                 paused=True)
    status, html = await get(http, console + "/schedules")
    assert status == 200 and '<a href="/schedules" class="here">Schedules</a>' in html
    assert re.findall(r'<tr data-schedule="([^"]+)"', html) == ["nightly-etl", "tick"]  # by name
    row = re.search(r'<tr data-schedule="nightly-etl" data-paused="false">(.*?)</tr>', html, re.S)
    assert row, html
    cells = row.group(1)
    assert '<a href="/workflows/etl">etl</a>' in cells and "latest" in cells
    assert "cron 0 3 1 1 * (Europe/Paris)" in cells and "buffer_one" in cells and "the nightly load" in cells
    assert re.search(r"<td>\d{4}-01-01 0[12]:00:00</td>", cells)  # 03:00 in Paris is 01:00 or 02:00 UTC
    assert re.findall(r"<td>(\d+)</td>", cells) == ["0", "0", "0"]  # fires, misses, skips
    tick = re.search(r'<tr data-schedule="tick" data-paused="true">(.*?)</tr>', html, re.S)
    assert tick and "emails.digest" in tick.group(1) and "paused" in tick.group(1)
    # A paused schedule has no next fire time (Schedule.next_fire_at is unset while paused).
    assert "not while paused" in tick.group(1) and not re.search(r"<td>\d{4}-", tick.group(1))
    status, html = await get(http, console + "/schedules?name=nig")
    assert re.findall(r'<tr data-schedule="([^"]+)"', html) == ["nightly-etl"]


async def test_schedules_are_paged_by_name(console: str, http: aiohttp.ClientSession, engine: Engine) -> None:
    names = [f"s{i:02d}" for i in range(52)]
    for name in names:
        await engine.create_schedule(name, yearly(kind="k"))
    status, html = await get(http, console + "/schedules")
    assert re.findall(r'<tr data-schedule="([^"]+)"', html) == names[:50]
    nxt = re.search(r'<a href="([^"]+)" id="next-page">', html)
    assert nxt
    status, html = await get(http, console + nxt.group(1).replace("&amp;", "&"))
    assert status == 200 and re.findall(r'<tr data-schedule="([^"]+)"', html) == names[50:]
    assert 'id="next-page"' not in html and 'id="first-page"' in html


async def test_schedule_page_shows_settings_and_runs_and_its_actions_apply(console: str,
                                                                          http: aiohttp.ClientSession,
                                                                          engine: Engine) -> None:
    from cyclone_server.schedule_spec import ScheduleSettings, Spec

    await engine.create_schedule("reports", ScheduleSettings(Spec(every=86400, offset=3600), kind="report.build",
                                                             input={"region": "eu"}, overlap="allow_all",
                                                             priority=5, note="daily at 01:00 UTC"))
    status, html = await get(http, console + "/schedules/reports")
    assert status == 200
    assert "job of kind <span class=\"mono\">report.build</span>" in html
    assert "every 24 h 00 m at offset 1 h 00 m" in html and "allow_all" in html and "daily at 01:00 UTC" in html
    assert "&#34;region&#34;: &#34;eu&#34;" in html and "The schedule has started no run yet." in html
    fired = await engine.trigger_schedule("reports")
    run_id = str(fired["run_id"])
    status, html = await get(http, console + "/schedules/reports")
    row = re.search(rf'<tr data-run="{run_id}" data-state="running">(.*?)</tr>', html, re.S)
    assert row and f'<a href="/runs/{run_id}">' in row.group(1)

    csrf = csrf_of(html)
    url = f"{console}/schedules/reports/actions"
    status, html = await post(http, f"{url}/pause", {"csrf": csrf})  # first: the confirmation
    assert status == 200 and "Yes, pause schedule" in html and 'name="confirm" value="yes"' in html
    assert not (await engine.get_schedule("reports"))["paused"]
    status, html = await post(http, f"{url}/pause", {"csrf": csrf, "confirm": "yes"})
    assert status == 200 and "Pause schedule: done. The schedule is now paused." in html
    assert (await engine.get_schedule("reports"))["paused"]
    status, html = await post(http, f"{url}/pause", {"csrf": csrf, "confirm": "yes"})
    assert status == 200 and "Pause schedule: nothing to do, the server left the schedule as it was (paused)." in html
    status, html = await post(http, f"{url}/trigger", {"csrf": csrf, "confirm": "yes"})  # a paused one may be
    m = re.search(r"Trigger now: done\. Run ([0-9a-f-]{36}) started\.", html)
    assert status == 200 and m and f'<a href="/runs/{m.group(1)}" id="notice-run">' in html
    assert len((await engine.get_schedule("reports"))["recent_runs"]) == 2
    status, html = await post(http, f"{url}/resume", {"csrf": csrf, "confirm": "yes"})
    assert status == 200 and "Resume schedule: done. The schedule is now active. Next fire time: " in html
    assert not (await engine.get_schedule("reports"))["paused"]
    status, html = await post(http, f"{url}/bogus", {"csrf": csrf, "confirm": "yes"})
    assert status == 404


async def test_trigger_under_skip_says_no_run_started(console: str, http: aiohttp.ClientSession,
                                                      engine: Engine) -> None:
    await engine.create_schedule("once-at-a-time", yearly(kind="slow"))
    await engine.trigger_schedule("once-at-a-time")
    status, html = await get(http, console + "/schedules/once-at-a-time")
    status, html = await post(http, f"{console}/schedules/once-at-a-time/actions/trigger",
                              {"csrf": csrf_of(html), "confirm": "yes"})
    assert status == 200 and "Trigger now: skipped. A run of this schedule is still active" in html
    assert "(overlap policy skip)" in html
    assert len((await engine.get_schedule("once-at-a-time"))["recent_runs"]) == 1


async def test_trigger_under_buffer_one_says_buffered_then_skipped_naming_its_policy(
        console: str, http: aiohttp.ClientSession, engine: Engine) -> None:
    await engine.create_schedule("one-behind", yearly(kind="slow", overlap="buffer_one"))
    await engine.trigger_schedule("one-behind")  # started, and stays active: no worker
    status, html = await get(http, console + "/schedules/one-behind")
    url, form = f"{console}/schedules/one-behind/actions/trigger", {"csrf": csrf_of(html), "confirm": "yes"}
    status, html = await post(http, url, form)
    assert status == 200 and "Trigger now: buffered." in html and "(overlap policy buffer_one)" in html
    status, html = await post(http, url, form)  # one fire time is buffered already: this one is skipped
    assert status == 200 and "Trigger now: skipped." in html and "a fire time is buffered already" in html
    assert "(overlap policy buffer_one)" in html and "overlap policy skip" not in html


async def test_schedule_posts_without_csrf_are_refused_and_unknown_schedules_are_404(
        console: str, http: aiohttp.ClientSession, engine: Engine) -> None:
    await engine.create_schedule("guarded", yearly(kind="k"))
    status, html = await get(http, console + "/schedules/guarded")
    csrf = csrf_of(html)
    url = f"{console}/schedules/guarded/actions/pause"
    status, html = await post(http, url, {"confirm": "yes"})
    assert status == 403 and "CSRF token is missing" in html
    status, html = await post(http, url, {"confirm": "yes", "csrf": csrf}, headers={"Origin": "http://evil.example"})
    assert status == 403 and "another site" in html
    assert not (await engine.get_schedule("guarded"))["paused"]
    status, html = await get(http, console + "/schedules/nope")
    assert status == 404 and "schedule &#34;nope&#34; not found" in html
    status, html = await post(http, f"{console}/schedules/nope/actions/trigger", {"csrf": csrf, "confirm": "yes"})
    assert status == 404 and "not found" in html


async def test_hostile_schedule_note_is_escaped(console: str, http: aiohttp.ClientSession, engine: Engine) -> None:
    await engine.create_schedule("hostile", yearly(kind="k", note=HOSTILE, input={"x": HOSTILE}))
    for page in ("/schedules", "/schedules/hostile"):
        status, html = await get(http, console + page)
        assert status == 200
        assert "<script>window" not in html and "<img src=x" not in html, page
        assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in html, page


async def test_with_tokens_schedule_actions_need_admin(secured: str, http: aiohttp.ClientSession,
                                                      engine: Engine) -> None:
    await engine.create_schedule("secured", yearly(kind="k"))
    status, html = await get(http, secured + "/schedules")
    assert status == 303
    status, html = await get(http, f"{secured}/login")
    csrf = csrf_of(html)
    await post(http, secured + "/login", {"csrf": csrf, "token": SUBMIT_TOKEN, "next": "/schedules"})
    status, html = await get(http, f"{secured}/schedules")
    assert status == 200 and 'data-schedule="secured"' in html
    status, html = await get(http, f"{secured}/schedules/secured")
    assert status == 200 and 'id="actions"' not in html  # no buttons for a reader
    status, html = await post(http, f"{secured}/schedules/secured/actions/pause", {"csrf": csrf, "confirm": "yes"})
    assert status == 403 and "needs the role admin" in html
    assert not (await engine.get_schedule("secured"))["paused"]
    await post(http, secured + "/login", {"csrf": csrf, "token": ADMIN_TOKEN, "next": "/schedules"})
    status, html = await get(http, f"{secured}/schedules/secured")
    assert 'id="actions"' in html
    status, html = await post(http, f"{secured}/schedules/secured/actions/pause", {"confirm": "yes"})
    assert status == 403 and "CSRF" in html
    status, html = await post(http, f"{secured}/schedules/secured/actions/pause", {"csrf": csrf, "confirm": "yes"})
    assert status == 200 and "The schedule is now paused." in html
    assert (await engine.get_schedule("secured"))["paused"]
