"""What the fuzz tests share: hypothesis strategies built from the proto descriptors, one
server per test module, and a canary worker that must keep completing jobs throughout.

Requests are generated from their message descriptors, field by field, so a field added to
a .proto is fuzzed without editing anything here. Messages are filled in place: copying a
deeply nested Value into another message makes protobuf parse it, which fails by design.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st
from psycopg import sql

from cyclone_server.convert import py_to_value, to_duration
from cyclone_worker import Context, Worker
from cyclone_proto import runs_pb2, runs_pb2_grpc, types_pb2

from rpc_descriptors import DURATION, TIMESTAMP

Filler = Callable[[Message], None]  # fills one (sub)message in place

# -- ids the fuzz may aim at -----------------------------------------------------------

# Run and step ids that exist (filled as the module runs): a valid-looking id that names
# something reaches further into the server than a random one.
KNOWN_IDS: list[str] = []
KNOWN_NAMES = ["fz", "fz-wait", "canary", "fz-job", "a", "go", "sig", "w"]


def known_id(i: int) -> str:
    return KNOWN_IDS[i % len(KNOWN_IDS)] if KNOWN_IDS else str(uuid.UUID(int=i))


# -- scalars ---------------------------------------------------------------------------

INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1), FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1), FieldDescriptor.TYPE_ENUM: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1), FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1), FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1), FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


EDGES = (0, 1, -1, 2, 1000, 2**31 - 1, -(2**31), 2**32 - 1, 2**53, 2**62, 2**63 - 1, -(2**63), 2**64 - 1)


def ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    """The type's extremes and the usual suspects, small numbers, and anything in range."""
    edges = sorted({lo, hi, *(v for v in EDGES if lo <= v <= hi)})
    return st.one_of(st.sampled_from(edges), st.integers(max(lo, -3), min(hi, 100)), st.integers(lo, hi))


def texts() -> st.SearchStrategy[str]:
    """Names, ids (known, random, malformed), unicode, NUL characters and huge strings."""
    return st.one_of(
        st.sampled_from(KNOWN_NAMES),
        st.integers(0, 10**9).map(known_id),
        st.uuids().map(str),
        st.text(max_size=20),
        st.text(alphabet=st.characters(codec="utf-8"), max_size=50),
        st.text(max_size=10).map(lambda s: s + "\x00" + s),
        st.sampled_from(["", " ", "a b", "\u202e", "é" * 300, "x" * 257, "00000000-0000-0000-0000-000000000000",
                         "01900000-0000-7000-8000-00000000000", "../../etc", "%", "_", "\ud7ff\ue000\U0010ffff"]),
        st.sampled_from([300_000, 1_100_000]).map(lambda n: "y" * n),  # near and over the payload limit
    )


# -- JSON payloads ---------------------------------------------------------------------

_scalars = st.one_of(st.none(), st.booleans(), st.floats(), st.integers(-(2**63), 2**63), texts())
JSON = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(texts(), inner, max_size=4)), max_leaves=12)


def nested(depth: int, kind: str) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    return value


JSON_VALUES = st.one_of(JSON, st.builds(nested, st.integers(1, 60), st.sampled_from(["list", "dict"])))


def _fill_json(strategy: st.SearchStrategy[Any], kind: str) -> st.SearchStrategy[Filler]:
    def filler(value: Any) -> Filler:
        def fill(msg: Message) -> None:
            if kind == "value":
                py_to_value(value, msg)  # type: ignore[arg-type]
            elif kind == "struct":
                for k, v in (value if isinstance(value, dict) else {"v": value}).items():
                    py_to_value(v, msg.fields[k])  # type: ignore[attr-defined]
            else:
                for v in value if isinstance(value, list) else [value]:
                    py_to_value(v, msg.values.add())  # type: ignore[attr-defined]
        return fill
    return strategy.map(filler)


# -- times -----------------------------------------------------------------------------

SECONDS = st.one_of(ints(-(2**63), 2**63 - 1), st.sampled_from([
    315_576_000_000, 315_576_000_001, -315_576_000_000, -62_135_596_800, -62_135_596_801, 253_402_300_799,
    253_402_300_800, 3_155_760_000, 3_162_240_000, int(time.time()), int(time.time()) + 3600,
    int(time.time()) - 3600]), st.integers(-10, 100_000))
