// Package worker is Cyclone's Go worker runtime: it runs your handlers for the steps the
// server hands out, over one gRPC stream per process (Workers.Connect; see
// docs/protocol.md), and answers each lease with the handler's outcome.
//
//	w := worker.New(worker.Options{Address: "127.0.0.1:7233", Slots: 4})
//	w.Handle("greet", func(ctx context.Context, l *worker.Lease) (any, error) {
//		var in struct{ Name string `json:"name"` }
//		if err := l.DecodeInput(&in); err != nil {
//			return nil, worker.Permanent(err)
//		}
//		return map[string]string{"greeting": "hello " + in.Name}, nil
//	})
//	if err := w.RunUntilSignal(); err != nil { // until SIGTERM or Ctrl-C, then a graceful stop
//		log.Fatal(err)
//	}
//
// What it does for you: one goroutine per lease (up to Slots at once); Pong for every
// Ping, and a stream silent for 3 heartbeat intervals is dropped; reconnects with
// backoff, listing the leases it still holds in Hello so they survive; results are kept
// until acked and sent again after a reconnect; Stop (and leases lost across a
// reconnect) cancel the handler's context; outputs are measured as the server measures
// them, and one over the server's limit is sent as its size; when Run's context ends,
// no new handler starts, running ones get Options.Grace to finish, and leases that
// arrived meanwhile are handed back unrun.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand"
	"os"
	"os/signal"
	"regexp"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cyclone-workflows/cyclone/sdks/go/client"
	"github.com/cyclone-workflows/cyclone/sdks/go/cyclonepb"
	"github.com/cyclone-workflows/cyclone/sdks/go/internal/dial"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
)

const sdkName = "go/" + dial.Version

// Options configure a Worker. Address is required.
type Options struct {
	Address string                           // HOST:PORT of a Cyclone server
	Token   string                           // bearer token, for a server with auth
	TLS     credentials.TransportCredentials // nil: plaintext
	// Slots is how many leases the worker runs at once (Hello.slots), 1 to 10000.
	// Default 8.
	Slots int
	// WorkerID names the worker (the steps' lease_owner); stable across its reconnects,
	// unique among workers. Default host:pid:random.
	WorkerID string
	// Grace is how long running handlers get to finish after Run's context ends.
	// Default 30 s.
	Grace time.Duration
	// ConnectTimeout bounds the wait for the server's Welcome. Default 10 s.
	ConnectTimeout time.Duration
	// Reconnect is the backoff between connection attempts.
	Reconnect Reconnect
	// Logger receives the worker's logs; each handler's Lease.Log is derived from it.
	// Default slog.Default().
	Logger *slog.Logger
	// Middleware wraps every handler, the first outermost.
	Middleware []Middleware
	// DialOptions are appended to the SDK's own.
	DialOptions []grpc.DialOption
}

// Reconnect is the backoff between attempts to connect: Initial doubling up to Max, plus
// a random jitter of up to Initial. After Attempts consecutive failures Run returns the
// last error (0: never give up). A stream that was up and ended is reconnected at once
// (after Initial), with a fresh budget.
type Reconnect struct {
	Initial  time.Duration // default 100 ms
	Max      time.Duration // default 5 s
	Attempts int
}

// Worker runs handlers for step kinds. Make it with New, register handlers with Handle,
// then Run it (once).
type Worker struct {
	opts     Options
	id       string
	log      *slog.Logger
	handlers map[string]Handler
	table    *table

	ran     atomic.Bool
	stopCh  chan struct{}
	stopped sync.Once

	mu       sync.Mutex
	session  *session // the welcomed stream, while one is up
	upCh     chan struct{}
	countsMu sync.Mutex
	counts   map[string]int64
}

// New makes a Worker from opts, with defaults filled in; register handlers with Handle,
// then Run it. A mistake in opts (no Address, Slots out of range) is Run's error.
func New(opts Options) *Worker {
	if opts.Slots == 0 {
		opts.Slots = 8
	}
	if opts.WorkerID == "" {
		host, _ := os.Hostname()
		opts.WorkerID = fmt.Sprintf("%s:%d:%08x", host, os.Getpid(), rand.Uint32())
	}
	if opts.Grace <= 0 {
		opts.Grace = 30 * time.Second
	}
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = 10 * time.Second
	}
	if opts.Reconnect.Initial <= 0 {
		opts.Reconnect.Initial = 100 * time.Millisecond
	}
	if opts.Reconnect.Max <= 0 {
		opts.Reconnect.Max = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	w := &Worker{opts: opts, id: opts.WorkerID, log: opts.Logger, handlers: map[string]Handler{},
		stopCh: make(chan struct{}), upCh: make(chan struct{}), counts: map[string]int64{}}
	w.table = newTable(w)
	return w
}

