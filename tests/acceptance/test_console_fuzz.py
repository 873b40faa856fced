"""Fuzz of every console route and parameter: bad input is a 4xx naming what was wrong, never a 500.

One server with the console (`--http-listen`), seeded with a run, a workflow, a schedule and
a limit so that known names and ids are among the generated values (and the limits page has
a key to show). Each example sends one GET or POST with generated path segments, query
parameters and form fields (NUL characters, huge and odd strings, random ids, JSON
payloads), signed in and with the CSRF token, and the answer must be below 500. A U+0000
anywhere is answered 400 naming the place. The canary worker must still complete a job
afterwards. Bounded in examples.
"""

from __future__ import annotations

import http.client
import json
import re
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cyclone_proto import limits_pb2, limits_pb2_grpc, runs_pb2, runs_pb2_grpc, schedules_pb2, schedules_pb2_grpc
from cyclone_proto import types_pb2
from cyclone_proto import workflows_pb2, workflows_pb2_grpc
from cyclone_server.convert import py_to_value

from console_helpers import http_url
from fuzz_helpers import JSON, KNOWN_IDS, module_server, texts

GET_ROUTES = ["/", "/healthz", "/login", "/runs", "/runs/{id}", "/runs/{id}/live", "/workflows", "/workflows/{name}",
              "/workers", "/schedules", "/schedules/{name}", "/limits", "/static/{name}"]
POST_ROUTES = ["/login", "/logout", "/runs/{id}/actions/{action}", "/schedules/{name}/actions/{action}"]
ACTIONS = ["cancel", "pause", "resume", "retry-all", "retry-step", "signal", "trigger", "nope", ""]
QUERY_KEYS = ["state", "workflow", "from", "to", "id", "after", "name", "next", "version", "kind"]
FORM_KEYS = ["confirm", "node", "name", "payload", "deadline_in", "overlap", "token", "next"]
KNOWN_NAMES = ["etl", "nightly", "tenants", "console.js", "missing"]


@pytest.fixture(scope="module")
def console(pg_admin_url: str, template_dbname: str, db_url_for: Callable[[str], str],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with module_server(pg_admin_url, template_dbname, db_url_for, tmp_path_factory.mktemp("console-fuzz"),
                       ["--http-listen", "127.0.0.1:0"]) as srv:
        with grpc.insecure_channel(srv.address) as channel:
            wf = workflows_pb2_grpc.WorkflowsStub(channel)
            wf.RegisterWorkflow(workflows_pb2.RegisterWorkflowRequest(name="etl", nodes=[
                types_pb2.Node(id="a", kind="etl-job"),
                types_pb2.Node(id="go", type=types_pb2.NODE_TYPE_SIGNAL, signal="go", deps=["a"])]))
            # Before the run: its step consumes the limit (under the key "1", from its input).
            limits_pb2_grpc.LimitsStub(channel).SetLimit(limits_pb2.SetLimitRequest(limit=limits_pb2.Limit(
                name="tenants", max_running=1, kinds=["etl-job"], key_path="input.n")))
            runs = runs_pb2_grpc.RunsStub(channel)
            run_id = runs.SubmitRun(runs_pb2.SubmitRunRequest(workflow="etl", input=py_to_value({"n": 1}))).run_id
            KNOWN_IDS.append(run_id)
            schedules_pb2_grpc.SchedulesStub(channel).CreateSchedule(schedules_pb2.CreateScheduleRequest(
                name="nightly", paused=True, settings=schedules_pb2.ScheduleSettings(
                    job=runs_pb2.EnqueueRequest(kind="etl-job", input=py_to_value({"n": 2})),
                    cron=schedules_pb2.CronSpec(expression="0 3 * * *"))))
        srv.console = urlsplit(http_url(srv)).netloc
        yield srv


class Session:
    """One browser: the CSRF cookie and its token, over http.client (paths are sent as given)."""

    def __init__(self, netloc: str) -> None:
        self.netloc = netloc
        status, headers, body = self.request("GET", "/runs")
        assert status == 200, body[:500]
        self.cookie = next(v.split(";")[0] for k, v in headers if k.lower() == "set-cookie" and "csrf" in v)
        self.csrf = self.cookie.split("=", 1)[1]

    def request(self, method: str, path: str, form: dict[str, str] | None = None) -> tuple[int, list, str]:
        conn = http.client.HTTPConnection(self.netloc, timeout=30)
        try:
            headers = {"Cookie": getattr(self, "cookie", "")}
            body = None
            if form is not None:
                body = urlencode(form).encode()
                headers["Content-Type"] = "application/x-www-form-urlencoded"
                headers["Origin"] = f"http://{self.netloc}"
            conn.request(method, path, body=body, headers=headers)
            r = conn.getresponse()
            return r.status, r.getheaders(), r.read().decode("utf-8", "replace")
        finally:
            conn.close()


@pytest.fixture(scope="module")
def browser(console: Any) -> Session:
    return Session(console.console)


def segments() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(KNOWN_NAMES), texts().filter(lambda s: len(s) < 2000))


