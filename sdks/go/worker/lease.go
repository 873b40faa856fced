package worker

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"

	"sync/atomic"
	"time"

	"github.com/cyclone-workflows/cyclone/sdks/go/cyclonepb"
	"github.com/cyclone-workflows/cyclone/sdks/go/internal/jsonv"
	"github.com/cyclone-workflows/cyclone/sdks/go/internal/w3c"
)

// Handler runs one step. It returns the step's output (anything encoding/json marshals:
// a map, a slice, a struct with json tags, json.RawMessage; nil is JSON null) or an
// error: Permanent(err), RetryAfter(err, d), Snooze(d), or any other error for a
// retryable failure. A panic is a retryable failure carrying the goroutine's stack.
//
// ctx is cancelled when the handler must stop: the server sent Stop (the step was
// cancelled, timed out, or fenced), the lease was lost across a reconnect, or the worker
// stops past its grace period. context.Cause(ctx) is then a *StopError naming why, and
// the handler's result is not sent. ctx also carries the lease's trace context
// (TraceFromContext) and the values of the context given to Run.
type Handler func(ctx context.Context, lease *Lease) (any, error)

// Middleware wraps every handler, outermost first in Options.Middleware: for tracing
// (see package cycloneotel), metrics, or logging around each step.
type Middleware func(next Handler) Handler

// TraceContext is a lease's W3C trace context (Lease.trace_context), parsed.
type TraceContext = w3c.TraceContext

// TraceFromContext returns the trace context a handler's context carries (its lease's),
// or nil. A client.Client call made with that context sends it as `traceparent`.
func TraceFromContext(ctx context.Context) *TraceContext { return w3c.FromContext(ctx) }

// Lease is everything a handler learns about the step it runs.
type Lease struct {
	RunID           string
	StepID          string
	Node            string // the node id in the workflow (a standalone job's is its kind)
	Kind            string // the handler name
	Attempt         int    // 1-based; only a failed execution increments it
	MaxAttempts     int
	Reclaims        int // times this step's lease expired and was reclaimed (same attempt)
	Snoozes         int // times the step was snoozed before this lease
	LeaseGeneration int64
	// Input is the run input as encoding/json decodes JSON into `any` (numbers are
	// float64; nil for JSON null). DecodeInput decodes it into your own type.
	Input any
	// Parents holds the outputs of the node's dependencies, by node id (see DecodeParent).
	Parents map[string]any
	// AttemptDeadline is when this attempt times out (the server then sends Stop
	// "timeout"); zero when the lease has none.
	AttemptDeadline time.Time
	// Trace is the W3C trace context to run the handler under, nil when the run has none.
	Trace *TraceContext
	// WorkerID is the worker running the step (the step's lease_owner).
	WorkerID string
	// Log is the worker's logger with this step's run_id, step_id, node, kind and
	// attempt (and trace_id) attached.
	Log *slog.Logger

	proto       *cyclonepb.Lease
	stopReason  atomic.Value // string
	completedTx atomic.Bool
}

// LastAttempt reports whether a failure of this attempt discards the step.
func (l *Lease) LastAttempt() bool { return l.Attempt >= l.MaxAttempts }

// StopReason says why the handler's context was cancelled ("cancelled", "timeout",
// "fenced", "lost", "shutdown"); empty while the lease is valid.
func (l *Lease) StopReason() string {
	s, _ := l.stopReason.Load().(string)
	return s
}

// DecodeInput decodes the run input into v as encoding/json would (an integral number
// decodes into an integer field).
//
//	var in struct{ Image string `json:"image"`; Width int `json:"width"` }
//	if err := lease.DecodeInput(&in); err != nil {
//		return nil, worker.Permanent(err)
//	}
func (l *Lease) DecodeInput(v any) error { return jsonv.Decode(l.proto.GetInput(), v) }

// DecodeParent decodes the output of dependency `node` into v; an error when the node is
// not a dependency.
func (l *Lease) DecodeParent(node string, v any) error {
	out, ok := l.proto.GetParents().GetFields()[node]
	if !ok {
		return fmt.Errorf("cyclone: %q is not a dependency of node %q", node, l.Node)
	}
	return jsonv.Decode(out, v)
}