// check is what Run refuses to start with.
func (w *Worker) check() error {
	switch {
	case w.opts.Address == "":
		return errors.New("cyclone worker: Options.Address is required (HOST:PORT)")
	case w.opts.Slots < 1 || w.opts.Slots > 10000:
		return fmt.Errorf("cyclone worker: Slots %d must be between 1 and 10000", w.opts.Slots)
	case len(w.opts.WorkerID) > 200:
		return fmt.Errorf("cyclone worker: WorkerID is %d characters, at most 200", len(w.opts.WorkerID))
	case len(w.handlers) == 0:
		return errors.New("cyclone worker: no handlers (worker.Handle(kind, handler) first)")
	}
	return nil
}

var kindRE = regexp.MustCompile(`^[A-Za-z0-9_.:/-]{1,200}$`)

// Handle registers h as the handler of step kind `kind`. Like http.ServeMux.Handle, it
// panics on a malformed or duplicate kind, a nil handler, or after Run started: those
// are mistakes in the program, not conditions to handle.
func (w *Worker) Handle(kind string, h Handler) {
	switch {
	case !kindRE.MatchString(kind):
		panic(fmt.Sprintf("cyclone worker: kind %q must be 1 to 200 characters of [A-Za-z0-9_.:/-]", kind))
	case h == nil:
		panic(fmt.Sprintf("cyclone worker: nil handler for kind %q", kind))
	case w.ran.Load():
		panic("cyclone worker: Handle after Run")
	}
	if _, dup := w.handlers[kind]; dup {
		panic(fmt.Sprintf("cyclone worker: kind %q already has a handler", kind))
	}
	w.handlers[kind] = h
}

// ID is the worker id sent in Hello (the steps' lease_owner).
func (w *Worker) ID() string { return w.id }

func (w *Worker) kinds() []string {
	kinds := make([]string, 0, len(w.handlers))
	for k := range w.handlers {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	return kinds
}

// Connected returns a channel that is closed once the worker's stream is up (after the
// first Welcome).
func (w *Worker) Connected() <-chan struct{} { return w.upCh }

// Counts returns what happened to the worker's leases, results and streams so far, by
// name: "leases", "welcomes", "disconnects", ack statuses ("applied", "stale", "ended",
// "unknown", "invalid") and "stopped_<reason>".
func (w *Worker) Counts() map[string]int64 {
	w.countsMu.Lock()
	defer w.countsMu.Unlock()
	out := make(map[string]int64, len(w.counts))
	for k, v := range w.counts {
		out[k] = v
	}
	return out
}

func (w *Worker) count(name string) {
	w.countsMu.Lock()
	w.counts[name]++
	w.countsMu.Unlock()
}

// RunUntilSignal runs the worker until SIGTERM or SIGINT (Ctrl-C), then stops it
// gracefully: Run with a context that those signals end.
func (w *Worker) RunUntilSignal() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	return w.Run(ctx)
}

// Stop asks Run to stop gracefully, as the end of its context does. Safe to call from any
// goroutine, more than once.
func (w *Worker) Stop() { w.stopped.Do(func() { close(w.stopCh) }) }

