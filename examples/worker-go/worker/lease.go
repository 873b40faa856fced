// Package worker is the worker side of Cyclone's Workers.Connect stream, written from
// proto/ alone. This file holds what a handler sees: the lease, the outcomes it can
// return, and their conversion to and from the wire.
package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"cyclone.example/pb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
)

// Lease is everything a handler learns about the step it runs (Lease in workers.proto).
type Lease struct {
	RunID           string
	StepID          string
	Node            string
	Kind            string
	Attempt         int32
	MaxAttempts     int32
	Reclaims        int32
	LeaseGeneration int64
	// Input is the run input as encoding/json would decode it (nil for JSON null).
	Input interface{}
	// Parents holds the outputs of the node's dependencies, by node id.
	Parents         map[string]interface{}
	AttemptDeadline time.Time
	// Trace is the W3C trace context to run the handler under (Lease.trace_context), nil
	// when the run has none. The handler's context carries it too (TraceFromContext).
	Trace *TraceContext

	stopReason atomic.Value // string, set before the handler's context is cancelled
}

// StopReason tells why the handler's context was cancelled: Stop.reason ("cancelled",
// "fenced", "timeout", "shutdown"), "lost" (refused after a reconnect) or "shutdown"
// (the worker stops). Empty while the lease is valid.
func (l *Lease) StopReason() string {
	s, _ := l.stopReason.Load().(string)
	return s
}

// Handler runs one step. Its context is cancelled when the server says Stop. Return the
// output (anything encoding/json can marshal) or an error: Permanent(err),
// RetryAfter(err, d), Snooze(d), or any other error for a retryable failure.
//
//	handlers := map[string]worker.Handler{
//		"resize": func(ctx context.Context, l *worker.Lease) (interface{}, error) {
//			return map[string]interface{}{"ok": true}, nil
//		},
//	}
type Handler func(ctx context.Context, lease *Lease) (interface{}, error)

type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

// Permanent fails the step for good: it is not retried (Failed.permanent).
func Permanent(err error) error { return permanentError{err} }

type retryError struct {
	err   error
	delay time.Duration
}

func (e retryError) Error() string { return e.err.Error() }
func (e retryError) Unwrap() error { return e.err }

// RetryAfter fails this attempt and asks for the retry after d instead of the node's
// backoff (Failed.retry_delay).
func RetryAfter(err error, d time.Duration) error { return retryError{err, d} }

// panicError is a handler's panic, with the stack of the goroutine that panicked.
type panicError struct {
	value interface{}
	stack []byte
}

func (e panicError) Error() string { return fmt.Sprintf("handler panicked: %v", e.value) }

// details is Failed.details for a handler's error: Go errors carry no stack, so it is the
// chain of wrapped errors (type: message, outermost first), and for a panic the stack of
// the goroutine that panicked. The server keeps it per attempt, cut at 16 KiB.
func details(err error) string {
	var p panicError
	if errors.As(err, &p) {
		return p.Error() + "\n\n" + string(p.stack)
	}
	var b strings.Builder
	for e := err; e != nil; e = errors.Unwrap(e) {
		fmt.Fprintf(&b, "%T: %s\n", e, e.Error())
	}
	return b.String()
}

type snoozeError struct{ delay time.Duration }

func (e snoozeError) Error() string { return fmt.Sprintf("snooze %s", e.delay) }

// Snooze asks to run the step again after d; it is not a failure (Snoozed).
func Snooze(d time.Duration) error { return snoozeError{d} }

func leaseFromWire(l *pb.Lease) *Lease {
	lease := &Lease{
		RunID: l.RunId, StepID: l.StepId, Node: l.Node, Kind: l.Kind,
		Attempt: l.Attempt, MaxAttempts: l.MaxAttempts, Reclaims: l.Reclaims,
		LeaseGeneration: l.LeaseGeneration,
		Input:           l.GetInput().AsInterface(),
		Parents:         l.GetParents().AsMap(),
	}
	if l.AttemptDeadline != nil {
		lease.AttemptDeadline = l.AttemptDeadline.AsTime()
	}
	lease.Trace = parseTraceContext(l.GetTraceContext())
	return lease
}