NANOS = st.one_of(ints(-(2**31), 2**31 - 1), st.sampled_from([0, 999_999_999, 10**9, -1, -999_999_999]))


def _fill_time() -> st.SearchStrategy[Filler]:
    def filler(pair: tuple[int, int]) -> Filler:
        def fill(msg: Message) -> None:
            msg.seconds, msg.nanos = pair  # type: ignore[attr-defined]
        return fill
    return st.tuples(SECONDS, NANOS).map(filler)


# -- messages --------------------------------------------------------------------------

def scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    t = field.type
    if t in INT_RANGES:
        if t == FieldDescriptor.TYPE_ENUM:
            return st.one_of(st.sampled_from([v.number for v in field.enum_type.values]), ints(*INT_RANGES[t]))
        return ints(*INT_RANGES[t])
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(width=64 if t == FieldDescriptor.TYPE_DOUBLE else 32)
    if t == FieldDescriptor.TYPE_STRING:
        # Mostly what the field expects, so that requests get past the first check.
        if field.name.endswith("id") or field.name.endswith("ids"):
            return st.one_of(st.integers(0, 10**9).map(known_id), texts())
        if field.name in ("name", "kind", "kinds", "workflow", "node", "signal", "deps", "name_prefix"):
            return st.one_of(st.sampled_from(KNOWN_NAMES), texts())
        return texts()
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    raise AssertionError(f"no strategy for {field.full_name} (type {t})")


def fillers(descriptor: Descriptor, depth: int = 0,
            overrides: dict[str, st.SearchStrategy[Filler]] | None = None) -> st.SearchStrategy[Filler]:
    """Fillers of a message: each field left unset or set to a generated value (repeated: a few)."""
    name = descriptor.full_name
    if name in (DURATION, TIMESTAMP):
        return _fill_time()
    if name == "google.protobuf.Value":
        return _fill_json(JSON_VALUES, "value")
    if name == "google.protobuf.Struct":
        return _fill_json(JSON_VALUES, "struct")
    if name == "google.protobuf.ListValue":
        return _fill_json(JSON_VALUES, "list")
    parts = {}
    for field in descriptor.fields:
        parts[field.name] = (overrides or {}).get(field.name) or _field(field, depth)
    if not parts:
        return st.just(_fill_fields({}))
    # One or two fields set (a request that is otherwise plain gets further into the
    # server), or any of them.
    sparse = st.lists(st.sampled_from(sorted(parts)), min_size=1, max_size=2, unique=True).flatmap(
        lambda names: st.fixed_dictionaries({n: parts[n] for n in names}))
    return st.one_of(sparse, st.fixed_dictionaries({}, optional=parts)).map(_fill_fields)


