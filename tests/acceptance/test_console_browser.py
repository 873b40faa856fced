"""The web console in a real browser: headless Chromium (Debian's chromium + chromium-driver) driven by selenium.

`scripts/setup_browser.sh` installs what is missing (once per session; it only checks when
all is there); a machine where it cannot is a failure that says so, not a skip. Every test
runs a real cyclone-server with `--http-listen`, and the live test a real SDK worker.

Screenshots go to the test's tmp directory, or to $CYCLONE_CONSOLE_SCREENSHOTS when set
(docs/console.md's pictures are made with CYCLONE_CONSOLE_SCREENSHOTS=docs).

Selenium's calls block, and the SDK worker runs on the test's event loop: each browser
call runs in a thread (asyncio.to_thread) so the worker keeps serving meanwhile.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cyclone_server.store.engine import Engine
from cyclone_worker import Client, Context, Worker, Workflow

from console_helpers import ADMIN_TOKEN, SUBMIT_TOKEN, start_console_server
from waits_helpers import DEADLINE

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "<script>window.__pwned = 1</script><img src=x onerror=\"window.__pwned = 2\">"


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    setup = subprocess.run(["bash", str(ROOT / "scripts" / "setup_browser.sh")], capture_output=True, text=True,
                           env={**os.environ, "PYTHON": sys.executable}, timeout=1200)
    if setup.returncode != 0:
        pytest.fail("the console's browser tests need Debian's chromium and chromium-driver and selenium, and "
                    f"scripts/setup_browser.sh could not install them:\n{setup.stdout}\n{setup.stderr}")
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", "--force-device-scale-factor=1"):
        options.add_argument(arg)
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver") or "/usr/bin/chromedriver")
    drv = webdriver.Chrome(options=options, service=service)
    drv.set_page_load_timeout(60)
    try:
        yield drv
    finally:
        drv.quit()


class Page:
    """The browser, one blocking selenium call per thread hop."""

    def __init__(self, drv: Any, base: str, shots: Path) -> None:
        self.drv, self.base, self.shots = drv, base, shots

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    async def open(self, path: str) -> None:
        await self.call(self.drv.get, self.base + path)

    async def js(self, script: str, *args: Any) -> Any:
        return await self.call(self.drv.execute_script, script, *args)

    async def _on(self, css: str, act: Callable[[Any], Any]) -> None:
        """`act(element)` once the element is there (the page may still be loading after a submit)."""
        from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
        from selenium.webdriver.common.by import By

        def attempt() -> bool:
            try:
                act(self.drv.find_element(By.CSS_SELECTOR, css))
                return True
            except (NoSuchElementException, StaleElementReferenceException):
                return False

        await self.wait(lambda: self.call(attempt), f"element {css}")

    async def click(self, css: str) -> None:
        await self._on(css, lambda e: e.click())

    async def type(self, css: str, text: str) -> None:
        await self._on(css, lambda e: e.send_keys(text))

    async def text(self, css: str) -> str:
        return await self.js("const e = document.querySelector(arguments[0]); return e ? e.textContent : null", css)

    async def node_states(self) -> dict[str, str]:
        return await self.js("return Object.fromEntries([...document.querySelectorAll('svg.dag g.node')]"
                             ".map(g => [g.dataset.node, g.dataset.state]))")

    async def wait(self, probe: Callable[[], Any], what: str, timeout: float = DEADLINE) -> Any:
        """Poll the async `probe` until it returns something truthy."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = await probe()
            except Exception as e:  # e.g. the page is being replaced
                last = e
            if last and not isinstance(last, Exception):
                return last
            await asyncio.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; last: {last!r}")

    async def shot(self, name: str) -> None:
        """A screenshot of the whole page (the window grows to the page's height for it)."""
        def take() -> None:
            height = self.drv.execute_script("return document.documentElement.scrollHeight")
            self.drv.set_window_size(1400, min(max(height, 700), 3000))
            try:
                self.drv.save_screenshot(str(self.shots / name))
            finally:
                self.drv.set_window_size(1400, 1000)
        await self.call(take)


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    target = os.environ.get("CYCLONE_CONSOLE_SCREENSHOTS")
    path = (ROOT / target) if target and not os.path.isabs(target) else Path(target) if target else tmp_path
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def browser(driver: Any, shots: Path) -> Callable[[str], Page]:
    driver.delete_all_cookies()  # cookies are per host, not per port: start each test signed out
    return lambda base: Page(driver, base, shots)


