"""The console's HTTP application (aiohttp, on the server's own event loop): pages, actions, /healthz, /metrics.

Every read and every action goes through the server's Engine, the same calls the gRPC
services make (engine.get_run, list_runs, list_workflows, stats, cancel_run, ...): the
console has no path of its own to the state. Pages are Jinja2 templates with autoescape on;
the run page polls its own fragments once a second while the run is not terminal.

Security (see docs/console.md):
- With tokens configured, every page but /login, /healthz, /metrics and /static needs a
  token, from the sign-in form (kept in an HTTP-only, SameSite=Strict cookie, Secure over
  HTTPS) or an `Authorization: Bearer` header. Reading needs a token that may call
  Runs/GetRun (role submit or admin; the limits page Limits/ListLimits too), acting one that
  may call Runs/CancelRun (admin): the same TokenAuthInterceptor as the gRPC port decides.
- Every POST carries a CSRF token equal to the browser's `cyclone_csrf` cookie (double
  submit; the cookie is SameSite=Strict and HTTP-only), and a request whose Origin is
  another site is refused. A request authenticated by its Authorization header carries no
  cookie and needs no CSRF token.
- Without tokens the server refuses to serve the console on a non-loopback address (cli.py).
"""

from __future__ import annotations

import hmac
import logging
import secrets
import ssl
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import grpc
import jinja2
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from cyclone_server import auth
from cyclone_server.records import RUN_STATES
from cyclone_server.store.engine import Engine
from cyclone_server.convert import kind_without_workers
from cyclone_server.errors import CycloneError, InvalidArgument, NotFound, Unavailable
from . import graph, views
from .access import (ACT_METHOD, CSRF_COOKIE, LIMITS_METHOD, OPEN_PATHS, READ_METHOD, TOKEN_COOKIE, Access, decorate,
                     is_https, same_origin, safe_next)
from .views import fmt_json, fmt_seconds, fmt_time, limit_view, run_summary, schedule_view, step_view, timeline

log = logging.getLogger("cyclone.console")

HERE = Path(__file__).parent
PAGE_SIZE = 50
POLL_MS = 1000
MAX_DRAWN_NODES = 400  # a larger DAG is listed in the step table, not drawn
ACTIONS = {
    "cancel": "Cancel run",
    "pause": "Pause run",
    "resume": "Resume run",
    "retry-all": "Retry all discarded steps",
    "retry-step": "Retry step",
    "signal": "Send signal",
}
ACTION_HELP = {
    "cancel": "Cancels every step that has not finished; running steps' results will be refused.",
    "pause": "No new step starts until the run is resumed; running steps may finish.",
    "resume": "Steps become claimable again and the run's timers continue.",
    "retry-all": "Every discarded step (and the steps cancelled because of it) runs again.",
    "retry-step": "This discarded step (and the steps cancelled because of it) runs again.",
    "signal": "Writes the signal to the run's mailbox; the oldest signal node waiting for that name takes it.",
}
SCHEDULE_ACTIONS = {
    "pause": "Pause schedule",
    "resume": "Resume schedule",
    "trigger": "Trigger now",
}
SCHEDULE_ACTION_HELP = {
    "pause": "The schedule stops firing until it is resumed (Trigger now still starts its target); "
             "its runs go on.",
    "resume": "The schedule fires again, from its next fire time after now; the fire times that passed "
              "while it was paused are neither started nor counted.",
    "trigger": "Starts the schedule's target now, under its overlap policy; its next fire time does not move.",
}

MetricsRender = Callable[[], Awaitable[tuple[bytes, str]]]
Ready = Callable[[], bool]


# -- the application -----------------------------------------------------------------


