package worker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cyclone-workflows/cyclone/sdks/go/client"
	"github.com/cyclone-workflows/cyclone/sdks/go/cyclonepb"
	"github.com/cyclone-workflows/cyclone/sdks/go/internal/jsonv"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
)

func TestHelloNamesTheWorkerItsKindsSlotsAndToken(t *testing.T) {
	f := startFake(t)
	w, _ := newWorker(t, f.addr, Options{Slots: 3, WorkerID: "w-hello", Token: "s3cret"})
	w.Handle("resize", func(context.Context, *Lease) (any, error) { return nil, nil })
	w.Handle("crop", func(context.Context, *Lease) (any, error) { return nil, nil })
	run(t, w)
	fs, hello := f.welcome(t, 0)
	if hello.WorkerId != "w-hello" || hello.Slots != 3 || hello.Sdk != "go/0.1.0" || len(hello.Held) != 0 {
		t.Fatalf("hello: %v", hello)
	}
	if fmt.Sprint(hello.Kinds) != "[crop resize]" {
		t.Fatalf("kinds: %v", hello.Kinds)
	}
	if got := fs.md.Get("authorization"); len(got) != 1 || got[0] != "Bearer s3cret" {
		t.Fatalf("authorization metadata: %v", got)
	}
	select {
	case <-w.Connected():
	case <-time.After(wait):
		t.Fatal("Connected() not closed after the Welcome")
	}
}

func TestACompletedLeaseSendsItsOutputAndEndsAtItsAck(t *testing.T) {
	f := startFake(t)
	w, _ := newWorker(t, f.addr, Options{})
	type in struct {
		N    int    `json:"n"`
		Name string `json:"name"`
	}
	seen := make(chan *Lease, 1)
	w.Handle("add", func(ctx context.Context, l *Lease) (any, error) {
		seen <- l
		var v in
		if err := l.DecodeInput(&v); err != nil {
			return nil, err
		}
		var parent struct{ Total int }
		if err := l.DecodeParent("prev", &parent); err != nil {
			return nil, err
		}
		return map[string]any{"sum": v.N + parent.Total, "html": "<b>&</b>"}, nil
	})
	run(t, w)
	fs, _ := f.welcome(t, 0)
	l := lease("s1", 7, "add")
	l.Input, _ = structpb.NewValue(map[string]any{"n": 41.0, "name": "x"})
	l.Parents, _ = structpb.NewStruct(map[string]any{"prev": map[string]any{"Total": 1.0}})
	l.Snoozes, l.Reclaims, l.Attempt, l.MaxAttempts = 2, 1, 3, 3
	fs.lease(l)
	r := fs.result()
	if r.StepId != "s1" || r.LeaseGeneration != 7 {
		t.Fatalf("ids: %v", r)
	}
	if got := string(jsonv.Compact(r.GetCompleted().GetOutput())); got != `{"html":"<b>&</b>","sum":42}` {
		t.Fatalf("output: %s", got)
	}
	got := <-seen
	if got.RunID != "run-s1" || got.Node != "add" || got.Snoozes != 2 || got.Reclaims != 1 || !got.LastAttempt() ||
		got.Input.(map[string]any)["n"] != 41.0 || got.WorkerID != "w-test" {
		t.Fatalf("lease: %+v", got)
	}
	if w.table.running() != 1 {
		t.Fatal("the lease is held until its ack")
	}
	fs.ack(r, cyclonepb.AckStatus_ACK_STATUS_APPLIED, "")
	eventually(t, "the ack to end the lease", func() bool { return w.table.running() == 0 })
	if w.Counts()["applied"] != 1 || w.Counts()["leases"] != 1 {
		t.Fatalf("counts: %v", w.Counts())
	}
}