def values() -> st.SearchStrategy[str]:
    return st.one_of(texts().filter(lambda s: len(s) < 3000),
                     JSON.map(lambda v: json.dumps(v, allow_nan=True)).filter(lambda s: len(s) < 3000),
                     st.just(json.dumps({"k": "\u0000"})))


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no URL or form can carry it
        return False
    return True


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, str, dict[str, str] | None]:
    method = draw(st.sampled_from(["GET", "POST"]), label="method")
    route = draw(st.sampled_from(GET_ROUTES if method == "GET" else POST_ROUTES), label="route")
    parts = {"id": draw(st.one_of(st.sampled_from(KNOWN_IDS or ["x"]), segments()), label="id"),
             "name": draw(segments(), label="name"), "action": draw(st.sampled_from(ACTIONS), label="action")}
    path = re.sub(r"\{(\w+)\}", lambda m: quote(parts[m.group(1)], safe=""), route)
    query = draw(st.dictionaries(st.sampled_from(QUERY_KEYS), values(), max_size=4), label="query")
    if query:
        path += "?" + urlencode(query)
    form = None
    if method == "POST":
        form = draw(st.dictionaries(st.sampled_from(FORM_KEYS), values(), max_size=4), label="form")
    return method, path, form


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(req=requests())
def test_no_console_route_answers_500(console: Any, browser: Session, req: tuple[str, str, dict | None]) -> None:
    method, path, form = req
    if not _utf8(path) or (form and not all(_utf8(k + v) for k, v in form.items())):
        return
    if form is not None:
        form = {**form, "csrf": browser.csrf}
    status, _, body = browser.request(method, path, form)
    assert status < 500, f"{method} {path[:300]} {str(form)[:300]} -> {status}\n{body[:2000]}"


@pytest.mark.parametrize(("method", "path", "form", "named"), [
    ("GET", "/runs?workflow=%00", None, "parameter workflow"),
    ("GET", "/runs?state=running&id=ab%00", None, "parameter id"),
    ("GET", "/schedules?name=%00", None, "parameter name"),
    ("GET", "/schedules?after=%00", None, "parameter after"),
    ("GET", "/schedules/a%00b", None, "path"),
    ("GET", "/workflows/etl%00", None, "path"),
    ("GET", "/runs/%00", None, "path"),
    ("GET", "/limits?name=%00", None, "parameter name"),
    ("GET", "/limits%00", None, "path"),
    ("POST", "/schedules/a%00b/actions/pause", {}, "path"),
    ("POST", "/schedules/nightly/actions/pause", {"confirm": "1\x00"}, "form field confirm"),
    ("POST", "/runs/{run}/actions/signal", {"name": "go", "payload": json.dumps({"k": "\u0000"}), "confirm": "1"},
     "payload"),
    ("POST", "/runs/{run}/actions/signal", {"name": "go\x00", "confirm": "1"}, "form field name"),
])
def test_a_nul_character_is_400_naming_where_it_was(console: Any, browser: Session, method: str, path: str,
                                                    form: dict[str, str] | None, named: str) -> None:
    path = path.replace("{run}", KNOWN_IDS[0])
    status, _, body = browser.request(method, path, None if form is None else {**form, "csrf": browser.csrf})
    assert status == 400, body[:1000]
    assert named in body and "U+0000" in body, body[:2000]


def test_a_url_over_8_kib_is_400_and_one_log_line(console: Any, browser: Session) -> None:
    before = console.log_text()
    for _ in range(3):
        status, _, _ = browser.request("GET", "/runs?workflow=" + "a" * 9000)
        assert status == 400
    assert browser.request("GET", "/runs")[0] == 200  # still serving
    added = console.log_text()[len(before):]
    refusals = [line for line in added.splitlines() if "cannot read" in line]
    assert len(refusals) == 3, added[-3000:]
    assert "Traceback" not in added and "ERROR" not in added, added[-3000:]
