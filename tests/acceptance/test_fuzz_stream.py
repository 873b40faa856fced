"""Fuzz of Workers/Connect message sequences: a stream answers every result or ends INVALID_ARGUMENT.

Each example enqueues a job of the stream's kind, opens a stream, says Hello, waits for the
lease, then sends generated WorkerMessages and half-closes. Results aim at that live lease
or at known and random step ids with extreme generations, and carry out-of-range and huge
durations (Snoozed.delay, Failed.retry_delay), NUL characters, deep and huge outputs;
some messages are generated from the WorkerMessage descriptor as a whole, some are bytes
that do not parse, and once in a while one is over the message limit. The stream must
then end OK with one ack per StepResult sent, or INVALID_ARGUMENT (a protocol violation);
never INTERNAL, UNKNOWN or anything else. Afterwards a real SDK worker must complete a
canary job. One server for the module; bounded in examples.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cyclone_proto import runs_pb2, runs_pb2_grpc
from cyclone_proto import workers_pb2 as pb

from fuzz_helpers import fillers, fuzz_server, ints, known_id, messages, mutations, texts  # noqa: F401

CONNECT = "/cyclone.v1.Workers/Connect"
KIND = "fuzz-stream"  # only these streams take this kind; the canary worker takes its own
STREAM_TIMEOUT = 30.0
LEASE_WAIT = 5.0

Lease = tuple[str, int] | None  # (step_id, lease_generation) of the lease the stream got
Body = Callable[[Lease], bytes]
OUTCOMES = {"completed": pb.Completed, "failed": pb.Failed, "snoozed": pb.Snoozed}


@st.composite
def step_results(draw: Any) -> Callable[[Any, Lease], None]:
    """Adds one StepResult to a Results message: at the live lease or at some id, with any outcome."""
    which = draw(st.sampled_from([*OUTCOMES, None]))
    fill = draw(fillers(OUTCOMES[which].DESCRIPTOR)) if which else None
    aim = draw(st.booleans())
    step_id = draw(st.one_of(st.integers(0, 10**9).map(known_id), st.uuids().map(str), texts()))
    generation = draw(ints(-(2**63), 2**63 - 1))

    def add(results: Any, lease: Lease) -> None:
        r = results.add()
        r.step_id, r.lease_generation = lease if aim and lease is not None else (step_id, generation)
        if which is not None and fill is not None:
            outcome = getattr(r, which)
            outcome.SetInParent()
            fill(outcome)
    return add


def _results_body(adds: list[Callable[[Any, Lease], None]]) -> Body:
    def body(lease: Lease) -> bytes:
        msg = pb.WorkerMessage()
        msg.results.SetInParent()
        for add in adds:
            add(msg.results.results, lease)
        return msg.SerializeToString()
    return body


HUGE = pb.WorkerMessage()
HUGE.results.results.add(step_id="01900000-0000-7000-8000-000000000001", lease_generation=1) \
    .completed.output.string_value = "z" * (10 << 20)  # over the server's message limit (about 9 MiB)


@st.composite
def bodies(draw: Any) -> Body:
    """One message of the sequence, as a function of the live lease."""
    pick = draw(st.integers(1, 30))
    if pick == 30:
        body: Body = lambda lease: HUGE.SerializeToString()  # noqa: E731
    elif pick <= 20:
        body = _results_body(draw(st.lists(step_results(), min_size=1, max_size=3)))
    else:
        generic = draw(messages(pb.WorkerMessage)).SerializeToString()
        body = lambda lease: generic  # noqa: E731
    if draw(st.integers(1, 10)) == 10:
        mutate = draw(mutations())
        return lambda lease: mutate(body(lease))
    return body


def hellos(n: int) -> st.SearchStrategy[pb.Hello]:
    """Mostly a valid Hello (so that results follow); one in ten generated from the descriptor."""
    valid = st.integers(1, 4).map(lambda slots: pb.Hello(worker_id=f"fuzz-{n}", kinds=[KIND], slots=slots))
    return st.integers(1, 10).flatmap(lambda i: messages(pb.Hello) if i == 10 else valid)


def expected(raw: list[bytes]) -> tuple[int, bool]:
    """StepResults sent after Hello, and whether the sequence is a protocol violation."""
    results = 0
    for body in raw[1:]:
        try:
            msg = pb.WorkerMessage.FromString(body)
        except DecodeError:
            return results, True
        if msg.WhichOneof("msg") == "hello":
            return results, True
        results += len(msg.results.results)
    return results, False


_examples = iter(range(10**9))


@settings(max_examples=80, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(data=st.data())
def test_worker_streams_answer_every_result_or_end_invalid_argument(fuzz_server: Any, data: st.DataObject) -> None:
    hello = pb.WorkerMessage(hello=data.draw(hellos(next(_examples)), label="hello"))
    plan = data.draw(st.lists(bodies(), max_size=4), label="messages")
    leases: queue.Queue[Lease] = queue.Queue()
    raw: list[bytes] = []

    def requests() -> Iterator[bytes]:  # grpc runs this in a thread of its own
        raw.append(hello.SerializeToString())
        yield raw[0]
        try:
            lease = leases.get(timeout=LEASE_WAIT)
        except queue.Empty:
            lease = None
        for body in plan:
            raw.append(body(lease))
            yield raw[-1]
        # Then half-close: the server acks what it got and ends the stream.

    with grpc.insecure_channel(fuzz_server.address, options=[("grpc.max_send_message_length", -1)]) as channel:
        runs_pb2_grpc.RunsStub(channel).Enqueue(runs_pb2.EnqueueRequest(kind=KIND), timeout=10)
        connect = channel.stream_stream(CONNECT, request_serializer=None,
                                        response_deserializer=pb.ServerMessage.FromString)
        welcomed, acks, code, details = False, 0, grpc.StatusCode.OK, ""
        try:
            for answer in connect(requests(), timeout=STREAM_TIMEOUT):
                welcomed |= answer.HasField("welcome")
                acks += len(answer.acks.acks)
                for lease in answer.leases.leases:
                    leases.put((lease.step_id, lease.lease_generation))
        except grpc.RpcError as e:
            code, details = e.code(), e.details() or ""
        finally:
            leases.put(None)
    results, violation = expected(raw)
    what = f"{code.name} {details[:300]!r} after {acks} acks of {results} results; messages {raw!r:.1500}"
    if code == grpc.StatusCode.OK:
        assert welcomed and not violation and acks == results, what
    else:
        assert code == grpc.StatusCode.INVALID_ARGUMENT, what
    fuzz_server.canary.check()
