package worker

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"

	"github.com/cyclone-workflows/cyclone/sdks/go/cyclonepb"
	"github.com/cyclone-workflows/cyclone/sdks/go/internal/jsonv"
	"github.com/cyclone-workflows/cyclone/sdks/go/internal/w3c"
	"google.golang.org/protobuf/types/known/durationpb"
)

// What a server that does not say (Welcome.max_payload_bytes = 0) stores at most.
const defaultMaxPayloadBytes = 1 << 20

// The server keeps a failure's message up to this many bytes, and its details up to
// this many; past that it cuts them, so they are sent cut already, marker included.
const (
	maxMessageBytes = 64 * 1024
	maxDetailsBytes = 16 * 1024
)

type leaseKey struct {
	stepID     string
	generation int64
}

// held is one lease: its handler runs, or its result waits for an ack.
type held struct {
	lease   *Lease
	key     leaseKey
	ctx     context.Context
	cancel  context.CancelCauseFunc
	started bool // false for a lease that arrived while draining: handed back at the end
	done    bool // the handler returned
	stopped bool // the server took the lease back (Stop, Welcome.lost) or the worker quit
	result  *cyclonepb.StepResult
}

// table holds the worker's leases by (step_id, lease_generation). It outlives the
// streams: after a reconnect its leases go out in Hello.held and its unacked results
// are sent again.
type table struct {
	w *Worker

	mu         sync.Mutex
	held       map[leaseKey]*held
	outlet     func(*cyclonepb.StepResult) // the stream that is up; nil between streams
	draining   bool
	maxPayload int64
	changed    chan struct{} // closed (and replaced) whenever a lease ends or gets its result
	base       context.Context
}

func newTable(w *Worker) *table {
	return &table{w: w, held: map[leaseKey]*held{}, maxPayload: defaultMaxPayloadBytes, changed: make(chan struct{}),
		base: context.Background()}
}

// bump wakes whoever waits on changed; t.mu is held.
func (t *table) bump() {
	close(t.changed)
	t.changed = make(chan struct{})
}

// watch returns a channel closed at the next change.
func (t *table) watch() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.changed
}

// refs is Hello.held: every lease the server has not taken back.
func (t *table) refs() []*cyclonepb.LeaseRef {
	t.mu.Lock()
	defer t.mu.Unlock()
	var refs []*cyclonepb.LeaseRef
	for k, h := range t.held {
		if !h.stopped {
			refs = append(refs, &cyclonepb.LeaseRef{StepId: k.stepID, LeaseGeneration: k.generation})
		}
	}
	return refs
}

