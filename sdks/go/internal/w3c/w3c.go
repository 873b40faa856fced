// Package w3c parses W3C Trace Context headers (https://www.w3.org/TR/trace-context/)
// and carries one in a context.Context.
package w3c

import (
	"context"
	"strings"
)

// TraceContext is a parsed W3C trace context: the traceparent and tracestate headers,
// and the fields of the traceparent.
type TraceContext struct {
	Traceparent string // "00-<32 hex trace id>-<16 hex parent span id>-<2 hex flags>"
	Tracestate  string // vendor entries ("key=value,..."), passed on as received; may be empty
	TraceID     string // 32 lowercase hex digits, not all zero
	SpanID      string // 16 lowercase hex digits, not all zero: the parent span
	Sampled     bool   // flag 01: the trace is recorded upstream
}

// Parse reads a traceparent (and its tracestate); nil when traceparent is empty or
// malformed, as the specification asks of a receiver.
func Parse(traceparent, tracestate string) *TraceContext {
	parts := strings.SplitN(traceparent, "-", 5)
	if len(parts) < 4 {
		return nil
	}
	version, traceID, spanID, flags := parts[0], parts[1], parts[2], parts[3]
	if !hex(version, 2) || version == "ff" || !hex(traceID, 32) || !hex(spanID, 16) || !hex(flags, 2) {
		return nil
	}
	// Version 00 has exactly four fields; a later version may append more.
	if version == "00" && len(parts) == 5 {
		return nil
	}
	if strings.Trim(traceID, "0") == "" || strings.Trim(spanID, "0") == "" {
		return nil
	}
	return &TraceContext{Traceparent: traceparent, Tracestate: tracestate, TraceID: traceID, SpanID: spanID,
		Sampled: flagBit(flags)}
}

func hex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < n; i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func flagBit(flags string) bool {
	c := flags[1]
	var low byte
	if c <= '9' {
		low = c - '0'
	} else {
		low = c - 'a' + 10
	}
	return low&1 == 1
}

type key struct{}

// NewContext returns ctx carrying t (nil removes any).
func NewContext(ctx context.Context, t *TraceContext) context.Context {
	return context.WithValue(ctx, key{}, t)
}

// FromContext returns the trace context ctx carries, or nil.
func FromContext(ctx context.Context) *TraceContext {
	t, _ := ctx.Value(key{}).(*TraceContext)
	return t
}