def _field(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        if field.message_type.GetOptions().map_entry:
            key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
            inner = st.just(lambda m: None) if value.type == FieldDescriptor.TYPE_MESSAGE else scalar(value)
            return st.dictionaries(scalar(key), inner, max_size=3).map(lambda d: ("map", d))
        if depth > 3:
            return st.just(("message", [lambda m: None]))
        one = fillers(field.message_type, depth + 1)
        if field.is_repeated:  # a few, or more than any limit (empty ones but the first)
            many = one.map(lambda f: [f] + [lambda m: None] * 1000)
            return st.one_of(st.lists(one, max_size=3), many).map(lambda fs: ("message", fs))
        return one.map(lambda f: ("message", [f]))
    values = scalar(field)
    if field.is_repeated:
        return st.lists(values, max_size=4).map(lambda vs: ("scalars", vs))
    return values.map(lambda v: ("scalar", v))


def _fill_fields(chosen: dict[str, tuple[str, Any]]) -> Filler:
    def fill(msg: Message) -> None:
        for name, (how, value) in chosen.items():
            field = msg.DESCRIPTOR.fields_by_name[name]
            if how == "scalar":
                setattr(msg, name, value)
            elif how == "scalars":
                getattr(msg, name).extend(value)
            elif how == "map":
                container = getattr(msg, name)
                for k, v in value.items():
                    if callable(v):
                        container[k]
                    else:
                        container[k] = v
            elif field.is_repeated:
                for f in value:
                    f(getattr(msg, name).add())
            else:
                sub = getattr(msg, name)
                sub.SetInParent()
                value[0](sub)
    return fill


def messages(cls: type[Message], **overrides: st.SearchStrategy[Filler]) -> st.SearchStrategy[Message]:
    """Messages of `cls`, generated from its descriptor."""
    def build(fill: Filler) -> Message:
        msg = cls()
        fill(msg)
        return msg
    return fillers(cls.DESCRIPTOR, overrides=overrides or None).map(build)


def _mutate(how: str, at: float, xor: int, garbage: bytes) -> Callable[[bytes], bytes]:
    def mutate(raw: bytes) -> bytes:
        i = int(at * len(raw))
        if how == "cut" and raw:
            return raw[:i]
        if how == "flip" and raw:
            return raw[:i] + bytes([raw[i] ^ xor]) + raw[i + 1:]
        return raw + garbage
    return mutate


def mutations() -> st.SearchStrategy[Callable[[bytes], bytes]]:
    """Functions that cut a message's bytes short, change one byte, or append garbage."""
    return st.builds(_mutate, st.sampled_from(["cut", "flip", "append"]), st.floats(0, 1, exclude_max=True),
                     st.integers(1, 255), st.binary(min_size=1, max_size=16))


# -- one server per module, and the canary -----------------------------------------------

def _server_proc_class() -> Any:
    # The acceptance conftest's ServerProc, loaded by path: "conftest" names several modules.
    spec = importlib.util.spec_from_file_location("_cyclone_acceptance_conftest",
                                                  Path(__file__).with_name("conftest.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ServerProc


@contextlib.contextmanager
def module_server(pg_admin_url: str, template_dbname: str, db_url_for: Callable[[str], str], workdir: Path,
                  extra_args: Sequence[str] = ()) -> Iterator[Any]:
    """A server on a database of its own (dropped after), with a canary worker connected;
    its log is printed when the block fails."""
    name = f"cyclone_fuzz_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template_dbname)))
    srv = _server_proc_class()(db_url_for(name), workdir,
                               ["--lease-ttl", "3", "--sweep-interval", "0.2", *extra_args]).start()
    srv.canary = Canary(srv.address)
    try:
        yield srv
        srv.canary.check()
    except BaseException:
        print(srv.log_text()[-20_000:])
        raise
    finally:
        srv.canary.close()
        srv.kill()
        KNOWN_IDS.clear()
        with psycopg.connect(pg_admin_url, autocommit=True) as c:
            c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="module")
def fuzz_server(pg_admin_url: str, template_dbname: str, db_url_for: Callable[[str], str],
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A server on a database of this module's own, with a canary worker connected."""
    with module_server(pg_admin_url, template_dbname, db_url_for, tmp_path_factory.mktemp("fuzz-server")) as srv:
        yield srv


class Canary:
    """A real SDK worker, in a thread of its own, that must keep completing jobs.

    `check()` enqueues one job and waits until it completes: the server still serves.
    """

    KIND = "canary"

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.runs = runs_pb2_grpc.RunsStub(self.channel)
        self.completed = 0
        self.worker = Worker(address, slots=2, worker_id="canary")

        @self.worker.handler(self.KIND)
        async def echo(ctx: Context) -> Any:
            return {"echo": ctx.input}

        self._thread = threading.Thread(target=lambda: asyncio.run(self.worker.run()), name="canary", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.worker.connected:
            assert time.monotonic() < deadline and self._thread.is_alive(), "the canary worker did not connect"
            time.sleep(0.02)

    def check(self) -> None:
        job = self.runs.Enqueue(runs_pb2.EnqueueRequest(kind=self.KIND, input=py_to_value(self.completed)), timeout=10)
        run_id = job.run_id
        KNOWN_IDS.extend([run_id, job.step_id])
        answer = self.runs.WaitRun(runs_pb2.WaitRunRequest(run_id=run_id, timeout=to_duration(30)), timeout=40)
        assert answer.run.state == types_pb2.RUN_STATE_COMPLETED, f"the canary job did not complete: {answer.run}"
        self.completed += 1

    def close(self) -> None:
        self.worker.stop()
        self._thread.join(30)
        self.channel.close()