// Proto is the lease as the server sent it.
func (l *Lease) Proto() *cyclonepb.Lease { return l.proto }

// LeaseFromProto converts a lease as the server sent it into what a handler sees; for
// tests of handlers and middleware (the worker makes its leases itself).
func LeaseFromProto(p *cyclonepb.Lease) *Lease {
	return newLease(p, "", slog.Default())
}

func newLease(p *cyclonepb.Lease, workerID string, log *slog.Logger) *Lease {
	l := &Lease{
		RunID: p.RunId, StepID: p.StepId, Node: p.Node, Kind: p.Kind, Attempt: int(p.Attempt),
		MaxAttempts: int(p.MaxAttempts), Reclaims: int(p.Reclaims), Snoozes: int(p.Snoozes),
		LeaseGeneration: p.LeaseGeneration, Input: jsonv.Plain(p.Input), Parents: map[string]any{},
		WorkerID: workerID, proto: p,
	}
	for node, out := range p.GetParents().GetFields() {
		l.Parents[node] = jsonv.Plain(out)
	}
	if p.AttemptDeadline != nil {
		l.AttemptDeadline = p.AttemptDeadline.AsTime()
	}
	if tc := p.GetTraceContext(); tc != nil {
		l.Trace = w3c.Parse(tc.Traceparent, tc.Tracestate)
	}
	attrs := []any{"run_id", l.RunID, "step_id", l.StepID, "node", l.Node, "kind", l.Kind, "attempt", l.Attempt}
	if l.Trace != nil {
		attrs = append(attrs, "trace_id", l.Trace.TraceID)
	}
	l.Log = log.With(attrs...)
	return l
}

// CompleteInTx completes the step inside a transaction of the handler's own, on
// Cyclone's Postgres database, so that the handler's writes and the completion commit
// together or not at all. It begins a transaction on db, calls fn with it, then calls
// cyclone_step_complete(step_id, lease_generation, output) with fn's output in the same
// transaction, and commits only if that answered "applied". Return its result from the
// handler:
//
//	return lease.CompleteInTx(ctx, db, func(tx *sql.Tx) (any, error) {
//		if _, err := tx.ExecContext(ctx, "INSERT INTO payments (step_id, amount) VALUES ($1, 42)", lease.StepID); err != nil {
//			return nil, err
//		}
//		return map[string]any{"paid": 42}, nil
//	})
//
// db is any database/sql driver for Postgres whose placeholders are $1, $2 (pgx's
// stdlib, lib/pq). An error from fn rolls back and is returned; a lease no longer this
// handler's rolls back with a *FencedError; an output over the server's size limit rolls
// back with a Permanent error. After a commit the worker still answers the lease (its
// slot frees; the server acks that answer ENDED, as expected).
func (l *Lease) CompleteInTx(ctx context.Context, db *sql.DB, fn func(tx *sql.Tx) (any, error)) (out any, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	out, err = fn(tx)
	if err != nil {
		return nil, err
	}
	raw, err := jsonv.Marshal(out)
	if err != nil {
		return nil, Permanent(fmt.Errorf("output is not JSON: %w", err))
	}
	var status string
	err = tx.QueryRowContext(ctx, "SELECT cyclone_step_complete($1, $2, $3::jsonb)", l.StepID, l.LeaseGeneration,
		string(raw)).Scan(&status)
	if err != nil {
		return nil, err
	}
	switch status {
	case "applied":
	case "output_too_large":
		// The function discarded the step inside this transaction; rolling back undoes
		// that too, so the step is failed the same way from here.
		return nil, Permanent(errors.New("output_too_large: the output is over the server's size limit"))
	default:
		return nil, &FencedError{Status: status, StepID: l.StepID, LeaseGeneration: l.LeaseGeneration}
	}
	if err = tx.Commit(); err != nil {
		return nil, err
	}
	l.completedTx.Store(true)
	return out, nil
}