@pytest.fixture
async def console(start_server: Callable[..., Any], db_url: str, tmp_path: Path) -> AsyncIterator[tuple[Any, str]]:
    yield start_console_server(start_server, db_url, tmp_path)


async def test_runs_page_run_dag_and_a_node_changing_state_live(console: tuple[Any, str], browser: Any,
                                                                engine: Engine) -> None:
    srv, base = console
    page = browser(base)
    wf = (Workflow("pipeline").task("fetch").task("parse", deps=["fetch"]).task("enrich", deps=["fetch"])
          .signal("approve", name="approval", deps=["parse", "enrich"]).task("store", deps=["approve"]))
    release = asyncio.Event()
    worker = Worker(srv.address, slots=4)

    @worker.handler("fetch")
    async def fetch(ctx: Context) -> dict[str, Any]:
        return {"pages": 3, "source": ctx.input["source"]}

    @worker.handler("parse")
    async def parse(ctx: Context) -> int:
        await release.wait()
        return 42

    @worker.handler("enrich")
    async def enrich(ctx: Context) -> str:
        return "enriched"

    @worker.handler("thumbnail")
    async def thumbnail(ctx: Context) -> dict[str, Any]:
        return {"size": ctx.input["size"]}

    @worker.handler("store")
    async def store(ctx: Context) -> dict[str, Any]:
        return {"stored": ctx.parents["approve"]}

    async with worker:
        async with Client(srv.address) as client:
            await client.register(wf)
            for size in (64, 128, 256):  # a few jobs, so the runs page has more than one row
                await client.result(await client.enqueue("thumbnail", {"size": size}), timeout=DEADLINE)
            await page.open("/runs")
            await page.js("window.__sameDocument = true")  # gone if the page reloads
            run_id = await client.submit("pipeline", {"source": "https://example.com/feed"})

        # The runs page shows the new run by itself.
        await page.wait(lambda: page.js(f"return !!document.querySelector('tr[data-run=\"{run_id}\"] a')"),
                        "the run's row on the runs page")
        assert await page.js("return window.__sameDocument === true"), "the runs page reloaded"
        assert await page.text(f'tr[data-run="{run_id}"] td:nth-child(3) a') == "pipeline"
        await page.click(f'tr[data-run="{run_id}"] a')
        await page.wait(lambda: page.js("return document.getElementById('run-id')?.textContent") , "the run page")
        assert await page.text("#run-id") == run_id

        states = await page.wait(lambda: _when(page.node_states(), lambda s: s.get("parse") == "running"
                                               and s.get("enrich") == "completed"), "parse running")
        assert states == {"fetch": "completed", "parse": "running", "enrich": "completed", "approve": "pending",
                          "store": "pending"}
        await page.js("window.__sameDocument = true")  # gone if the page reloads
        await page.shot("console-run.png")

        release.set()  # the worker completes parse; the page follows without a reload
        states = await page.wait(lambda: _when(page.node_states(), lambda s: s.get("approve") == "waiting_signal"),
                                 "approve waiting for its signal, live")
        assert states["parse"] == "completed"
        assert await page.js("return window.__sameDocument === true"), "the page reloaded instead of updating"
        assert "3/5" in await page.text("#run-progress")

        # The signal from the page: name and JSON payload, a confirmation, the server's answer.
        await page.type("#signal-name", "approval")
        await page.type("#signal-payload", '{"approved_by": "ops"}')
        await page.click("#action-signal")
        await page.wait(lambda: page.js("return !!document.getElementById('confirm')"), "the confirmation")
        assert "approved_by" in await page.text("#confirm-payload")
        await page.click("#confirm")
        notice = await page.wait(lambda: page.text("#notice"), "the server's answer")
        assert "signal 'approval' delivered" in notice
        await page.wait(lambda: _when(page.text("#run-state"), lambda t: t == "completed"), "the run completed, live")
        assert set((await page.node_states()).values()) == {"completed"}
        assert "stored" in await page.text("#run-result")
        await page.shot("console-run-completed.png")


