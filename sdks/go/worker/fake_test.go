package worker

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/cyclone-workflows/cyclone/sdks/go/cyclonepb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"
)

// wait is how long a test waits for something that should happen (a condition, polled):
// generous, since the machine may be loaded; never a claim on speed.
const wait = 20 * time.Second

// fakeServer is a Workers service whose streams the test drives by hand.
type fakeServer struct {
	cyclonepb.UnimplementedWorkersServer
	addr    string
	streams chan *fakeStream
}

// fakeStream is one Connect call, seen from the server side.
type fakeStream struct {
	t      *testing.T
	srv    cyclonepb.Workers_ConnectServer
	md     metadata.MD
	in     chan *cyclonepb.WorkerMessage // closed when the worker half-closes or the stream ends
	end    chan error                    // what the server ends the stream with
	closed chan struct{}                 // the Connect call returned
}

func startFake(t *testing.T) *fakeServer {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeServer{addr: lis.Addr().String(), streams: make(chan *fakeStream, 16)}
	s := grpc.NewServer()
	cyclonepb.RegisterWorkersServer(s, f)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return f
}

func (f *fakeServer) Connect(srv cyclonepb.Workers_ConnectServer) error {
	md, _ := metadata.FromIncomingContext(srv.Context())
	fs := &fakeStream{srv: srv, md: md, in: make(chan *cyclonepb.WorkerMessage, 100), end: make(chan error, 1),
		closed: make(chan struct{})}
	defer close(fs.closed)
	halfClosed := make(chan struct{})
	go func() {
		defer close(fs.in)
		for {
			m, err := srv.Recv()
			if err == io.EOF {
				close(halfClosed)
			}
			if err != nil {
				return
			}
			fs.in <- m
		}
	}()
	f.streams <- fs
	select {
	case err := <-fs.end:
		return err
	case <-halfClosed: // as the server does: the worker half-closed, the stream ends OK
		return nil
	case <-srv.Context().Done():
		return srv.Context().Err()
	}
}

// accept waits for the worker's next stream and its Hello.
func (f *fakeServer) accept(t *testing.T) (*fakeStream, *cyclonepb.Hello) {
	t.Helper()
	select {
	case fs := <-f.streams:
		fs.t = t
		m := fs.next()
		if m.GetHello() == nil {
			t.Fatalf("first message is not Hello: %v", m)
		}
		return fs, m.GetHello()
	case <-time.After(wait):
		t.Fatal("the worker did not connect")
	}
	return nil, nil
}

// welcome accepts a stream and answers Welcome with a long heartbeat (no silence drop).
func (f *fakeServer) welcome(t *testing.T, maxPayload int64, lost ...*cyclonepb.LeaseRef) (*fakeStream, *cyclonepb.Hello) {
	fs, hello := f.accept(t)
	fs.send(&cyclonepb.ServerMessage{Msg: &cyclonepb.ServerMessage_Welcome{Welcome: &cyclonepb.Welcome{
		ServerId: "fake", LeaseTtl: durationpb.New(30 * time.Second), HeartbeatInterval: durationpb.New(10 * time.Second),
		Lost: lost, MaxPayloadBytes: maxPayload}}})
	return fs, hello
}

func (fs *fakeStream) send(m *cyclonepb.ServerMessage) {
	fs.t.Helper()
	if err := fs.srv.Send(m); err != nil {
		fs.t.Fatalf("send: %v", err)
	}
}

// next returns the worker's next message; nil once the worker half-closed.
func (fs *fakeStream) next() *cyclonepb.WorkerMessage {
	fs.t.Helper()
	select {
	case m := <-fs.in:
		return m
	case <-time.After(wait):
		fs.t.Fatal("no message from the worker")
	}
	return nil
}

// results returns the StepResults of the worker's next Results message, skipping pongs.
func (fs *fakeStream) results() []*cyclonepb.StepResult {
	fs.t.Helper()
	for {
		m := fs.next()
		if m == nil {
			fs.t.Fatal("the worker half-closed instead of answering")
		}
		if rs := m.GetResults(); rs != nil {
			return rs.Results
		}
	}
}

// result returns the worker's next StepResult, skipping pongs.
func (fs *fakeStream) result() *cyclonepb.StepResult {
	fs.t.Helper()
	for {
		m := fs.next()
		if m == nil {
			fs.t.Fatal("the worker half-closed instead of answering")
		}
		if rs := m.GetResults(); rs != nil {
			if len(rs.Results) != 1 {
				fs.t.Fatalf("expected one result, got %v", rs.Results)
			}
			return rs.Results[0]
		}
	}
}

func (fs *fakeStream) lease(leases ...*cyclonepb.Lease) {
	fs.send(&cyclonepb.ServerMessage{Msg: &cyclonepb.ServerMessage_Leases{Leases: &cyclonepb.Leases{Leases: leases}}})
}

func (fs *fakeStream) ack(r *cyclonepb.StepResult, status cyclonepb.AckStatus, detail string) {
	fs.send(&cyclonepb.ServerMessage{Msg: &cyclonepb.ServerMessage_Acks{Acks: &cyclonepb.ResultAcks{Acks: []*cyclonepb.ResultAck{
		{StepId: r.StepId, LeaseGeneration: r.LeaseGeneration, Status: status, Detail: detail}}}}})
}

func (fs *fakeStream) stop(reason string, leases ...*cyclonepb.Lease) {
	stop := &cyclonepb.Stop{Reason: reason}
	for _, l := range leases {
		stop.Leases = append(stop.Leases, &cyclonepb.LeaseRef{StepId: l.StepId, LeaseGeneration: l.LeaseGeneration})
	}
	fs.send(&cyclonepb.ServerMessage{Msg: &cyclonepb.ServerMessage_Stop{Stop: stop}})
}

// hangUp ends the stream with err (nil: OK).
func (fs *fakeStream) hangUp(err error) {
	fs.end <- err
	<-fs.closed
}

func lease(step string, gen int64, kind string) *cyclonepb.Lease {
	return &cyclonepb.Lease{RunId: "run-" + step, StepId: step, Node: kind, Kind: kind, Attempt: 1, MaxAttempts: 3,
		LeaseGeneration: gen}
}

// syncBuffer is a log destination safe for the worker's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// runner is w.Run in the background.
type runner struct {
	t      *testing.T
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// run starts w.Run; the test's cleanup stops it.
func run(t *testing.T, w *Worker) *runner {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &runner{t: t, cancel: cancel, done: make(chan struct{})}
	go func() {
		r.err = w.Run(ctx)
		close(r.done)
	}()
	t.Cleanup(func() { _ = r.stop() })
	return r
}

// stop cancels Run's context (a graceful stop) and returns Run's error.
func (r *runner) stop() error {
	r.cancel()
	return r.wait()
}

// wait returns Run's error once it returned.
func (r *runner) wait() error {
	select {
	case <-r.done:
		return r.err
	case <-time.After(wait):
		r.t.Fatal("Run did not return")
	}
	return nil
}

func newWorker(t *testing.T, addr string, opts Options) (*Worker, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	opts.Address = addr
	if opts.WorkerID == "" {
		opts.WorkerID = "w-test"
	}
	if opts.Grace == 0 {
		opts.Grace = 50 * time.Millisecond // the test's cleanup stops the worker: not a long drain
	}
	opts.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return New(opts), logs
}

// eventually polls cond until it holds, failing the test after `wait`.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("not within %v: %s", wait, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