func TestOutcomes(t *testing.T) {
	f := startFake(t)
	w, _ := newWorker(t, f.addr, Options{Slots: 10})
	w.Handle("permanent", func(context.Context, *Lease) (any, error) {
		return nil, Permanent(fmt.Errorf("bad input: %w", errors.New("no name")))
	})
	w.Handle("retry", func(context.Context, *Lease) (any, error) {
		return nil, RetryAfter(errors.New("rate limited"), 1500*time.Millisecond)
	})
	w.Handle("snooze", func(context.Context, *Lease) (any, error) { return nil, Snooze(30 * time.Second) })
	w.Handle("plain", func(context.Context, *Lease) (any, error) { return nil, errors.New("disk full") })
	w.Handle("panic", func(_ context.Context, l *Lease) (any, error) { explodeForTest(l.Node); return nil, nil })
	w.Handle("nan", func(context.Context, *Lease) (any, error) { return math.NaN(), nil })
	w.Handle("null", func(context.Context, *Lease) (any, error) { return nil, nil })
	run(t, w)
	fs, _ := f.welcome(t, 0)

	check := func(kind string) *cyclonepb.StepResult {
		t.Helper()
		fs.lease(lease("step-"+kind, 1, kind))
		r := fs.result()
		if r.StepId != "step-"+kind {
			t.Fatalf("%s: answered %s", kind, r.StepId)
		}
		return r
	}
	p := check("permanent").GetFailed()
	if !p.Permanent || p.Message != "bad input: no name" || p.RetryDelay != nil ||
		p.Details != "worker.permanentError: bad input: no name\n*fmt.wrapError: bad input: no name\n*errors.errorString: no name\n" {
		t.Fatalf("permanent: %v", p)
	}
	r := check("retry").GetFailed()
	if r.Permanent || r.Message != "rate limited" || r.RetryDelay.AsDuration() != 1500*time.Millisecond {
		t.Fatalf("retry: %v", r)
	}
	if s := check("snooze").GetSnoozed(); s == nil || s.Delay.AsDuration() != 30*time.Second {
		t.Fatalf("snooze: %v", s)
	}
	pl := check("plain").GetFailed()
	if pl.Permanent || pl.RetryDelay != nil || pl.Message != "disk full" || pl.Details != "*errors.errorString: disk full\n" {
		t.Fatalf("plain: %v", pl)
	}
	pa := check("panic").GetFailed()
	if pa.Permanent || pa.Message != "handler panicked: boom in panic" || !strings.Contains(pa.Details, "goroutine ") ||
		!strings.Contains(pa.Details, "explodeForTest") {
		t.Fatalf("panic: %v", pa)
	}
	n := check("nan").GetFailed()
	if !n.Permanent || !strings.HasPrefix(n.Message, "output is not JSON: output: json: unsupported value: NaN") {
		t.Fatalf("nan: %v", n)
	}
	if c := check("null").GetCompleted(); c == nil || string(jsonv.Compact(c.Output)) != "null" {
		t.Fatalf("null: %v", c)
	}
}

func explodeForTest(node string) { panic("boom in " + node) }

func TestALongFailureMessageIsCutWithinTheServersLimit(t *testing.T) {
	f := startFake(t)
	w, _ := newWorker(t, f.addr, Options{})
	w.Handle("long", func(context.Context, *Lease) (any, error) {
		return nil, errors.New(strings.Repeat("x", 100_000) + "\xff")
	})
	run(t, w)
	fs, _ := f.welcome(t, 0)
	fs.lease(lease("s", 1, "long"))
	failed := fs.result().GetFailed()
	if len(failed.Message) > maxMessageBytes || !strings.HasSuffix(failed.Message, " of 100003 bytes]") {
		t.Fatalf("message of %d bytes ending %q", len(failed.Message), failed.Message[len(failed.Message)-40:])
	}
	if len(failed.Details) > maxDetailsBytes || !strings.Contains(failed.Details, "... [cut at ") {
		t.Fatalf("details of %d bytes", len(failed.Details))
	}
}

