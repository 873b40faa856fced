package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cyclone-workflows/cyclone/sdks/go/client"
	"github.com/cyclone-workflows/cyclone/sdks/go/cyclonepb"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
)

// When the server's Welcome leaves it out: a safe guess well inside the default lease TTL.
const defaultHeartbeat = 10 * time.Second

// Results are sent in messages of at most this many bytes (one bigger result goes alone).
const maxBatchBytes = 4 << 20

// session speaks the worker protocol on one stream on behalf of a Worker.
type session struct {
	w      *Worker
	stream cyclonepb.Workers_ConnectClient
	cancel context.CancelFunc // ends the stream

	mu         sync.Mutex
	pongs      []int64
	results    []*cyclonepb.StepResult
	closing    bool // no more pongs; half-close once the outbox is empty
	halfClosed bool
	kick       chan struct{} // wakes the writer
	idle       chan struct{} // closed when the writer has half-closed
	ended      chan struct{} // closed when the stream has ended
}

// errDisconnected wraps the end of a stream that the server had welcomed.
type errDisconnected struct{ err error }

func (e errDisconnected) Error() string { return e.err.Error() }
func (e errDisconnected) Unwrap() error { return e.err }

// runSession connects, says Hello, and serves the stream until it ends. It returns nil
// only after close(); errDisconnected when a welcomed stream ended otherwise; another
// error when no Welcome came.
func (w *Worker) runSession(ctx context.Context, stub cyclonepb.WorkersClient) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := stub.Connect(sctx)
	if err != nil {
		return client.ErrorFromStatus(err)
	}
	s := &session{w: w, stream: stream, cancel: cancel, kick: make(chan struct{}, 1), idle: make(chan struct{}),
		ended: make(chan struct{})}
	defer close(s.ended)

	hello := &cyclonepb.Hello{WorkerId: w.id, Kinds: w.kinds(), Slots: int32(w.opts.Slots), Held: w.table.refs(),
		Sdk: sdkName}
	if err := stream.Send(&cyclonepb.WorkerMessage{Msg: &cyclonepb.WorkerMessage_Hello{Hello: hello}}); err != nil {
		_, err = stream.Recv() // the status that ended the stream
		return streamError(err, "")
	}
	first, err := s.recv(sctx, w.opts.ConnectTimeout)
	if err != nil {
		return err
	}
	welcome := first.GetWelcome()
	if welcome == nil {
		return &client.Error{Code: codes.Unavailable, Message: fmt.Sprintf("expected Welcome, got %T", first.Msg)}
	}
	heartbeat := welcome.GetHeartbeatInterval().AsDuration()
	if heartbeat <= 0 {
		heartbeat = defaultHeartbeat
	}
	w.log.Info(fmt.Sprintf("cyclone worker connected: welcome from %s", welcome.ServerId), "worker_id", w.id,
		"address", w.opts.Address, "heartbeat", heartbeat, "lost", len(welcome.Lost), "held", len(hello.Held))
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		s.writeLoop(sctx)
	}()
	defer func() {
		cancel()
		<-writerDone
	}()
	pending := w.table.welcomed(s.queueResult, welcome.Lost, welcome.MaxPayloadBytes)
	defer w.table.disconnected()
	w.welcomed(s)
	defer w.unwelcomed(s)
	for _, r := range pending {
		s.queueResult(r)
	}
	for {
		msg, err := s.recv(sctx, 3*heartbeat)
		if err != nil {
			if s.isClosing() {
				return nil
			}
			var e *client.Error
			if errors.As(err, &e) && fatal(e.Code) {
				return err
			}
			return errDisconnected{err}
		}
		s.dispatch(msg)
	}
}

// recv reads one message, or fails after `within` of silence.
func (s *session) recv(ctx context.Context, within time.Duration) (*cyclonepb.ServerMessage, error) {
	var timedOut atomic.Bool
	timer := time.AfterFunc(within, func() {
		timedOut.Store(true)
		s.cancel()
	})
	msg, err := s.stream.Recv()
	timer.Stop()
	if err == nil {
		return msg, nil
	}
	if timedOut.Load() {
		return nil, &client.Error{Code: codes.Unavailable, Message: fmt.Sprintf("the server sent nothing for %v", within)}
	}
	return nil, streamError(err, "the server ended the stream")
}

