// The stream itself: hello with kinds and slots, leases, results matched to acks by
// (step_id, lease_generation), Stop -> cancel the handler's context, Ping -> Pong,
// reconnect with exponential backoff re-sending Hello with the held leases.

package worker

import (
	"context"
	"fmt"
	"log"
	"math/rand"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"cyclone.example/pb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Options configure a Worker. Address and Handlers are required.
type Options struct {
	Address  string             // HOST:PORT of a Cyclone server
	Handlers map[string]Handler // by step kind; these are the kinds in Hello
	Slots    int                // leases held at once (Hello.slots); default 1
	WorkerID string             // stable across reconnects; default host:pid:random
	// Reconnect backoff: the first delay and the cap (doubled per failure, with jitter).
	BackoffInitial, BackoffMax time.Duration
	Logf                       func(format string, args ...interface{})
}

// Before Welcome there is no heartbeat interval; a server silent this long is dead.
const welcomeTimeout = 15 * time.Second

// Worker is one worker process's stream to Cyclone.
//
//	w := worker.New(worker.Options{Address: "127.0.0.1:7233", Handlers: handlers, Slots: 4})
//	go func() { <-sigterm; w.Stop(10 * time.Second) }()
//	err := w.Run(context.Background())
type Worker struct {
	opts   Options
	sendMu sync.Mutex // grpc-go streams allow one concurrent sender

	mu        sync.Mutex
	held      map[leaseKey]*held
	stream    pb.Workers_ConnectClient // set once welcomed, nil while down
	session   int
	draining  bool
	stopping  bool
	cancelRun context.CancelFunc
	// The largest output the server stores (Welcome.max_payload_bytes), guarded by mu.
	maxPayload int64
}

// New makes a Worker; Run connects it.
func New(opts Options) *Worker {
	if opts.Slots < 1 {
		opts.Slots = 1
	}
	if opts.WorkerID == "" {
		host, _ := os.Hostname()
		opts.WorkerID = fmt.Sprintf("%s:%d:%08x", host, os.Getpid(), rand.Uint32())
	}
	if opts.BackoffInitial <= 0 {
		opts.BackoffInitial = 100 * time.Millisecond
	}
	if opts.BackoffMax <= 0 {
		opts.BackoffMax = 10 * time.Second
	}
	if opts.Logf == nil {
		prefix := fmt.Sprintf("[cyclone-worker %s] ", opts.WorkerID)
		opts.Logf = func(format string, args ...interface{}) { log.Printf(prefix+format, args...) }
	}
	return &Worker{opts: opts, held: map[leaseKey]*held{}}
}

// ID is the worker id sent in Hello (the steps' lease_owner).
func (w *Worker) ID() string { return w.opts.WorkerID }

// Run serves until ctx ends or Stop is called. It returns an error only when the server
// refuses the worker for good (INVALID_ARGUMENT or an auth status).
func (w *Worker) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	w.mu.Lock()
	w.cancelRun = cancel
	w.mu.Unlock()
	defer cancel()
	conn, err := grpc.Dial(w.opts.Address, grpc.WithInsecure(), grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 200 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second},
		MinConnectTimeout: 5 * time.Second,
	}),
		// A lease carries its input and parents' outputs as protobuf Values, up to 5 or 6 times
		// their JSON size: more than gRPC's default 4 MiB for payloads near the 1 MiB limit.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		return err
	}
	defer conn.Close()
	defer w.stopAll("shutdown")
	client := pb.NewWorkersClient(conn)
	delay := w.opts.BackoffInitial
	for {
		welcomed, err := w.connectOnce(ctx, client)
		if ctx.Err() != nil || w.isStopping() {
			return nil
		}
		switch status.Code(err) {
		case codes.InvalidArgument, codes.Unauthenticated, codes.PermissionDenied:
			return fmt.Errorf("stream ended, not reconnecting: %w", err)
		}
		if welcomed {
			delay = w.opts.BackoffInitial
		}
		wait := time.Duration(float64(delay) * (0.5 + rand.Float64()/2))
		w.opts.Logf("stream ended (%v); reconnecting in %v", err, wait.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		if delay *= 2; delay > w.opts.BackoffMax {
			delay = w.opts.BackoffMax
		}
	}
}