func TestAnOutputOverTheLimitIsSentAsItsSizeMeasuredAsTheServerDoes(t *testing.T) {
	f := startFake(t)
	w, _ := newWorker(t, f.addr, Options{})
	w.Handle("big", func(_ context.Context, l *Lease) (any, error) {
		return map[string]string{"blob": strings.Repeat("x", 5000)}, nil
	})
	// Exactly at the limit of 1000 bytes of compact JSON: {"s":"<<<...>"} with 992 characters
	// that encoding/json would escape to 6 bytes each.
	w.Handle("html", func(_ context.Context, l *Lease) (any, error) {
		return map[string]string{"s": strings.Repeat("<", 992)}, nil
	})
	run(t, w)
	fs, _ := f.welcome(t, 1000)
	fs.lease(lease("big", 1, "big"))
	if c := fs.result().GetCompleted(); c.OversizedOutputBytes != 5011 || c.Output != nil {
		t.Fatalf("big: %v", c)
	}
	fs.lease(lease("html", 1, "html"))
	if c := fs.result().GetCompleted(); c.OversizedOutputBytes != 0 || jsonv.Size(c.Output) != 1000 {
		t.Fatalf("html: oversized %d", c.OversizedOutputBytes)
	}
}

func TestALeaseBiggerThanGRPCsDefault4MiBIsReceived(t *testing.T) {
	f := startFake(t)
	w, _ := newWorker(t, f.addr, Options{})
	w.Handle("pad", func(_ context.Context, l *Lease) (any, error) {
		return len(l.Input.(map[string]any)["pad"].([]any)), nil
	})
	run(t, w)
	fs, _ := f.welcome(t, 0)
	pad := make([]any, 600_000)
	for i := range pad {
		pad[i] = 1.0
	}
	l := lease("padded", 1, "pad")
	l.Input, _ = structpb.NewValue(map[string]any{"pad": pad})
	fs.lease(l)
	if out := fs.result().GetCompleted().GetOutput().GetNumberValue(); out != 600_000 {
		t.Fatalf("output %v", out)
	}
}

func TestPingIsAnsweredWithPong(t *testing.T) {
	f := startFake(t)
	w, _ := newWorker(t, f.addr, Options{})
	w.Handle("k", func(context.Context, *Lease) (any, error) { return nil, nil })
	run(t, w)
	fs, _ := f.welcome(t, 0)
	fs.send(&cyclonepb.ServerMessage{Msg: &cyclonepb.ServerMessage_Ping{Ping: &cyclonepb.Ping{Nonce: 42}}})
	if m := fs.next(); m.GetPong().GetNonce() != 42 {
		t.Fatalf("expected pong 42, got %v", m)
	}
}

func TestStopCancelsTheHandlersContextAndDropsItsResult(t *testing.T) {
	f := startFake(t)
	w, _ := newWorker(t, f.addr, Options{Slots: 2})
	causes := make(chan error, 1)
	w.Handle("block", func(ctx context.Context, l *Lease) (any, error) {
		<-ctx.Done()
		causes <- context.Cause(ctx)
		if l.StopReason() != "cancelled" {
			return nil, fmt.Errorf("stop reason %q", l.StopReason())
		}
		return "ignored", nil
	})
	w.Handle("ok", func(context.Context, *Lease) (any, error) { return "ok", nil })
	run(t, w)
	fs, _ := f.welcome(t, 0)
	blocked := lease("blocked", 1, "block")
	fs.lease(blocked)
	eventually(t, "the handler to start", func() bool { return w.table.running() == 1 })
	fs.stop("cancelled", blocked)
	var stop *StopError
	if cause := <-causes; !errors.As(cause, &stop) || stop.Reason != "cancelled" {
		t.Fatalf("cause: %v", cause)
	}
	// No answer for the stopped lease: the next result is the next lease's.
	fs.lease(lease("after", 1, "ok"))
	if r := fs.result(); r.StepId != "after" {
		t.Fatalf("the stopped lease was answered: %v", r)
	}
	if w.Counts()["stopped_cancelled"] != 1 {
		t.Fatalf("counts: %v", w.Counts())
	}
}