func streamError(err error, eof string) error {
	if err == nil || errors.Is(err, io.EOF) {
		return &client.Error{Code: codes.Unavailable, Message: eof}
	}
	return client.ErrorFromStatus(err)
}

func (s *session) dispatch(msg *cyclonepb.ServerMessage) {
	t := s.w.table
	switch m := msg.Msg.(type) {
	case *cyclonepb.ServerMessage_Leases:
		for _, l := range m.Leases.Leases {
			t.start(l)
		}
	case *cyclonepb.ServerMessage_Acks:
		for _, a := range m.Acks.Acks {
			t.acked(a)
		}
	case *cyclonepb.ServerMessage_Stop:
		reason := m.Stop.Reason
		if reason == "" {
			reason = "stop"
		}
		for _, ref := range m.Stop.Leases {
			t.stop(ref, reason)
		}
	case *cyclonepb.ServerMessage_Ping:
		// Once closing, no pong: the half-close follows the hand-backs (zero-delay
		// snoozes), and a message in between would tell the server we are not stopping.
		s.mu.Lock()
		if !s.closing {
			s.pongs = append(s.pongs, m.Ping.Nonce)
			s.wake()
		}
		s.mu.Unlock()
	default: // a message kind added by a newer server: ignored, as the protocol asks
	}
}

// queueResult queues a result; results queued together go out in one Results message.
func (s *session) queueResult(r *cyclonepb.StepResult) {
	s.mu.Lock()
	s.results = append(s.results, r)
	s.wake()
	s.mu.Unlock()
}

// wake kicks the writer; s.mu is held.
func (s *session) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *session) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

// writeLoop is the stream's only sender (grpc-go allows one at a time).
func (s *session) writeLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		}
		s.mu.Lock()
		pongs, results := s.pongs, s.results
		s.pongs, s.results = nil, nil
		s.mu.Unlock()
		for _, nonce := range pongs {
			if s.send(&cyclonepb.WorkerMessage{Msg: &cyclonepb.WorkerMessage_Pong{Pong: &cyclonepb.Pong{Nonce: nonce}}}) != nil {
				return
			}
		}
		for len(results) > 0 {
			n, size := 0, 0
			for n < len(results) && (n == 0 || size+proto.Size(results[n]) <= maxBatchBytes) {
				size += proto.Size(results[n])
				n++
			}
			batch := &cyclonepb.Results{Results: results[:n]}
			results = results[n:]
			if s.send(&cyclonepb.WorkerMessage{Msg: &cyclonepb.WorkerMessage_Results{Results: batch}}) != nil {
				return
			}
		}
		s.mu.Lock()
		if s.closing && !s.halfClosed && len(s.pongs) == 0 && len(s.results) == 0 {
			s.halfClosed = true
			_ = s.stream.CloseSend()
			close(s.idle)
		}
		s.mu.Unlock()
	}
}

func (s *session) send(msg *cyclonepb.WorkerMessage) error {
	// A failed send means the stream is gone: the reader sees it (or stops hearing pings)
	// and the worker reconnects; unacked results stay in the table and go out again.
	err := s.stream.Send(msg)
	if err != nil {
		s.w.log.Debug("cyclone worker: send failed", "error", err)
	}
	return err
}

// beginClose: no more pongs from now on (the hand-backs and the half-close follow).
func (s *session) beginClose() {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
}

// close flushes what is queued, half-closes, and gives the server `timeout` to end the
// stream (it acks what it received, then ends it with OK).
func (s *session) close(timeout time.Duration) {
	s.mu.Lock()
	s.closing = true
	s.wake()
	s.mu.Unlock()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-s.idle:
	case <-s.ended:
		return
	case <-timer.C:
		return
	}
	select {
	case <-s.ended:
	case <-timer.C:
	}
}