// Run connects and runs leases until ctx ends or Stop is called, then stops gracefully:
// no new handler starts, running handlers get Options.Grace to finish and have their
// results acked, leases that arrived meanwhile are handed back unrun (a zero-delay
// snooze: same attempt), handlers still running after the grace are cancelled without an
// answer (their leases expire and are reclaimed, as after a crash), and the stream is
// half-closed. Run then returns nil.
//
// Run returns an error (a *client.Error) only when the server refuses the worker for good
// (INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED) or Reconnect.Attempts
// consecutive connection attempts failed. Handler contexts carry ctx's values, not its
// cancellation.
func (w *Worker) Run(ctx context.Context) error {
	if err := w.check(); err != nil {
		return err
	}
	if !w.ran.CompareAndSwap(false, true) {
		return errors.New("cyclone worker: Run called twice")
	}
	conn, err := dial.Dial(dial.Config{Address: w.opts.Address, Token: w.opts.Token, TLS: w.opts.TLS,
		Extra: w.opts.DialOptions})
	if err != nil {
		return err
	}
	defer conn.Close()
	w.table.base = context.WithoutCancel(ctx)
	defer w.table.abandon()

	connCtx, cancelConn := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelConn()
	connDone := make(chan error, 1)
	go func() { connDone <- w.connectLoop(connCtx, cyclonepb.NewWorkersClient(conn)) }()
	select {
	case err := <-connDone:
		return err
	case <-ctx.Done():
	case <-w.stopCh:
	}
	w.drain(connDone)
	cancelConn()
	if err := <-connDone; err != nil {
		var e *client.Error
		if errors.As(err, &e) && fatal(e.Code) {
			return err
		}
	}
	return nil
}

// drain is the graceful stop (see Run).
func (w *Worker) drain(connDone chan error) {
	w.table.setDraining()
	w.log.Info("cyclone worker draining: no new leases start; waiting for running handlers",
		"worker_id", w.id, "running", w.table.running(), "grace", w.opts.Grace)
	deadline := time.NewTimer(w.opts.Grace)
	defer deadline.Stop()
	for w.table.running() > 0 {
		changed := w.table.watch()
		if w.table.running() == 0 {
			break
		}
		select {
		case <-changed:
			continue
		case err := <-connDone: // a fatal stream error ends the drain
			connDone <- err
			return
		case <-deadline.C:
			w.log.Warn("cyclone worker: grace period over; cancelling the handlers still running",
				"running", w.table.running())
		}
		break
	}
	w.mu.Lock()
	s := w.session
	w.mu.Unlock()
	if s != nil {
		// The hand-backs go out just before the half-close, without waiting for their
		// acks: the server pushes nothing to a worker while one of its snoozes waits for
		// its ack, and reads the half-close before that ack.
		s.beginClose()
	}
	if n := w.table.giveBackUnstarted(); n > 0 {
		w.log.Info("cyclone worker: handing back leases that never started", "leases", n)
	}
	if s != nil {
		s.close(2 * time.Second)
	}
}

func (w *Worker) welcomed(s *session) {
	w.mu.Lock()
	w.session = s
	select {
	case <-w.upCh:
	default:
		close(w.upCh)
	}
	w.mu.Unlock()
	w.count("welcomes")
}

func (w *Worker) unwelcomed(s *session) {
	w.mu.Lock()
	if w.session == s {
		w.session = nil
	}
	w.mu.Unlock()
}

// fatal: the server ends a stream with these when reconnecting cannot help.
func fatal(c codes.Code) bool {
	return c == codes.InvalidArgument || c == codes.Unauthenticated || c == codes.PermissionDenied
}

// connectLoop runs sessions until ctx ends (nil), a session closes gracefully (nil), or
// a fatal error.
func (w *Worker) connectLoop(ctx context.Context, stub cyclonepb.WorkersClient) error {
	policy := w.opts.Reconnect
	failures := 0
	for {
		err := w.runSession(ctx, stub)
		if ctx.Err() != nil || err == nil {
			return nil
		}
		var disc errDisconnected
		if errors.As(err, &disc) {
			var e *client.Error
			if errors.As(disc.err, &e) && fatal(e.Code) {
				return e
			}
			// A welcomed stream died: reconnect at once with a fresh budget, after a short
			// pause so that a server that drops every stream is not hammered.
			w.log.Warn("cyclone worker: stream lost; reconnecting", "worker_id", w.id, "error", disc.err)
			w.count("disconnects")
			failures = 0
			if !sleep(ctx, policy.Initial) {
				return nil
			}
			continue
		}
		var e *client.Error
		if errors.As(err, &e) && fatal(e.Code) {
			return err
		}
		failures++
		if policy.Attempts > 0 && failures >= policy.Attempts {
			return err
		}
		wait := policy.Initial << min(failures-1, 30)
		if wait > policy.Max || wait <= 0 {
			wait = policy.Max
		}
		wait += time.Duration(rand.Int63n(int64(policy.Initial)))
		w.log.Warn("cyclone worker: cannot connect; retrying", "worker_id", w.id, "address", w.opts.Address,
			"error", err, "in", wait.Round(time.Millisecond))
		if !sleep(ctx, wait) {
			return nil
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