func TestReconnectListsHeldLeasesAndResendsUnackedResults(t *testing.T) {
	f := startFake(t)
	w, logs := newWorker(t, f.addr, Options{Reconnect: Reconnect{Initial: 10 * time.Millisecond}})
	release := make(chan struct{})
	w.Handle("slow", func(ctx context.Context, l *Lease) (any, error) {
		<-release
		return "slow done", nil
	})
	w.Handle("fast", func(context.Context, *Lease) (any, error) { return "fast done", nil })
	run(t, w)
	fs, _ := f.welcome(t, 0)
	fs.lease(lease("fast", 1, "fast"), lease("slow", 4, "slow"))
	first := fs.result() // fast's result, never acked on this stream
	if first.StepId != "fast" {
		t.Fatalf("first result: %v", first)
	}
	fs.hangUp(status.Error(codes.Unavailable, "server shutting down"))

	fs2, hello := f.welcome(t, 0)
	held := map[string]int64{}
	for _, ref := range hello.Held {
		held[ref.StepId] = ref.LeaseGeneration
	}
	if len(held) != 2 || held["fast"] != 1 || held["slow"] != 4 {
		t.Fatalf("held: %v", hello.Held)
	}
	if again := fs2.result(); again.StepId != "fast" || again.GetCompleted() == nil {
		t.Fatalf("the unacked result was not sent again: %v", again)
	}
	fs2.hangUp(status.Error(codes.Unavailable, "again"))
	close(release) // slow finishes while the worker is between streams (or on the next one)

	fs3, hello3 := f.welcome(t, 0)
	got := map[string]bool{}
	for len(got) < 2 {
		for _, r := range fs3.results() {
			got[r.StepId] = true
			fs3.ack(r, cyclonepb.AckStatus_ACK_STATUS_APPLIED, "")
		}
	}
	if !got["slow"] || !got["fast"] || len(hello3.Held) != 2 {
		t.Fatalf("results %v, held %v", got, hello3.Held)
	}
	eventually(t, "the acks to end both leases", func() bool { return w.table.running() == 0 })
	if w.Counts()["disconnects"] != 2 || w.Counts()["welcomes"] != 3 {
		t.Fatalf("counts %v", w.Counts())
	}
	if strings.Count(logs.String(), "welcome from fake") != 3 {
		t.Fatalf("logs:\n%s", logs)
	}
}

func TestLeasesLostAcrossAReconnectAreStopped(t *testing.T) {
	f := startFake(t)
	w, _ := newWorker(t, f.addr, Options{Reconnect: Reconnect{Initial: 10 * time.Millisecond}})
	reasons := make(chan string, 1)
	w.Handle("block", func(ctx context.Context, l *Lease) (any, error) {
		<-ctx.Done()
		reasons <- l.StopReason()
		return nil, ctx.Err()
	})
	run(t, w)
	fs, _ := f.welcome(t, 0)
	l := lease("gone", 2, "block")
	fs.lease(l)
	eventually(t, "the handler to start", func() bool { return w.table.running() == 1 })
	fs.hangUp(status.Error(codes.Unavailable, "bye"))
	_, hello := f.welcome(t, 0, &cyclonepb.LeaseRef{StepId: "gone", LeaseGeneration: 2})
	if len(hello.Held) != 1 {
		t.Fatalf("held: %v", hello.Held)
	}
	if r := <-reasons; r != "lost" {
		t.Fatalf("reason %q", r)
	}
	eventually(t, "the lost lease to be dropped", func() bool { return w.table.running() == 0 })
}