// welcomed: a new stream is up. Stops the lost leases and returns the results to send
// on it; results made from now on go to outlet.
func (t *table) welcomed(outlet func(*cyclonepb.StepResult), lost []*cyclonepb.LeaseRef, maxPayload int64) []*cyclonepb.StepResult {
	for _, ref := range lost {
		t.stop(ref, "lost")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if maxPayload <= 0 {
		maxPayload = defaultMaxPayloadBytes
	}
	t.maxPayload = maxPayload
	t.outlet = outlet
	var pending []*cyclonepb.StepResult
	for _, h := range t.held {
		if h.result != nil && !h.stopped {
			pending = append(pending, h.result)
		}
	}
	return pending
}

// disconnected: the stream is down; results wait in the table.
func (t *table) disconnected() {
	t.mu.Lock()
	t.outlet = nil
	t.mu.Unlock()
}

func (t *table) start(p *cyclonepb.Lease) {
	key := leaseKey{p.StepId, p.LeaseGeneration}
	t.mu.Lock()
	if _, dup := t.held[key]; dup {
		t.mu.Unlock()
		return
	}
	lease := newLease(p, t.w.id, t.w.log)
	// The handler's context outlives the stream (a handler keeps running across a
	// reconnect) and the context of Run (whose end stops the worker gracefully); only a
	// Stop, a lost lease or the end of the worker cancels it.
	ctx, cancel := context.WithCancelCause(w3c.NewContext(t.base, lease.Trace))
	h := &held{lease: lease, key: key, ctx: ctx, cancel: cancel, started: !t.draining}
	t.held[key] = h
	t.mu.Unlock()
	t.w.count("leases")
	if !h.started {
		// While draining, the lease waits unanswered: it fills a slot, so nothing more is
		// pushed, whereas handing it back now would bring it straight back.
		lease.Log.Info("cyclone worker: lease arrived while draining; handing it back at the stop")
		return
	}
	lease.Log.Debug("cyclone worker: lease", "generation", lease.LeaseGeneration)
	go t.execute(h)
}

// execute runs h's handler and answers its lease.
func (t *table) execute(h *held) {
	out, err := t.call(h)
	lease := h.lease
	t.mu.Lock()
	maxPayload := t.maxPayload
	t.mu.Unlock()
	var result *cyclonepb.StepResult
	if lease.completedTx.Load() {
		// The step completed in the handler's transaction; this answer only frees the slot
		// (it is acked ENDED), so it carries no output that could fail to convert.
		result = &cyclonepb.StepResult{Outcome: &cyclonepb.StepResult_Completed{Completed: &cyclonepb.Completed{}}}
	} else {
		result = outcome(out, err, maxPayload)
	}
	if f := result.GetFailed(); f != nil && h.ctx.Err() == nil {
		lease.Log.Warn("cyclone worker: handler failed", "error", f.Message, "permanent", f.Permanent)
	}
	result.StepId, result.LeaseGeneration = h.key.stepID, h.key.generation
	t.mu.Lock()
	defer t.mu.Unlock()
	h.done = true
	if h.stopped || t.held[h.key] != h {
		delete(t.held, h.key) // stopped or lost: its result would only be refused
		t.bump()
		return
	}
	h.result = result
	t.bump()
	if t.outlet != nil {
		t.outlet(result)
	}
}

// call runs the handler (through the middleware), turning a panic into a *PanicError.
func (t *table) call(h *held) (out any, err error) {
	defer func() {
		if p := recover(); p != nil {
			out, err = nil, &PanicError{Value: p, Stack: debug.Stack()}
		}
	}()
	handler, ok := t.w.handlers[h.lease.Kind]
	if !ok {
		return nil, fmt.Errorf("worker %s has no handler for kind %q", t.w.id, h.lease.Kind)
	}
	for i := len(t.w.opts.Middleware) - 1; i >= 0; i-- {
		handler = t.w.opts.Middleware[i](handler)
	}
	return handler(h.ctx, h.lease)
}

// outcome is the StepResult (ids unset) for a handler's return.
func outcome(out any, err error, maxPayload int64) *cyclonepb.StepResult {
	r := &cyclonepb.StepResult{}
	if err == nil {
		value, convErr := jsonv.ToValue(out, "output")
		if convErr != nil {
			err = Permanent(fmt.Errorf("output is not JSON: %w", convErr))
		} else {
			// Measured as the server measures what it receives: the value as it crosses the
			// wire, in compact JSON. Over the limit, only the size is sent.
			if size := jsonv.Size(value); size > maxPayload {
				r.Outcome = &cyclonepb.StepResult_Completed{Completed: &cyclonepb.Completed{OversizedOutputBytes: size}}
			} else {
				r.Outcome = &cyclonepb.StepResult_Completed{Completed: &cyclonepb.Completed{Output: value}}
			}
			return r
		}
	}
	var snooze snoozeError
	if errors.As(err, &snooze) {
		d := snooze.delay
		if d < 0 {
			d = 0
		}
		r.Outcome = &cyclonepb.StepResult_Snoozed{Snoozed: &cyclonepb.Snoozed{Delay: durationpb.New(d)}}
		return r
	}
	failed := &cyclonepb.Failed{
		Message: jsonv.Cut(err.Error(), maxMessageBytes),
		Details: jsonv.Cut(details(err), maxDetailsBytes),
	}
	var permanent permanentError
	var retry retryError
	if errors.As(err, &permanent) {
		failed.Permanent = true
	} else if errors.As(err, &retry) && retry.delay >= 0 {
		failed.RetryDelay = durationpb.New(retry.delay)
	}
	r.Outcome = &cyclonepb.StepResult_Failed{Failed: failed}
	return r
}

// stop: the server took the lease back (Stop, or lost after a reconnect).
func (t *table) stop(ref *cyclonepb.LeaseRef, reason string) {
	key := leaseKey{ref.StepId, ref.LeaseGeneration}
	t.mu.Lock()
	h, ok := t.held[key]
	if !ok || h.stopped {
		t.mu.Unlock()
		return
	}
	h.stopped = true
	if !h.started || h.done {
		delete(t.held, key)
		t.bump()
	}
	t.mu.Unlock()
	t.w.count("stopped_" + reason)
	h.lease.Log.Info("cyclone worker: lease stopped", "reason", reason)
	h.lease.stopReason.Store(reason)
	h.cancel(&StopError{Reason: reason})
}

func (t *table) acked(ack *cyclonepb.ResultAck) {
	key := leaseKey{ack.StepId, ack.LeaseGeneration}
	t.mu.Lock()
	h, ok := t.held[key]
	if ok {
		delete(t.held, key)
		t.bump()
	}
	t.mu.Unlock()
	if !ok {
		return
	}
	status := strings.ToLower(strings.TrimPrefix(ack.Status.String(), "ACK_STATUS_"))
	t.w.count(status)
	log := h.lease.Log
	switch {
	case ack.Status == cyclonepb.AckStatus_ACK_STATUS_INVALID:
		// The server could not use the answer and failed the attempt in its place: the
		// lease is over (a bug to report, not something to answer again).
		log.Error("cyclone worker: result refused as invalid", "detail", ack.Detail)
	case ack.Status != cyclonepb.AckStatus_ACK_STATUS_APPLIED && !h.lease.completedTx.Load():
		log.Warn("cyclone worker: result refused", "status", status, "detail", ack.Detail,
			"generation", ack.LeaseGeneration)
	default:
		log.Debug("cyclone worker: result acked", "status", status, "detail", ack.Detail)
	}
	h.cancel(nil) // releases the context's resources; the handler has returned
}

// running counts the started leases not yet answered and acked (a stopped handler that
// has not returned yet counts too).
func (t *table) running() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, h := range t.held {
		if h.started {
			n++
		}
	}
	return n
}

