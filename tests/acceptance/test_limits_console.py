"""The console's view of flow control against a real server: the limits page (settings and busiest
keys), the reason a limit holds a step on its run's page, escaping, and who may read them.

Limits are set and steps enqueued and claimed through an Engine on the same database (as
Limits/SetLimit and a worker would); every assertion reads what the console answers.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from html import unescape
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from cyclone_server import limit_spec
from cyclone_server.store.engine import Engine

from console_helpers import ADMIN_TOKEN, SUBMIT_TOKEN, WORKER_TOKEN, start_console_server
from test_console_http import HOSTILE, bearer, get, http  # noqa: F401  (http: the client session fixture)


@pytest.fixture
def console(start_server: Callable[..., Any], db_url: str, tmp_path: Path) -> str:
    return start_console_server(start_server, db_url, tmp_path)[1]


async def set_limit(engine: Engine, name: str, **fields: Any) -> None:
    await engine.set_limit(limit_spec.normalize_limit({"name": name, **fields}))


async def enqueue(engine: Engine, kind: str, tenants: list[str]) -> list[str]:
    return [(await engine.enqueue(kind, input={"tenant": t}))[0] for t in tenants]


def row(html: str, attrs: str) -> str:
    """The cells of the table row with exactly these attributes (and perhaps a class)."""
    m = re.search(rf'<tr {re.escape(attrs)}(?: class="[^"]*")?>(.*?)</tr>', html, re.S)
    assert m, f"no row {attrs} in:\n{html}"
    return m.group(1)


def cells(row_html: str) -> list[str]:
    return [unescape(re.sub(r"<[^>]+>", "", c)).strip()
            for c in re.findall(r"<td[^>]*>(.*?)</td>", row_html, re.S)]


async def test_limits_page_shows_each_limit_and_the_usage_of_its_busiest_keys(
        console: str, http: aiohttp.ClientSession, engine: Engine) -> None:  # noqa: F811
    status, html = await get(http, console + "/limits")
    assert status == 200 and "No limit is set." in html
    assert "No step or run is running or waiting under a limit." in html
    assert '<a href="/limits" class="here">Limits</a>' in html
    assert '<a href="/limits">Limits</a>' in (await get(http, console + "/runs"))[1]  # in every page's navigation

    await set_limit(engine, "tenants", max_running=2, kinds=["work"], key_path="input.tenant", weights={"a": 3})
    await set_limit(engine, "api", rate=100, period=60.0, kinds=["call"], key="global")
    await set_limit(engine, "idle", max_running=5, scope="runs", workflows=["etl"], strategy="cancel_newest")
    await enqueue(engine, "work", ["a", "a", "a", "a", "b"])
    assert len(await engine.claim("w", ["work"], 10, 30)) == 3
    await engine.enqueue("call")
    assert len(await engine.claim("w", ["call"], 10, 30)) == 1

    status, html = await get(http, console + "/limits")
    assert status == 200
    assert re.findall(r'<tr data-limit="([^"]+)">', html)[:3] == ["api", "idle", "tenants"]
    assert cells(row(html, 'data-limit="tenants"'))[:8] == [
        "tenants", "steps", "queue", "2 per key", "none", "steps of kinds work", "input.tenant", "a=3"]
    assert cells(row(html, 'data-limit="api"'))[:8] == [
        "api", "steps", "queue", "none", "100 per minute per key", "steps of kinds call", '"global"', ""]
    assert cells(row(html, 'data-limit="idle"'))[:6] == [
        "idle", "runs", "cancel_newest", "5 per key", "none", "runs of workflows etl"]
    a = row(html, 'data-limit="tenants" data-key="a"')
    assert '<tr data-limit="tenants" data-key="a" class="full">' in html  # at its maximum
    assert '<tr data-limit="tenants" data-key="b">' in html
    assert cells(a)[:4] == ["tenants", "a", "2/2", "2"] and re.fullmatch(r"\d+\.\d\d s", cells(a)[4])
    assert cells(row(html, 'data-limit="tenants" data-key="b"')) == ["tenants", "b", "1/2", "0", "", ""]
    assert cells(row(html, 'data-limit="api" data-key="global"')) == ["api", "global", "1", "0", "", "1/100"]
    assert html.index('data-key="a"') < html.index('data-key="b"'), "busiest first"
    assert "No step or run is running or waiting under a limit." not in html


async def test_a_step_held_by_a_limit_says_why_on_its_run_page(
        console: str, http: aiohttp.ClientSession, engine: Engine) -> None:  # noqa: F811
    await set_limit(engine, "tenants", max_running=1, kinds=["work"], key_path="input.tenant")
    first, held = await enqueue(engine, "work", ["acme", "acme"])
    assert len(await engine.claim("w", ["work"], 10, 30)) == 1
    for page in (f"/runs/{held}", f"/runs/{held}/live"):
        status, html = await get(http, console + page)
        assert status == 200
        assert "waiting: limit tenants key acme: 1/1 running" in html, page
    status, html = await get(http, console + f"/runs/{first}")  # the running one is held by nothing
    assert status == 200 and "waiting:" not in html


async def test_hostile_keys_are_escaped_on_the_limits_and_run_pages(
        console: str, http: aiohttp.ClientSession, engine: Engine) -> None:  # noqa: F811
    await set_limit(engine, "tenants", max_running=1, kinds=["work"], key_path="input.tenant")
    _, held = await enqueue(engine, "work", [HOSTILE, HOSTILE])
    assert len(await engine.claim("w", ["work"], 10, 30)) == 1
    for page in ("/limits", f"/runs/{held}", f"/runs/{held}/live"):
        status, html = await get(http, console + page)
        assert status == 200
        assert "<script>window" not in html and "<img src=x" not in html, page
        assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in html, page


@pytest.fixture
def secured(start_server: Callable[..., Any], db_url: str, tmp_path: Path) -> str:
    return start_console_server(start_server, db_url, tmp_path, tokens=True)[1]


async def test_with_tokens_the_limits_page_needs_a_token_that_may_list_limits(
        secured: str, http: aiohttp.ClientSession, engine: Engine) -> None:  # noqa: F811
    await set_limit(engine, "tenants", max_running=1)
    assert (await get(http, secured + "/limits"))[0] == 303  # to the sign-in form
    for token in (SUBMIT_TOKEN, ADMIN_TOKEN):
        status, html = await get(http, secured + "/limits", headers=bearer(token))
        assert status == 200 and 'data-limit="tenants"' in html
    status, html = await get(http, secured + "/limits", headers=bearer(WORKER_TOKEN))
    assert status == 403 and "needs the role submit or admin" in html and "tenants" not in html