func TestASilentServerIsDroppedAfterThreeHeartbeats(t *testing.T) {
	f := startFake(t)
	w, logs := newWorker(t, f.addr, Options{Reconnect: Reconnect{Initial: 10 * time.Millisecond}})
	w.Handle("k", func(context.Context, *Lease) (any, error) { return nil, nil })
	run(t, w)
	fs, _ := f.accept(t)
	fs.send(&cyclonepb.ServerMessage{Msg: &cyclonepb.ServerMessage_Welcome{Welcome: &cyclonepb.Welcome{
		ServerId: "quiet", HeartbeatInterval: durationpb.New(50 * time.Millisecond)}}})
	// Nothing more from the server: the worker gives the stream up and comes back.
	f.welcome(t, 0)
	if !strings.Contains(logs.String(), "the server sent nothing for 150ms") {
		t.Fatalf("logs:\n%s", logs)
	}
}

func TestFatalStatusesEndRun(t *testing.T) {
	for _, code := range []codes.Code{codes.InvalidArgument, codes.Unauthenticated, codes.PermissionDenied} {
		f := startFake(t)
		w, _ := newWorker(t, f.addr, Options{})
		w.Handle("k", func(context.Context, *Lease) (any, error) { return nil, nil })
		r := run(t, w)
		fs, _ := f.accept(t)
		fs.hangUp(status.Error(code, "hello.slots: nope"))
		var e *client.Error
		if err := r.wait(); !errors.As(err, &e) || e.Code != code || e.Message != "hello.slots: nope" {
			t.Fatalf("%v: Run returned %v", code, err)
		}
	}
}

func TestReconnectAttemptsRunOut(t *testing.T) {
	w, _ := newWorker(t, "127.0.0.1:1", Options{Reconnect: Reconnect{Initial: time.Millisecond, Attempts: 3}})
	w.Handle("k", func(context.Context, *Lease) (any, error) { return nil, nil })
	if err := run(t, w).wait(); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("Run returned %v", err)
	}
}