// setDraining: leases that arrive from now on are held unstarted.
func (t *table) setDraining() {
	t.mu.Lock()
	t.draining = true
	t.mu.Unlock()
}

// giveBackUnstarted answers every lease that never ran with a zero-delay snooze: the step
// is claimable again at once, attempt and reclaims unchanged.
func (t *table) giveBackUnstarted() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, h := range t.held {
		if h.started || h.result != nil || h.stopped {
			continue
		}
		h.result = &cyclonepb.StepResult{StepId: h.key.stepID, LeaseGeneration: h.key.generation,
			Outcome: &cyclonepb.StepResult_Snoozed{Snoozed: &cyclonepb.Snoozed{Delay: durationpb.New(0)}}}
		n++
		if t.outlet != nil {
			t.outlet(h.result)
		}
	}
	if n > 0 {
		t.bump()
	}
	return n
}

// abandon cancels every handler still running and forgets every lease (the worker is
// gone): their leases expire and are reclaimed, as after a crash.
func (t *table) abandon() {
	t.mu.Lock()
	hs := make([]*held, 0, len(t.held))
	for _, h := range t.held {
		hs = append(hs, h)
		h.stopped = true
	}
	t.held = map[leaseKey]*held{}
	t.outlet = nil
	t.bump()
	t.mu.Unlock()
	for _, h := range hs {
		if h.started && !h.done {
			h.lease.stopReason.CompareAndSwap(nil, "shutdown")
		}
		h.cancel(&StopError{Reason: "shutdown"})
	}
}