class Console:
    """Routes and handlers; `app` is the aiohttp application."""

    def __init__(self, engine: Engine, *, tokens: auth.TokenAuthInterceptor | None = None,
                 metrics: MetricsRender | None = None, ready: Ready | None = None, server_id: str = "") -> None:
        self.engine = engine
        self.access = Access(tokens)
        self.metrics = metrics
        self.ready = ready or (lambda: True)
        self.server_id = server_id
        self.env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                                      autoescape=True, undefined=jinja2.StrictUndefined,
                                      trim_blocks=True, lstrip_blocks=True)
        self.app = web.Application(middlewares=[self._guard], client_max_size=2 * 1024 * 1024)
        r = self.app.router
        r.add_get("/", self.index)
        r.add_get("/healthz", self.healthz)
        r.add_get("/metrics", self.metrics_page)
        r.add_get("/login", self.login_form)
        r.add_post("/login", self.login)
        r.add_post("/logout", self.logout)
        r.add_get("/runs", self.runs)
        r.add_get("/runs/{run_id}", self.run)
        r.add_get("/runs/{run_id}/live", self.run_live)
        r.add_post("/runs/{run_id}/actions/{action}", self.action)
        r.add_get("/workflows", self.workflows)
        r.add_get("/workflows/{name}", self.workflow)
        r.add_get("/workers", self.workers)
        r.add_get("/schedules", self.schedules)
        r.add_get("/schedules/{name}", self.schedule)
        r.add_post("/schedules/{name}/actions/{action}", self.schedule_action)
        r.add_get("/limits", self.limits)
        r.add_static("/static/", HERE / "static")

    # -- middleware: authentication and CSRF ------------------------------------------

    @web.middleware
    async def _guard(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                     ) -> web.StreamResponse:
        csrf = request.cookies.get(CSRF_COOKIE) or ""
        fresh_csrf = "" if len(csrf) >= 32 else secrets.token_urlsafe(32)
        request["csrf"] = fresh_csrf or csrf  # a short (not ours) cookie is replaced: the forms carry the new one
        token, from_header = self.access.token_of(request)
        request["token"], request["from_header"] = token, from_header
        request["signed_in"] = self.access.enabled and token is not None
        try:
            if request.method == "POST" and not from_header and not same_origin(request):
                raise self._error(request, 403, "refused: this form was sent from another site (Origin "
                                                f"{request.headers.get('Origin')}), a cross-site request forgery")
            if not request.path.startswith(OPEN_PATHS) and request.path != "/":
                refusal = self.access.refusal(token, READ_METHOD)
                if refusal is not None:
                    status, why = refusal
                    if status == 401 and request.method == "GET" and not from_header:
                        raise web.HTTPSeeOther("/login?" + urlencode({"next": request.path_qs}))
                    raise self._error(request, status, why)
            # Postgres cannot store U+0000: refused here, naming where, before any handler reads it.
            bad = ("path: contains the character U+0000" if "\x00" in request.path
                   else views.nul_in("parameter", request.query.items()))
            if bad is not None:
                raise self._error(request, 400, bad)
            try:
                response = await handler(request)
            except Unavailable as e:
                log.warning("%s: database unavailable: %s", request.path, e.__cause__ or e)
                raise self._error(request, 503, "the database is unavailable; try again in a moment") from None
        except web.HTTPException as e:
            decorate(e, request, fresh_csrf)
            raise
        decorate(response, request, fresh_csrf)
        return response

    async def _form(self, request: web.Request) -> Mapping[str, str]:
        """The POSTed form, after its CSRF token matched the cookie (else 403)."""
        form = await request.post()
        if not request["from_header"]:
            sent = str(form.get("csrf", ""))
            cookie = request.cookies.get(CSRF_COOKIE, "")
            if len(cookie) < 32 or not sent or not hmac.compare_digest(sent.encode(), cookie.encode()):
                raise self._error(request, 403, "refused: the form's CSRF token is missing or does not match this "
                                                "browser's (reload the page and try again)")
        fields = {k: str(v) for k, v in form.items()}
        bad = views.nul_in("form field", fields.items())
        if bad is not None:
            raise self._error(request, 400, bad)
        return fields

    # -- rendering ------------------------------------------------------------------

    def render(self, request: web.Request, template: str, status: int = 200, **context: Any) -> web.Response:
        body = self.env.get_template(template).render(
            csrf=request["csrf"], auth_enabled=self.access.enabled, signed_in=request["signed_in"],
            max_drawn=MAX_DRAWN_NODES,
            path=request.path, server_id=self.server_id, **context)
        return web.Response(text=body, status=status, content_type="text/html", charset="utf-8")

    def _error(self, request: web.Request, status: int, message: str) -> web.HTTPException:
        page = self.render(request, "error.html", status=status, title=f"{status}", message=message)
        return _STATUS_EXC.get(status, web.HTTPInternalServerError)(text=page.text, content_type="text/html")

    def _act_refusal(self, request: web.Request) -> str | None:
        refusal = self.access.refusal(request["token"], ACT_METHOD)
        return refusal[1] if refusal else None

    # -- plain endpoints ------------------------------------------------------------

    async def index(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPSeeOther("/runs")

    async def healthz(self, request: web.Request) -> web.Response:
        if not self.ready():
            return web.Response(text="stopping\n", status=503)
        return web.Response(text="ok\n")

    async def metrics_page(self, request: web.Request) -> web.Response:
        if self.metrics is None:
            raise web.HTTPNotFound(text="metrics are not served here\n")
        body, content_type = await self.metrics()
        return web.Response(body=body, headers={"Content-Type": content_type})

    # -- sign-in ----------------------------------------------------------------------

    async def login_form(self, request: web.Request) -> web.Response:
        return self.render(request, "login.html", title="Sign in", next=safe_next(request.query.get("next")),
                           message="")

    async def login(self, request: web.Request) -> web.StreamResponse:
        form = await self._form(request)
        token, target = form.get("token", "").strip(), safe_next(form.get("next"))
        if not self.access.enabled:
            raise web.HTTPSeeOther(target)
        refusal = self.access.refusal(token or None, READ_METHOD)
        if refusal is not None:
            return self.render(request, "login.html", status=refusal[0], title="Sign in", next=target,
                               message="That token is not known to this server." if refusal[0] == 401
                               else "That token may not read the console (it needs the role submit or admin).")
        resp = web.HTTPSeeOther(target)
        resp.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="Strict", path="/", secure=is_https(request))
        return resp

    async def logout(self, request: web.Request) -> web.StreamResponse:
        await self._form(request)
        resp = web.HTTPSeeOther("/login")
        resp.del_cookie(TOKEN_COOKIE, path="/")
        return resp

    # -- runs -------------------------------------------------------------------------

    async def runs(self, request: web.Request) -> web.Response:
        q = request.query
        state = q.get("state", "")
        workflow = q.get("workflow", "").strip()
        id_prefix = q.get("id", "").strip()
        error = ""
        try:
            if state and state not in RUN_STATES:
                raise InvalidArgument(f"state: {state!r} is not a run state")
            created_after, created_before = views.when(q.get("from", ""), "from"), views.when(q.get("to", ""), "to")
            after = views.cursor(q.get("after", ""))
            rows = await self.engine.list_runs(states=[state] if state else [], workflow=workflow or None,
                                               created_after=created_after, created_before=created_before,
                                               limit=PAGE_SIZE + 1, after=after, steps=True, id_prefix=id_prefix)
        except InvalidArgument as e:  # a filter the form sent: shown beside the form
            rows, error = [], e.message
        now = views.now()
        more = len(rows) > PAGE_SIZE
        rows = rows[:PAGE_SIZE]
        filters = {k: q[k] for k in ("state", "workflow", "from", "to", "id") if q.get(k)}
        next_url = ""
        if more:
            last = rows[-1]
            next_url = "/runs?" + urlencode({**filters, "after": f"{last['created_at'].isoformat()}|{last['id']}"})
        names = sorted({w["name"] for w in await self.engine.list_workflows()})
        return self.render(request, "runs.html", title="Runs", runs=[run_summary(r, now) for r in rows],
                           states=RUN_STATES, filters=filters, q=q, error=error, next_url=next_url,
                           first_url="/runs?" + urlencode(filters) if q.get("after") else "",
                           workflow_names=names, page_size=PAGE_SIZE)

    async def _load_run(self, request: web.Request) -> dict[str, Any]:
        run_id = request.match_info["run_id"]
        try:
            return await self.engine.get_run(run_id)
        except (InvalidArgument, NotFound) as e:
            raise self._error(request, 404, e.message) from None

    def _run_context(self, request: web.Request, run: dict[str, Any], notice: dict[str, Any] | None = None
                     ) -> dict[str, Any]:
        now = views.now()
        summary = run_summary(run, now)
        title = summary["workflow"] or summary["job_kind"] or "run"
        return {"title": f"{title} {summary['id']}", "run": summary, "run_title": title,
                "graph": graph.svg(graph.from_steps(run["steps"]), title=f"run {summary['id']}")
                if len(run["steps"]) <= MAX_DRAWN_NODES else "",
                "steps": [step_view(s, now) for s in run["steps"]], "bars": timeline(run, now),
                "input": fmt_json(run.get("input")), "result": fmt_json(run["result"])
                if run.get("result") is not None else "",
                "notice": notice, "can_act": self._act_refusal(request) is None, "poll_ms": POLL_MS,
                "actions": ACTIONS}

    async def run(self, request: web.Request) -> web.Response:
        run = await self._load_run(request)
        return self.render(request, "run.html", **self._run_context(request, run))

    async def run_live(self, request: web.Request) -> web.Response:
        """The run page's parts, rendered again: the page's script swaps them in once a second."""
        run = await self._load_run(request)
        ctx = self._run_context(request, run)
        env_globals = {"csrf": request["csrf"], "auth_enabled": self.access.enabled, "max_drawn": MAX_DRAWN_NODES,
                       "signed_in": request["signed_in"], "path": request.path, "server_id": self.server_id}
        parts = {name: self.env.get_template(f"_run_{name}.html").render(**env_globals, **ctx)
                 for name in ("summary", "actions", "graph", "steps", "timeline", "io")
                 if name != "actions" or ctx["can_act"]}
        return web.json_response({"state": run["state"], "terminal": ctx["run"]["terminal"], "parts": parts},
                                 headers={"Cache-Control": "no-store"})

    async def action(self, request: web.Request) -> web.Response:
        form = await self._form(request)
        action = request.match_info["action"]
        run_id = request.match_info["run_id"]
        if action not in ACTIONS:
            raise self._error(request, 404, f"no action {action!r}")
        refusal = self._act_refusal(request)
        if refusal is not None:
            raise self._error(request, 403, refusal)
        run = await self._load_run(request)
        fields = {k: form.get(k, "") for k in ("node", "name", "payload")}
        if action == "signal" and form.get("confirm") != "yes":
            try:
                views.payload(fields["payload"])
            except InvalidArgument as e:  # refused before the confirmation: nothing to confirm
                notice = {"ok": False, "text": f"{ACTIONS[action]}: refused by the server (INVALID_ARGUMENT): "
                                               f"{e.message}"}
                return self.render(request, "run.html", status=400, **self._run_context(request, run, notice))
        if form.get("confirm") != "yes":
            return self.render(request, "confirm.html", title=ACTIONS[action], action=action,
                               label=ACTIONS[action], help=ACTION_HELP[action], run=run_summary(run, views.now()),
                               fields=fields)
        status, notice = 200, await self._perform(action, run_id, fields)
        if not notice["ok"]:
            status = notice.pop("http_status")
        try:
            run = await self.engine.get_run(run_id)
        except NotFound:
            raise self._error(request, 404, f"{notice['text']} (the run is gone now)") from None
        return self.render(request, "run.html", status=status, **self._run_context(request, run, notice))

    async def _perform(self, action: str, run_id: str, fields: Mapping[str, str]) -> dict[str, Any]:
        """Do the action through the engine; the server's answer in words."""
        label = ACTIONS[action]
        try:
            if action == "signal":
                payload = views.payload(fields.get("payload", ""))
                signal_id, consumed_by = await self.engine.signal(run_id, fields.get("name", "").strip(), payload)
                taken = "taken at once by a waiting signal node" if consumed_by else \
                    "kept in the run's mailbox until a signal node waits for it"
                return {"ok": True, "applied": True,
                        "text": f"{label}: signal {fields.get('name', '').strip()!r} delivered (id {signal_id}), {taken}."}
            if action == "cancel":
                applied = await self.engine.cancel_run(run_id)
            elif action == "pause":
                applied = await self.engine.pause_run(run_id)
            elif action == "resume":
                applied = await self.engine.resume_run(run_id)
            elif action == "retry-all":
                applied = await self.engine.retry(run_id, None)
            else:
                node = fields.get("node", "").strip()
                if not node:
                    raise InvalidArgument("node: required")
                applied = await self.engine.retry(run_id, node)
        except CycloneError as e:
            code = e.status.name if isinstance(e.status, grpc.StatusCode) else str(e.status)
            return {"ok": False, "http_status": _HTTP_OF.get(e.status, 500),
                    "text": f"{label}: refused by the server ({code}): {e.message}"}
        run = await self.engine.get_run(run_id, steps=False)
        state = run["state"]
        if applied:
            return {"ok": True, "applied": True, "text": f"{label}: done. The run is now {state}."}
        return {"ok": True, "applied": False,
                "text": f"{label}: nothing to do, the server left the run as it was ({state})."}

    # -- workflows and workers -------------------------------------------------------

    async def workflows(self, request: web.Request) -> web.Response:
        rows = await self.engine.list_workflows(all_versions=True)
        latest: dict[str, dict[str, Any]] = {}
        versions: dict[str, list[int]] = {}
        for row in rows:
            versions.setdefault(row["name"], []).append(row["version"])
            if row["version"] >= latest.get(row["name"], {"version": 0})["version"]:
                latest[row["name"]] = row
        items = []
        for name in sorted(latest):
            row = latest[name]
            nodes = row["definition"]["nodes"]
            items.append({"name": name, "version": row["version"], "versions": sorted(versions[name], reverse=True),
                          "nodes": len(nodes), "created": fmt_time(row["created_at"]),
                          "graph": graph.svg(graph.from_definition(nodes), title=f"workflow {name}")
                          if len(nodes) <= MAX_DRAWN_NODES else ""})
        return self.render(request, "workflows.html", title="Workflows", workflows=items)

    async def workflow(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        try:
            version = int(request.query.get("version", "0") or 0)
            row = await self.engine.get_workflow(name, version)
        except ValueError:
            raise self._error(request, 400, "version: not a number") from None
        except CycloneError as e:
            raise self._error(request, 404, e.message) from None
        versions = sorted((w["version"] for w in await self.engine.list_workflows(all_versions=True)
                           if w["name"] == name), reverse=True)
        nodes = row["definition"]["nodes"]
        return self.render(request, "workflow.html", title=f"Workflow {name}", name=name, version=row["version"],
                           versions=versions, created=fmt_time(row["created_at"]), nodes=nodes,
                           graph=graph.svg(graph.from_definition(nodes), title=f"workflow {name}")
                           if len(nodes) <= MAX_DRAWN_NODES else "",
                           definition=fmt_json(row["definition"]))

    async def workers(self, request: web.Request) -> web.Response:
        # "stalled": steps wait to be claimed and no connected worker (of any server) runs the kind.
        kinds = [{"kind": k["kind"], "available": k["available"], "scheduled": k.get("scheduled", 0),
                  "running": k["running"], "oldest": fmt_seconds(k["oldest_available_age"]),
                  "workers": k.get("workers", 0), "free_slots": k.get("free_slots", 0),
                  "stalled": kind_without_workers(k)}
                 for k in await self.engine.stats()]
        now = views.now()
        workers = [{**w, "kinds": ", ".join(w["kinds"]), "connected": fmt_time(w["connected_at"]),
                    "heartbeat": fmt_seconds(max((now - w["heartbeat_at"]).total_seconds(), 0.0)) + " ago"}
                   for w in await self.engine.list_workers()]
        return self.render(request, "workers.html", title="Workers and backlog", kinds=kinds, workers=workers)

    async def limits(self, request: web.Request) -> web.Response:
        # What Limits/ListLimits answers, for the tokens that may call it.
        refusal = self.access.refusal(request["token"], LIMITS_METHOD)
        if refusal is not None:
            raise self._error(request, *refusal)
        rows = await self.engine.list_limits()
        return self.render(request, "limits.html", title="Limits", limits=[limit_view(r) for r in rows])

    # -- schedules -------------------------------------------------------------------

    async def schedules(self, request: web.Request) -> web.Response:
        q = request.query
        prefix = q.get("name", "").strip()
        after = q.get("after", "") or None
        rows = await self.engine.list_schedules(prefix, limit=PAGE_SIZE + 1, after=after)
        more = len(rows) > PAGE_SIZE
        rows = rows[:PAGE_SIZE]
        filters = {"name": prefix} if prefix else {}
        next_url = "/schedules?" + urlencode({**filters, "after": rows[-1]["name"]}) if more else ""
        return self.render(request, "schedules.html", title="Schedules", schedules=[schedule_view(r) for r in rows],
                           filters=filters, q=q, next_url=next_url,
                           first_url="/schedules?" + urlencode(filters) if after else "", page_size=PAGE_SIZE)

    async def _load_schedule(self, request: web.Request) -> dict[str, Any]:
        try:
            return await self.engine.get_schedule(request.match_info["name"])
        except (InvalidArgument, NotFound) as e:
            raise self._error(request, 404, e.message) from None

    def _schedule_context(self, request: web.Request, row: dict[str, Any], notice: dict[str, Any] | None = None,
                          confirm: str = "") -> dict[str, Any]:
        runs = [{"id": str(r["id"]), "state": r["state"], "fire_at": fmt_time(r.get("schedule_fire_at")),
                 "created": fmt_time(r["created_at"]), "finished": fmt_time(r.get("finished_at"))}
                for r in row.get("recent_runs") or []]
        return {"title": f"Schedule {row['name']}", "schedule": schedule_view(row), "runs": runs, "notice": notice,
                "can_act": self._act_refusal(request) is None, "actions": SCHEDULE_ACTIONS, "confirm": confirm,
                "confirm_help": SCHEDULE_ACTION_HELP.get(confirm, "")}

    async def schedule(self, request: web.Request) -> web.Response:
        row = await self._load_schedule(request)
        return self.render(request, "schedule.html", **self._schedule_context(request, row))

    async def schedule_action(self, request: web.Request) -> web.Response:
        form = await self._form(request)
        action = request.match_info["action"]
        name = request.match_info["name"]
        if action not in SCHEDULE_ACTIONS:
            raise self._error(request, 404, f"no action {action!r}")
        refusal = self._act_refusal(request)
        if refusal is not None:
            raise self._error(request, 403, refusal)
        row = await self._load_schedule(request)
        if form.get("confirm") != "yes":
            return self.render(request, "schedule.html", **self._schedule_context(request, row, confirm=action))
        status, notice = 200, await self._perform_schedule(action, name)
        if not notice["ok"]:
            status = notice.pop("http_status")
        try:
            row = await self.engine.get_schedule(name)
        except NotFound:
            raise self._error(request, 404, f"{notice['text']} (the schedule is gone now)") from None
        return self.render(request, "schedule.html", status=status, **self._schedule_context(request, row, notice))

    async def _perform_schedule(self, action: str, name: str) -> dict[str, Any]:
        """Do the schedule action through the engine; the server's answer in words."""
        label = SCHEDULE_ACTIONS[action]
        try:
            if action == "trigger":
                fired = await self.engine.trigger_schedule(name)
                outcome, run_id = fired["outcome"], str(fired["run_id"]) if fired.get("run_id") else ""
                if outcome == "started":
                    return {"ok": True, "applied": True, "run_id": run_id,
                            "text": f"{label}: done. Run {run_id} started."}
                if outcome == "buffered":
                    return {"ok": True, "applied": True, "run_id": "",
                            "text": f"{label}: buffered. A run of this schedule is still active: the fire time "
                                    "starts when it ends (overlap policy buffer_one)."}
                if outcome != "skipped":
                    return {"ok": True, "applied": False, "run_id": "", "text": f"{label}: {outcome}."}
                # Skipped under skip, or under buffer_one with a fire time buffered already.
                policy = (await self.engine.get_schedule(name, recent_runs=0))["overlap"]
                why = (" and a fire time is buffered already" if policy == "buffer_one" else "")
                return {"ok": True, "applied": False, "run_id": "",
                        "text": f"{label}: skipped. A run of this schedule is still active{why}, so the server "
                                f"started none (overlap policy {policy})."}
            applied = await (self.engine.pause_schedule(name) if action == "pause"
                             else self.engine.resume_schedule(name))
        except CycloneError as e:
            code = e.status.name if isinstance(e.status, grpc.StatusCode) else str(e.status)
            return {"ok": False, "http_status": _HTTP_OF.get(e.status, 500),
                    "text": f"{label}: refused by the server ({code}): {e.message}"}
        row = await self.engine.get_schedule(name, recent_runs=0)
        state = "paused" if row["paused"] else "active"
        if applied:
            after = "" if row["paused"] else (f" Next fire time: {fmt_time(row['next_fire_at'])} UTC."
                                              if row.get("next_fire_at") else " It has no fire time left.")
            return {"ok": True, "applied": True, "run_id": "",
                    "text": f"{label}: done. The schedule is now {state}.{after}"}
        return {"ok": True, "applied": False, "run_id": "",
                "text": f"{label}: nothing to do, the server left the schedule as it was ({state})."}


_STATUS_EXC: dict[int, type[web.HTTPException]] = {
    400: web.HTTPBadRequest, 401: web.HTTPUnauthorized, 403: web.HTTPForbidden, 404: web.HTTPNotFound,
    409: web.HTTPConflict, 503: web.HTTPServiceUnavailable,
}
_HTTP_OF = {grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.NOT_FOUND: 404, grpc.StatusCode.UNAVAILABLE: 503,
            grpc.StatusCode.FAILED_PRECONDITION: 409, grpc.StatusCode.ALREADY_EXISTS: 409}


class HttpServer:
    """The console's site on HOST:PORT (port 0: any free port); `address` is the bound one."""

    def __init__(self, runner: web.AppRunner, site: web.TCPSite, host: str, port: int, *, tls: bool = False) -> None:
        self.runner, self.site, self.host, self.port, self.tls = runner, site, host, port, tls

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    async def close(self) -> None:
        await self.runner.cleanup()


class OneLineBadRequests(logging.Filter):
    """aiohttp logs a request it cannot parse (a URL over 8 KiB, a malformed header line) at
    ERROR with a traceback, once per request: a client's error, and anyone can send it. It
    becomes one WARNING line, with the reason cut short."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            peer = record.getMessage().removeprefix("Error handling request from ")
            reason = " ".join(str(error.message).split())
            record.msg, record.args = "console: refused a request from %s that HTTP cannot read (%d): %s", (
                peer[:100], error.code, reason[:160] + ("..." if len(reason) > 160 else ""))
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


async def serve_console(console: Console, host: str, port: int, *, reuse_port: bool = False,
                        ssl_context: ssl.SSLContext | None = None) -> HttpServer:
    """Start the console's site (HTTPS with `ssl_context`); `reuse_port` for `--processes N`, whose
    processes share the port."""
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, OneLineBadRequests) for f in server_log.filters):
        server_log.addFilter(OneLineBadRequests())
    runner = web.AppRunner(console.app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host.strip("[]"), port, reuse_address=True, reuse_port=reuse_port or None,
                       ssl_context=ssl_context)
    await site.start()
    server = getattr(site, "_server", None)
    bound = port
    if server is not None and server.sockets:
        bound = server.sockets[0].getsockname()[1]
    server_ = HttpServer(runner, site, host, bound, tls=ssl_context is not None)
    log.info("console on %s/ (metrics at /metrics, health at /healthz)", server_.url)
    return server_


__all__ = ["Console", "HttpServer", "serve_console"]