func TestGracefulStopFinishesRunningHandlersAndHandsBackTheOthers(t *testing.T) {
	f := startFake(t)
	w, logs := newWorker(t, f.addr, Options{Slots: 2, Grace: wait})
	release := make(chan struct{})
	var ranLate atomic.Bool
	w.Handle("nap", func(ctx context.Context, l *Lease) (any, error) {
		select {
		case <-release:
			return "napped", nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	w.Handle("late", func(context.Context, *Lease) (any, error) { ranLate.Store(true); return nil, nil })
	r := run(t, w)
	fs, _ := f.welcome(t, 0)
	fs.lease(lease("nap", 1, "nap"))
	eventually(t, "the nap to start", func() bool { return w.table.running() == 1 })
	stopped := make(chan error, 1)
	go func() { stopped <- r.stop() }()
	eventually(t, "the worker to drain", func() bool { return strings.Contains(logs.String(), "draining") })
	fs.lease(lease("late", 1, "late")) // pushed while draining: held, not run
	eventually(t, "the late lease to be held", func() bool {
		w.table.mu.Lock()
		defer w.table.mu.Unlock()
		return len(w.table.held) == 2
	})
	// Pings are still answered while handlers run.
	fs.send(&cyclonepb.ServerMessage{Msg: &cyclonepb.ServerMessage_Ping{Ping: &cyclonepb.Ping{Nonce: 7}}})
	if m := fs.next(); m.GetPong().GetNonce() != 7 {
		t.Fatalf("expected a pong, got %v", m)
	}
	close(release)
	napped := fs.result()
	if napped.StepId != "nap" || napped.GetCompleted() == nil {
		t.Fatalf("nap: %v", napped)
	}
	fs.ack(napped, cyclonepb.AckStatus_ACK_STATUS_APPLIED, "")
	back := fs.result()
	if back.StepId != "late" || back.GetSnoozed() == nil || back.GetSnoozed().Delay.AsDuration() != 0 {
		t.Fatalf("hand-back: %v", back)
	}
	if m := fs.next(); m != nil {
		t.Fatalf("expected the half-close right after the hand-back, got %v", m)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if ranLate.Load() {
		t.Fatal("a lease that arrived while draining ran")
	}
}

func TestHandlersStillRunningAfterTheGraceAreCancelled(t *testing.T) {
	f := startFake(t)
	w, _ := newWorker(t, f.addr, Options{Grace: 100 * time.Millisecond})
	causes := make(chan error, 1)
	w.Handle("stubborn", func(ctx context.Context, l *Lease) (any, error) {
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return nil, nil
	})
	r := run(t, w)
	fs, _ := f.welcome(t, 0)
	fs.lease(lease("s", 1, "stubborn"))
	eventually(t, "the handler to start", func() bool { return w.table.running() == 1 })
	go func() {
		// The worker half-closes after the grace; the server then ends the stream.
		for m := range fs.in {
			if m.GetResults() != nil {
				t.Errorf("a cut-off handler was answered: %v", m)
			}
		}
	}()
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	var se *StopError
	if c := <-causes; !errors.As(c, &se) || se.Reason != "shutdown" {
		t.Fatalf("cause %v", c)
	}
}

func TestTheHandlersContextCarriesTheTraceAndMiddlewareWraps(t *testing.T) {
	f := startFake(t)
	var order []string
	mw := func(name string) Middleware {
		return func(next Handler) Handler {
			return func(ctx context.Context, l *Lease) (any, error) {
				order = append(order, name)
				return next(ctx, l)
			}
		}
	}
	type ctxKey struct{}
	w, _ := newWorker(t, f.addr, Options{Middleware: []Middleware{mw("outer"), mw("inner")}})
	w.Handle("traced", func(ctx context.Context, l *Lease) (any, error) {
		tc := TraceFromContext(ctx)
		return map[string]any{"same": tc == l.Trace, "trace": l.Trace != nil && l.Trace.TraceID == "4bf92f3577b34da6a3ce929d0e0e4736",
			"value": ctx.Value(ctxKey{}), "client": client.TraceFromContext(ctx) == tc}, nil
	})
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "from Run"))
	defer cancel()
	go func() { _ = w.Run(ctx) }()
	fs, _ := f.welcome(t, 0)
	l := lease("t", 1, "traced")
	l.TraceContext = &cyclonepb.TraceContext{Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	fs.lease(l)
	out := string(jsonv.Compact(fs.result().GetCompleted().GetOutput()))
	if out != `{"client":true,"same":true,"trace":true,"value":"from Run"}` {
		t.Fatalf("output %s", out)
	}
	bad := lease("u", 1, "traced")
	bad.TraceContext = &cyclonepb.TraceContext{Traceparent: "00-zz"}
	fs.lease(bad)
	out = string(jsonv.Compact(fs.result().GetCompleted().GetOutput()))
	if out != `{"client":true,"same":true,"trace":false,"value":"from Run"}` {
		t.Fatalf("malformed trace: %s", out)
	}
	if fmt.Sprint(order) != "[outer inner outer inner]" {
		t.Fatalf("middleware order %v", order)
	}
}

func TestOptionsAndHandleAreChecked(t *testing.T) {
	h := func(context.Context, *Lease) (any, error) { return nil, nil }
	for _, c := range []struct {
		opts Options
		want string
	}{
		{Options{}, "Options.Address is required"},
		{Options{Address: "x:1", Slots: 10001}, "Slots 10001 must be between 1 and 10000"},
		{Options{Address: "x:1", WorkerID: strings.Repeat("w", 201)}, "WorkerID is 201 characters"},
	} {
		w := New(c.opts)
		w.Handle("ok", h)
		if err := w.Run(context.Background()); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Run = %v, want %q", err, c.want)
		}
	}
	w := New(Options{Address: "x:1"})
	if err := w.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "no handlers") {
		t.Fatalf("Run without handlers: %v", err)
	}
	mustPanic := func(what string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Fatalf("%s did not panic", what)
			}
		}()
		f()
	}
	w.Handle("ok", h)
	mustPanic("a duplicate kind", func() { w.Handle("ok", h) })
	mustPanic("a bad kind", func() { w.Handle("no spaces", h) })
	mustPanic("a nil handler", func() { w.Handle("nil", nil) })
}