async def _when(value: Any, cond: Callable[[Any], bool]) -> Any:
    v = await value
    return v if v and cond(v) else None


async def test_cancel_a_run_from_the_page(console: tuple[Any, str], browser: Any, engine: Engine) -> None:
    _, base = console
    page = browser(base)
    await engine.register_workflow("report", [{"id": "gather", "kind": "gather"},
                                              {"id": "render", "kind": "render", "deps": ["gather"]}])
    run_id, _ = await engine.submit_run("report", input={"month": "2026-11"})
    await page.open(f"/runs/{run_id}")
    assert await page.node_states() == {"gather": "available", "render": "pending"}
    # A refusal, in words: only a paused run can be resumed.
    await page.click("#action-resume")
    await page.click("#confirm")
    notice = await page.wait(lambda: page.text("#notice"), "the refusal")
    assert "Resume run: refused by the server (FAILED_PRECONDITION)" in notice
    assert "only a paused run can be resumed" in notice
    await page.click("#action-cancel")
    await page.wait(lambda: page.js("return !!document.getElementById('confirm')"), "the confirmation page")
    await page.shot("console-confirm.png")
    assert (await engine.get_run(run_id, steps=False))["state"] == "running"  # nothing happened yet
    await page.click("#confirm")
    notice = await page.wait(lambda: page.text("#notice"), "the server's answer")
    assert notice == "Cancel run: done. The run is now cancelled."
    assert await page.text("#run-state") == "cancelled"
    assert await page.node_states() == {"gather": "cancelled", "render": "cancelled"}
    assert (await engine.get_run(run_id, steps=False))["state"] == "cancelled"
    assert "no action applies" in await page.text("#no-actions")


async def test_a_hostile_payload_shows_as_text(console: tuple[Any, str], browser: Any, engine: Engine) -> None:
    _, base = console
    page = browser(base)
    job, _, _ = await engine.enqueue("hostile", input={"comment": HOSTILE})
    (lease,) = await engine.claim("w", ["hostile"], 1, 30)
    await engine.fail(str(lease["step_id"]), lease["lease_generation"], HOSTILE, permanent=True)
    await page.open(f"/runs/{job}")
    assert HOSTILE.replace('"', '\\"') in await page.text("#run-input")
    await page.js("document.querySelectorAll('details').forEach(d => d.open = true)")
    assert HOSTILE in await page.text("pre.error")
    assert await page.js("return window.__pwned === undefined")
    assert await page.js("return document.querySelectorAll('main script, main img').length") == 0
    await page.open("/runs")
    assert await page.js("return window.__pwned === undefined")


async def test_sign_in_roles_and_csrf_in_the_browser(start_server: Callable[..., Any], db_url: str, tmp_path: Path,
                                                     browser: Any, engine: Engine) -> None:
    _, base = start_console_server(start_server, db_url, tmp_path, tokens=True)
    page = browser(base)
    job, _, _ = await engine.enqueue("guarded")
    await page.open(f"/runs/{job}")
    await page.wait(lambda: page.js("return !!document.getElementById('token')"), "the sign-in form")
    await page.shot("console-login.png")
    await page.type("#token", "not-a-known-token-123456")
    await page.click("#sign-in")
    assert "not known" in await page.wait(lambda: page.text("#login-message"), "the refusal")
    await page.type("#token", SUBMIT_TOKEN)
    await page.click("#sign-in")
    await page.wait(lambda: page.text("#run-id"), "the run page after signing in")
    assert await page.text("#run-id") == job  # back where the browser was going
    assert await page.js("return document.getElementById('actions') === null"), "a reader sees no actions"
    assert await page.js("return document.cookie") == ""  # the token cookie is HTTP-only
    await page.click("form.logout button")
    await page.wait(lambda: page.js("return !!document.getElementById('token')"), "signed out")
    await page.type("#token", ADMIN_TOKEN)
    await page.click("#sign-in")
    await page.wait(lambda: page.js("return !!document.getElementById('runs')"), "the runs page after signing in")
    await page.open(f"/runs/{job}")
    await page.wait(lambda: page.js("return !!document.getElementById('actions')"), "actions for an admin")
    # A form without its CSRF token (as a forged one would be) is refused.
    await page.js("document.querySelectorAll('#actions input[name=csrf]').forEach(i => i.remove())")
    await page.click("#action-cancel")
    message = await page.wait(lambda: page.text("#error-message"), "the CSRF refusal")
    assert "CSRF token is missing" in message
    assert (await engine.get_run(job, steps=False))["state"] == "running"
    await page.open(f"/runs/{job}")
    await page.click("#action-cancel")
    await page.click("#confirm")
    assert "now cancelled" in await page.wait(lambda: page.text("#notice"), "the cancel")