// TraceContext is a lease's W3C trace context (https://www.w3.org/TR/trace-context/).
// Start the handler's span as a child of SpanID in trace TraceID; with OpenTelemetry,
// propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent":
// t.Traceparent, "tracestate": t.Tracestate}) gives the parent. Pass Traceparent and
// Tracestate on (as metadata `traceparent` / `tracestate`) when the handler submits
// runs, so they join the same trace.
type TraceContext struct {
	Traceparent string // "00-<trace id>-<parent span id>-<flags>"
	Tracestate  string // vendor entries, passed on as is; may be empty
	TraceID     string // 32 hex digits
	SpanID      string // 16 hex digits: the parent of the handler's span
	Sampled     bool   // flag 01: the trace is recorded upstream
}

var traceparentRE = regexp.MustCompile(`^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$`)

// parseTraceContext reads Lease.trace_context; nil when absent or malformed (the server
// sends only well-formed ones, but a worker must not trust that blindly).
func parseTraceContext(tc *pb.TraceContext) *TraceContext {
	if tc == nil || tc.Traceparent == "" {
		return nil
	}
	m := traceparentRE.FindStringSubmatch(tc.Traceparent)
	if m == nil || m[1] == "ff" || (m[1] == "00" && m[5] != "") ||
		m[2] == "00000000000000000000000000000000" || m[3] == "0000000000000000" {
		return nil
	}
	var flags int
	fmt.Sscanf(m[4], "%x", &flags)
	return &TraceContext{Traceparent: tc.Traceparent, Tracestate: tc.Tracestate, TraceID: m[2], SpanID: m[3],
		Sampled: flags&1 == 1}
}

type traceKey struct{}

// TraceFromContext returns the trace context of the lease a handler's context belongs
// to, or nil.
func TraceFromContext(ctx context.Context) *TraceContext {
	t, _ := ctx.Value(traceKey{}).(*TraceContext)
	return t
}

// toValue turns any JSON-marshalable value into a google.protobuf.Value by way of
// encoding/json, so that structs with json tags work as outputs. It also returns the
// output's size as compact JSON, the measure of the server's payload limit.
func toValue(out interface{}) (*structpb.Value, int64, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // the server counts "<" as one byte, not as \u003c
	if err := enc.Encode(out); err != nil {
		return nil, 0, fmt.Errorf("output is not JSON: %w", err)
	}
	raw := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	var generic interface{}
	if err := json.Unmarshal(raw, &generic); err != nil {
		return nil, 0, fmt.Errorf("output is not JSON: %w", err)
	}
	v, err := structpb.NewValue(generic)
	return v, int64(len(raw)), err
}

// resultFor turns a handler's return into the StepResult that answers its lease. An output
// over maxPayload (Welcome.max_payload_bytes) is answered with its size only: the server
// discards the step (output_too_large) without the output crossing the wire.
func resultFor(l *Lease, out interface{}, err error, maxPayload int64) *pb.StepResult {
	r := &pb.StepResult{StepId: l.StepID, LeaseGeneration: l.LeaseGeneration}
	if err == nil {
		v, size, convErr := toValue(out)
		if convErr == nil && size > maxPayload {
			r.Outcome = &pb.StepResult_Completed{Completed: &pb.Completed{OversizedOutputBytes: size}}
			return r
		}
		if convErr == nil {
			r.Outcome = &pb.StepResult_Completed{Completed: &pb.Completed{Output: v}}
			return r
		}
		err = convErr
	}
	var snooze snoozeError
	var permanent permanentError
	var retry retryError
	switch {
	case errors.As(err, &snooze):
		r.Outcome = &pb.StepResult_Snoozed{Snoozed: &pb.Snoozed{Delay: durationpb.New(snooze.delay)}}
	case errors.As(err, &permanent):
		r.Outcome = &pb.StepResult_Failed{Failed: &pb.Failed{Message: err.Error(), Permanent: true, Details: details(err)}}
	case errors.As(err, &retry):
		r.Outcome = &pb.StepResult_Failed{Failed: &pb.Failed{Message: err.Error(), RetryDelay: durationpb.New(retry.delay),
			Details: details(err)}}
	default:
		r.Outcome = &pb.StepResult_Failed{Failed: &pb.Failed{Message: err.Error(), Details: details(err)}}
	}
	return r
}

// traceLabel names a lease's trace in log lines: "TRACEID/SPANID", or "-" without one.
func traceLabel(t *TraceContext) string {
	if t == nil {
		return "-"
	}
	return t.TraceID + "/" + t.SpanID
}
