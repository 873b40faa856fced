// Package cycloneotel joins Cyclone's Go SDK to OpenTelemetry: a worker middleware that
// runs each handler in a span whose parent is the lease's trace context, and a client
// hook that sends the current span's context with every call, so the runs it starts
// join the caller's trace.
//
//	w, _ := worker.New(worker.Options{Address: addr,
//		Middleware: []worker.Middleware{cycloneotel.Middleware(nil)}}) // nil: the global TracerProvider
//	c, _ := client.New(client.Options{Address: addr, TraceHeaders: cycloneotel.TraceHeaders})
//
// The wire format is W3C Trace Context (what the server stores), whatever propagator the
// application configured. Without this package the SDK still hands the lease's W3C
// context to the handler (worker.TraceFromContext) and passes it on to client calls.
package cycloneotel

import (
	"context"
	"errors"

	"github.com/cyclone-workflows/cyclone/sdks/go/client"
	"github.com/cyclone-workflows/cyclone/sdks/go/worker"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// TracerName names the tracer of the handler spans.
const TracerName = "github.com/cyclone-workflows/cyclone/sdks/go/cycloneotel"

var w3c = propagation.TraceContext{}

// carrier is a propagation.TextMapCarrier over a map (propagation.MapCarrier is newer
// than Debian 12's OpenTelemetry 1.1).
type carrier map[string]string

func (c carrier) Get(key string) string { return c[key] }
func (c carrier) Set(key, value string) { c[key] = value }
func (c carrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// Middleware runs each handler in a span "handle {kind}" (kind consumer), a child of
// the lease's trace context (a root span when the lease has none), with attributes
// cyclone.run_id, cyclone.step_id, cyclone.node, cyclone.kind, cyclone.attempt,
// cyclone.lease_generation and cyclone.outcome (completed, failed, discarded, snoozed,
// stopped); a failure sets the span's status to error. The handler's context carries the
// span, and, as its W3C trace context, the span's own: a client call made with it starts
// runs under the handler's span. tp nil: the global TracerProvider (otel.SetTracerProvider).
func Middleware(tp trace.TracerProvider) worker.Middleware {
	return func(next worker.Handler) worker.Handler {
		return func(ctx context.Context, l *worker.Lease) (out any, err error) {
			provider := tp
			if provider == nil {
				provider = otel.GetTracerProvider()
			}
			if l.Trace != nil {
				ctx = w3c.Extract(ctx, carrier{"traceparent": l.Trace.Traceparent,
					"tracestate": l.Trace.Tracestate})
			}
			ctx, span := provider.Tracer(TracerName).Start(ctx, "handle "+l.Kind,
				trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
					attribute.String("cyclone.run_id", l.RunID), attribute.String("cyclone.step_id", l.StepID),
					attribute.String("cyclone.node", l.Node), attribute.String("cyclone.kind", l.Kind),
					attribute.Int("cyclone.attempt", l.Attempt), attribute.Int64("cyclone.lease_generation", l.LeaseGeneration)))
			defer span.End()
			if tp, ts := headers(ctx); tp != "" {
				ctx = client.WithTrace(ctx, tp, ts)
			}
			defer func() {
				if p := recover(); p != nil {
					span.SetAttributes(attribute.String("cyclone.outcome", "failed"))
					span.SetStatus(codes.Error, "handler panicked")
					panic(p)
				}
			}()
			out, err = next(ctx, l)
			outcome := "completed"
			var stop *worker.StopError
			switch _, snoozed := worker.SnoozeDelay(err); {
			case err == nil:
			case errors.As(context.Cause(ctx), &stop):
				outcome = "stopped"
			case snoozed:
				outcome = "snoozed"
			case worker.IsPermanent(err):
				outcome = "discarded"
			default:
				outcome = "failed"
			}
			span.SetAttributes(attribute.String("cyclone.outcome", outcome))
			if outcome == "failed" || outcome == "discarded" {
				span.SetStatus(codes.Error, err.Error())
			}
			return out, err
		}
	}
}

// TraceHeaders is a client.Options.TraceHeaders that sends the W3C context of the
// current OpenTelemetry span in ctx, or else the W3C context ctx carries
// (client.WithTrace, a handler's lease).
func TraceHeaders(ctx context.Context) (traceparent, tracestate string) {
	if tp, ts := headers(ctx); tp != "" {
		return tp, ts
	}
	if t := client.TraceFromContext(ctx); t != nil {
		return t.Traceparent, t.Tracestate
	}
	return "", ""
}

func headers(ctx context.Context) (string, string) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return "", ""
	}
	c := carrier{}
	w3c.Inject(ctx, c)
	return c["traceparent"], c["tracestate"]
}