// Stop drains gracefully: no new handler starts; running handlers get up to grace to
// finish and have their results acked. Then leases that arrived meanwhile are handed back
// (Snoozed, delay 0: same attempt), handlers still running are cancelled without an
// answer (their leases expire and are reclaimed, as after a crash), and the worker
// half-closes the stream, after which the server pushes nothing more and ends it.
func (w *Worker) Stop(grace time.Duration) {
	w.mu.Lock()
	w.draining = true
	w.mu.Unlock()
	w.until(grace, func() bool {
		for _, h := range w.held {
			if h.started {
				return false
			}
		}
		return true
	})
	w.mu.Lock()
	w.stopping = true
	var giveBack, cut []leaseKey
	for k, h := range w.held {
		if !h.started {
			giveBack = append(giveBack, k)
			h.result = resultFor(h.lease, nil, Snooze(0), w.maxPayload)
		} else if h.result == nil {
			cut = append(cut, k)
		}
	}
	stream, cancel := w.stream, w.cancelRun
	w.mu.Unlock()
	for _, k := range cut {
		w.stopLease(k, "shutdown")
	}
	w.flush()
	if stream != nil {
		w.sendMu.Lock()
		_ = stream.CloseSend()
		w.sendMu.Unlock()
		w.until(3*time.Second, func() bool { return w.stream != stream }) // acks, then the server ends it
	}
	if cancel != nil {
		cancel()
	}
}

// until polls done (called with w.mu held) until it holds or timeout passes.
func (w *Worker) until(timeout time.Duration, done func() bool) {
	for end := time.Now().Add(timeout); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		w.mu.Lock()
		ok := done()
		w.mu.Unlock()
		if ok {
			return
		}
	}
}

func (w *Worker) isStopping() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stopping
}

func (w *Worker) connectOnce(ctx context.Context, client pb.WorkersClient) (welcomed bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.Connect(ctx)
	if err != nil {
		return false, err
	}
	w.mu.Lock()
	w.session++
	hello := &pb.Hello{WorkerId: w.opts.WorkerID, Slots: int32(w.opts.Slots), Sdk: "go-example/0.1.0"}
	for kind := range w.opts.Handlers {
		hello.Kinds = append(hello.Kinds, kind)
	}
	for k := range w.held {
		hello.Held = append(hello.Held, &pb.LeaseRef{StepId: k.stepID, LeaseGeneration: k.generation})
	}
	w.mu.Unlock()
	w.send(stream, &pb.WorkerMessage{Msg: &pb.WorkerMessage_Hello{Hello: hello}})

	var lastHeard, silence int64 = time.Now().UnixNano(), int64(welcomeTimeout)
	go func() { // workers.proto: silence for 3 heartbeat intervals means the stream is dead
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-tick.C:
				if quiet := now.UnixNano() - atomic.LoadInt64(&lastHeard); quiet > atomic.LoadInt64(&silence) {
					w.opts.Logf("no message from the server for %v; dropping the stream", time.Duration(quiet).Round(time.Millisecond))
					cancel()
					return
				}
			}
		}
	}()
	defer func() {
		w.mu.Lock()
		if w.stream == stream {
			w.stream = nil
		}
		w.mu.Unlock()
	}()
	for {
		msg, err := stream.Recv()
		if err != nil {
			return welcomed, err
		}
		atomic.StoreInt64(&lastHeard, time.Now().UnixNano())
		switch m := msg.Msg.(type) {
		case *pb.ServerMessage_Welcome:
			welcomed = true
			if hb := m.Welcome.GetHeartbeatInterval().AsDuration(); hb > 0 {
				atomic.StoreInt64(&silence, int64(3*hb))
			}
			w.onWelcome(stream, m.Welcome)
		case *pb.ServerMessage_Leases:
			for _, l := range m.Leases.Leases {
				w.startLease(l)
			}
		case *pb.ServerMessage_Acks:
			for _, a := range m.Acks.Acks {
				w.onAck(a)
			}
		case *pb.ServerMessage_Stop:
			for _, ref := range m.Stop.Leases {
				w.stopLease(leaseKey{ref.StepId, ref.LeaseGeneration}, m.Stop.Reason)
			}
		case *pb.ServerMessage_Ping:
			// Once stopping, no pong: the half-close follows the hand-backs (zero-delay
			// snoozes), and a message in between would tell the server we are not stopping.
			if !w.isStopping() {
				w.send(stream, &pb.WorkerMessage{Msg: &pb.WorkerMessage_Pong{Pong: &pb.Pong{Nonce: m.Ping.Nonce}}})
			}
		default: // a message type added after this worker was written
		}
	}
}
