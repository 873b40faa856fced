package cycloneotel

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cyclone-workflows/cyclone/sdks/go/client"
	"github.com/cyclone-workflows/cyclone/sdks/go/cyclonepb"
	"github.com/cyclone-workflows/cyclone/sdks/go/worker"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// leaseFor makes a Lease as the worker would hand it to a handler, through the worker's
// own conversion (a Lease is only ever built by the worker).
func leaseFor(t *testing.T, traceparent string) *worker.Lease {
	t.Helper()
	p := &cyclonepb.Lease{RunId: "run-1", StepId: "step-1", Node: "charge", Kind: "charge", Attempt: 2, MaxAttempts: 5,
		LeaseGeneration: 3}
	if traceparent != "" {
		p.TraceContext = &cyclonepb.TraceContext{Traceparent: traceparent, Tracestate: "congo=t61"}
	}
	return worker.LeaseFromProto(p)
}

func attrs(s tracetest.SpanStub) map[attribute.Key]attribute.Value {
	out := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes {
		out[kv.Key] = kv.Value
	}
	return out
}

func TestTheHandlerSpanIsAChildOfTheLeasesTraceContext(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	var inHandler trace.SpanContext
	var sent string
	h := Middleware(tp)(func(ctx context.Context, l *worker.Lease) (any, error) {
		inHandler = trace.SpanContextFromContext(ctx)
		sent, _ = TraceHeaders(ctx)
		if tc := client.TraceFromContext(ctx); tc == nil || tc.SpanID != inHandler.SpanID().String() {
			t.Errorf("the W3C context in ctx is the handler span's: %+v", tc)
		}
		return "ok", nil
	})
	if _, err := h(context.Background(), leaseFor(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")); err != nil {
		t.Fatal(err)
	}
	got := spans.GetSpans()
	if len(got) != 1 {
		t.Fatalf("spans %v", got)
	}
	s := got[0]
	if s.Name != "handle charge" || s.SpanKind != trace.SpanKindConsumer ||
		s.SpanContext.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" ||
		s.Parent.SpanID().String() != "00f067aa0ba902b7" || !s.Parent.IsRemote() {
		t.Fatalf("span %+v", s)
	}
	a := attrs(s)
	if a["cyclone.run_id"].AsString() != "run-1" || a["cyclone.attempt"].AsInt64() != 2 ||
		a["cyclone.lease_generation"].AsInt64() != 3 || a["cyclone.outcome"].AsString() != "completed" {
		t.Fatalf("attributes %v", a)
	}
	if inHandler.SpanID() != s.SpanContext.SpanID() {
		t.Fatal("the handler's context carries its span")
	}
	if !strings.HasPrefix(sent, "00-4bf92f3577b34da6a3ce929d0e0e4736-"+s.SpanContext.SpanID().String()) {
		t.Fatalf("a client call from the handler sends the handler's span: %q", sent)
	}
}

func TestOutcomesAndErrorStatus(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	for _, c := range []struct {
		err     error
		outcome string
		status  codes.Code
	}{
		{errors.New("disk full"), "failed", codes.Error},
		{worker.Permanent(errors.New("bad")), "discarded", codes.Error},
		{worker.Snooze(time.Second), "snoozed", codes.Unset},
	} {
		spans.Reset()
		h := Middleware(tp)(func(context.Context, *worker.Lease) (any, error) { return nil, c.err })
		_, _ = h(context.Background(), leaseFor(t, ""))
		s := spans.GetSpans()[0]
		if attrs(s)["cyclone.outcome"].AsString() != c.outcome || s.Status.Code != c.status || s.Parent.IsValid() {
			t.Errorf("%v: outcome %v, status %v, parent %v", c.err, attrs(s)["cyclone.outcome"], s.Status, s.Parent)
		}
	}
}

func TestTraceHeadersFallsBackToTheContextsW3CTrace(t *testing.T) {
	if tp, _ := TraceHeaders(context.Background()); tp != "" {
		t.Fatalf("no span, no trace: %q", tp)
	}
	ctx := client.WithTrace(context.Background(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "a=b")
	if tp, ts := TraceHeaders(ctx); tp != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" || ts != "a=b" {
		t.Fatalf("got %q %q", tp, ts)
	}
}
