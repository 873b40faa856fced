// The leases a worker holds: starting handlers, sending results while the stream is up,
// matching acks by (step_id, lease_generation), and stopping handlers.

package worker

import (
	"context"
	"fmt"
	"runtime/debug"

	"cyclone.example/pb"
)

type leaseKey struct {
	stepID     string
	generation int64
}

type held struct {
	lease   *Lease
	cancel  context.CancelFunc
	started bool           // false for a lease that arrived while draining: handed back
	result  *pb.StepResult // set once the handler returned; kept until acked
	sentIn  int            // the session the result was last sent on
}

func (w *Worker) onWelcome(stream pb.Workers_ConnectClient, welcome *pb.Welcome) {
	w.opts.Logf("welcome from %s; %d held lease(s) lost", welcome.ServerId, len(welcome.Lost))
	w.mu.Lock()
	w.maxPayload = welcome.MaxPayloadBytes
	if w.maxPayload <= 0 { // a server that does not say stores 1 MiB
		w.maxPayload = 1 << 20
	}
	w.mu.Unlock()
	for _, ref := range welcome.Lost {
		w.stopLease(leaseKey{ref.StepId, ref.LeaseGeneration}, "lost")
	}
	w.mu.Lock()
	w.stream = stream
	w.mu.Unlock()
	w.flush()
}

func (w *Worker) startLease(l *pb.Lease) {
	key := leaseKey{l.StepId, l.LeaseGeneration}
	lease := leaseFromWire(l)
	// The handler's context outlives the stream: a handler keeps running across a
	// reconnect, and only Stop, a lost lease or the end of Run cancels it.
	hctx, cancel := context.WithCancel(context.WithValue(context.Background(), traceKey{}, lease.Trace))
	h := &held{lease: lease, cancel: cancel}
	w.mu.Lock()
	if _, dup := w.held[key]; dup {
		w.mu.Unlock()
		cancel()
		return
	}
	w.held[key] = h
	// While draining, the lease waits unanswered: it fills a slot, so nothing more is
	// pushed, whereas handing it back now would free the slot and bring it straight back.
	h.started = !w.draining
	w.mu.Unlock()
	if !h.started {
		return
	}
	w.opts.Logf("lease %s %s/%d attempt %d trace %s", lease.Node, lease.StepID, lease.LeaseGeneration, lease.Attempt,
		traceLabel(lease.Trace))
	go func() {
		out, err := w.call(hctx, lease)
		w.mu.Lock()
		maxPayload := w.maxPayload
		w.mu.Unlock()
		w.finish(key, h, resultFor(lease, out, err, maxPayload))
	}()
}

// call runs the handler, turning a panic into a retryable failure.
func (w *Worker) call(ctx context.Context, lease *Lease) (out interface{}, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = panicError{value: p, stack: debug.Stack()}
		}
	}()
	handler, ok := w.opts.Handlers[lease.Kind]
	if !ok {
		return nil, fmt.Errorf("no handler for kind %q", lease.Kind)
	}
	return handler(ctx, lease)
}

func (w *Worker) finish(key leaseKey, h *held, r *pb.StepResult) {
	w.mu.Lock()
	if w.held[key] != h { // stopped or lost: its result would only be refused
		w.mu.Unlock()
		return
	}
	h.result = r
	w.mu.Unlock()
	w.flush()
}

// flush sends every result not yet sent on the current stream; results wait in held
// while the stream is down and go out after the next Welcome.
func (w *Worker) flush() {
	w.mu.Lock()
	stream, batch := w.stream, []*pb.StepResult(nil)
	if stream != nil {
		for _, h := range w.held {
			if h.result != nil && h.sentIn != w.session {
				h.sentIn = w.session
				batch = append(batch, h.result)
			}
		}
	}
	w.mu.Unlock()
	if len(batch) > 0 {
		w.send(stream, &pb.WorkerMessage{Msg: &pb.WorkerMessage_Results{Results: &pb.Results{Results: batch}}})
	}
}

func (w *Worker) onAck(a *pb.ResultAck) {
	key := leaseKey{a.StepId, a.LeaseGeneration}
	w.mu.Lock()
	h, ok := w.held[key]
	if !ok {
		w.mu.Unlock()
		return
	}
	// Every ack ends the lease. INVALID means our answer was malformed and the server
	// failed the attempt in its place: a bug in this worker, logged as such.
	if a.Status == pb.AckStatus_ACK_STATUS_INVALID {
		w.opts.Logf("result for %s/%d refused as invalid: %s", a.StepId, a.LeaseGeneration, a.Detail)
	}
	delete(w.held, key)
	w.mu.Unlock()
	w.opts.Logf("ack %s %s/%d %s %s", h.lease.Node, a.StepId, a.LeaseGeneration, a.Status, a.Detail)
}

func (w *Worker) stopLease(key leaseKey, reason string) {
	w.mu.Lock()
	h, ok := w.held[key]
	if ok {
		delete(w.held, key)
	}
	w.mu.Unlock()
	if ok {
		w.opts.Logf("stop %s/%d: %s", key.stepID, key.generation, reason)
		h.lease.stopReason.Store(reason)
		h.cancel()
	}
}

func (w *Worker) stopAll(reason string) {
	w.mu.Lock()
	keys := make([]leaseKey, 0, len(w.held))
	for k := range w.held {
		keys = append(keys, k)
	}
	w.mu.Unlock()
	for _, k := range keys {
		w.stopLease(k, reason)
	}
}

func (w *Worker) send(stream pb.Workers_ConnectClient, msg *pb.WorkerMessage) {
	w.sendMu.Lock()
	defer w.sendMu.Unlock()
	// A failed send means the stream is gone; Recv sees that and the worker reconnects.
	_ = stream.Send(msg)
}