async def test_workflows_and_backlog_pages(console: tuple[Any, str], browser: Any, engine: Engine) -> None:
    _, base = console
    page = browser(base)
    await engine.register_workflow("ingest", [{"id": "fetch", "kind": "http.get"}])
    await engine.register_workflow("nightly", [
        {"id": "extract", "kind": "extract"},
        {"id": "clean", "kind": "clean", "deps": ["extract"]},
        {"id": "score", "kind": "score", "deps": ["extract"]},
        {"id": "wait_approval", "type": "signal", "signal": "approval", "deps": ["clean", "score"]},
        {"id": "cool_down", "type": "sleep", "sleep": 60, "deps": ["clean"]},
        {"id": "ingest_more", "type": "child", "workflow": "ingest", "deps": ["wait_approval"]},
        {"id": "publish", "kind": "publish", "deps": ["ingest_more", "cool_down"]},
    ])
    for i in range(5):
        await engine.enqueue("emails.send", input={"n": i})
    await engine.enqueue("thumbnails", input={})
    await engine.claim("w", ["thumbnails"], 1, 30)
    # Runs in every state, for the runs page.
    running, _ = await engine.submit_run("nightly", input={"day": "2026-12-02"})
    (lease,) = await engine.claim("w", ["extract"], 1, 30)
    await engine.complete(str(lease["step_id"]), lease["lease_generation"], {"rows": 1200})
    paused, _ = await engine.submit_run("nightly", input={"day": "2026-12-01"})
    await engine.pause_run(paused)
    cancelled, _ = await engine.submit_run("nightly", input={"day": "2026-11-30"})
    await engine.cancel_run(cancelled)
    failed, _, _ = await engine.enqueue("reports.pdf", input={"month": 11}, options={"max_attempts": 1})
    (lease,) = await engine.claim("w", ["reports.pdf"], 1, 30)
    await engine.fail(str(lease["step_id"]), lease["lease_generation"], "Traceback (most recent call last): ...")
    await page.open("/runs")
    shown = await page.js("return Object.fromEntries([...document.querySelectorAll('#runs tr[data-run]')]"
                          ".map(r => [r.dataset.run, r.dataset.state]))")
    assert {running: "running", paused: "paused", cancelled: "cancelled", failed: "failed"}.items() <= shown.items()
    await page.shot("console-runs.png")
    await page.open("/runs?state=paused")
    assert await page.js("return [...document.querySelectorAll('#runs tr[data-run]')].map(r => r.dataset.run)") \
        == [paused]
    await page.open("/workflows")
    nodes = await page.js("return [...document.querySelectorAll('section[data-workflow=nightly] g.node')]"
                          ".map(g => g.dataset.node + ':' + g.dataset.type)")
    assert sorted(nodes) == sorted(["extract:task", "clean:task", "score:task", "wait_approval:signal",
                                    "cool_down:sleep", "ingest_more:child", "publish:task"])
    await page.shot("console-workflows.png")
    await page.open("/workers")
    rows = await page.js("return [...document.querySelectorAll('#backlog tr[data-kind]')]"
                         ".map(r => [r.dataset.kind, r.className, r.children[1].textContent])")
    assert rows == [["clean", "stalled", "1"], ["emails.send", "stalled", "5"], ["score", "stalled", "1"],
                    ["thumbnails", "", "0"]]  # the paused run's steps are not claimable: not backlog
    await page.shot("console-workers.png")
    await page.js("window.__sameDocument = true")
    await engine.enqueue("video.encode", input={})  # the backlog follows by itself
    await page.wait(lambda: page.js("return !!document.querySelector('#backlog tr[data-kind=\"video.encode\"]')"),
                    "the new kind in the backlog")
    assert await page.js("return window.__sameDocument === true")
