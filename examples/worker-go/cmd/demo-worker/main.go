// Command demo-worker is a Cyclone worker whose behaviour per step kind is scripted on
// the command line, so that tests can make it succeed, fail, snooze, wait for a Stop,
// or hang until killed.
//
//	demo-worker --address 127.0.0.1:7233 --slots 2 --marker-dir /tmp/m \
//	  --kind extract=succeed --kind flaky=fail:2 --kind broken=permanent \
//	  --kind later=snooze:0.5 --kind slow=block --kind nap=sleep:2 --kind stuck=hang \
//	  --kind traced=trace
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"cyclone.example/worker"
)

const lang = "go"

type kindFlags []string

func (k *kindFlags) String() string     { return strings.Join(*k, ",") }
func (k *kindFlags) Set(v string) error { *k = append(*k, v); return nil }

// derive is the output of a succeeding step: the run input's "value" for a root node,
// else the sum of the parents' values, plus one; and which language made each parent.
func derive(l *worker.Lease, workerID string) interface{} {
	base := 0.0
	from := map[string]interface{}{}
	if len(l.Parents) == 0 {
		if in, ok := l.Input.(map[string]interface{}); ok {
			base, _ = in["value"].(float64)
		}
	}
	for node, out := range l.Parents {
		o, _ := out.(map[string]interface{})
		v, _ := o["value"].(float64)
		base += v
		from[node] = o["lang"]
	}
	return map[string]interface{}{
		"lang": lang, "worker": workerID, "node": l.Node, "attempt": l.Attempt, "value": base + 1, "from": from,
	}
}

func explode(node string) {
	panic("demo explosion in " + node)
}

func behaviour(spec, markerDir, workerID string) (worker.Handler, error) {
	name, arg := spec, ""
	if i := strings.IndexByte(spec, ':'); i >= 0 {
		name, arg = spec[:i], spec[i+1:]
	}
	marker := func(l *worker.Lease, suffix, text string) {
		_ = os.WriteFile(filepath.Join(markerDir, l.StepID+"."+suffix), []byte(text), 0o644)
	}
	switch name {
	case "succeed":
		return func(_ context.Context, l *worker.Lease) (interface{}, error) { return derive(l, workerID), nil }, nil
	case "fail":
		times, err := strconv.Atoi(arg)
		if err != nil {
			return nil, fmt.Errorf("fail:N wants a count: %w", err)
		}
		return func(_ context.Context, l *worker.Lease) (interface{}, error) {
			if int(l.Attempt) <= times {
				return nil, worker.RetryAfter(fmt.Errorf("planned failure %d of %d", l.Attempt, times), 100*time.Millisecond)
			}
			return derive(l, workerID), nil
		}, nil
	case "permanent":
		return func(_ context.Context, l *worker.Lease) (interface{}, error) {
			return nil, worker.Permanent(fmt.Errorf("planned permanent failure of %s", l.Node))
		}, nil
	case "panic":
		// A panic two calls deep: the worker sends its goroutine's stack as Failed.details.
		return func(_ context.Context, l *worker.Lease) (interface{}, error) {
			explode(l.Node)
			return nil, nil
		}, nil
	case "snooze":
		seconds, err := strconv.ParseFloat(arg, 64)
		if err != nil {
			return nil, fmt.Errorf("snooze:SECONDS wants a number: %w", err)
		}
		// Lease carries no snooze count, so this process remembers which steps it snoozed.
		var mu sync.Mutex
		snoozed := map[string]bool{}
		return func(_ context.Context, l *worker.Lease) (interface{}, error) {
			mu.Lock()
			first := !snoozed[l.StepID]
			snoozed[l.StepID] = true
			mu.Unlock()
			if first {
				return nil, worker.Snooze(time.Duration(seconds * float64(time.Second)))
			}
			return derive(l, workerID), nil
		}, nil
	case "block":
		return func(ctx context.Context, l *worker.Lease) (interface{}, error) {
			marker(l, "started", workerID)
			<-ctx.Done()
			marker(l, "stopped", l.StopReason())
			return nil, ctx.Err()
		}, nil
	case "sleep":
		seconds, err := strconv.ParseFloat(arg, 64)
		if err != nil {
			return nil, fmt.Errorf("sleep:SECONDS wants a number: %w", err)
		}
		// Succeeds after a while, even across a lost stream; marks when it is done.
		return func(ctx context.Context, l *worker.Lease) (interface{}, error) {
			marker(l, "started", workerID)
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(time.Duration(seconds * float64(time.Second))):
			}
			marker(l, "done", workerID)
			return derive(l, workerID), nil
		}, nil
	case "big":
		// Returns {"blob": "xxx..."} of BYTES characters: over the server's payload limit,
		// the worker sends only its size and the step is discarded (output_too_large).
		n, err := strconv.Atoi(arg)
		if err != nil {
			return nil, fmt.Errorf("big:BYTES wants a count: %w", err)
		}
		return func(_ context.Context, _ *worker.Lease) (interface{}, error) {
			return map[string]string{"blob": strings.Repeat("x", n)}, nil
		}, nil
	case "trace":
		// Returns the trace context the handler got, as parsed from the lease and as its
		// context.Context carries it.
		return func(ctx context.Context, l *worker.Lease) (interface{}, error) {
			out := map[string]interface{}{"lang": lang, "traceparent": "", "from_context": worker.TraceFromContext(ctx) == l.Trace}
			if t := l.Trace; t != nil {
				out["traceparent"], out["tracestate"], out["trace_id"], out["span_id"], out["sampled"] =
					t.Traceparent, t.Tracestate, t.TraceID, t.SpanID, t.Sampled
			}
			return out, nil
		}, nil
	case "hang":
		return func(_ context.Context, l *worker.Lease) (interface{}, error) {
			marker(l, "started", workerID)
			select {} // until the process is killed
		}, nil
	}
	return nil, errors.New("unknown behaviour " + strconv.Quote(spec) + ": succeed, fail:N, permanent, panic, snooze:SECONDS, block, sleep:SECONDS, big:BYTES, trace or hang")
}

func main() {
	var kinds kindFlags
	address := flag.String("address", envOr("CYCLONE_ADDRESS", "127.0.0.1:7233"), "server HOST:PORT")
	workerID := flag.String("worker-id", envOr("CYCLONE_WORKER_ID", fmt.Sprintf("go-demo-%d", os.Getpid())), "worker id")
	slots := flag.Int("slots", 1, "leases held at once")
	markerDir := flag.String("marker-dir", envOr("CYCLONE_MARKER_DIR", "."), "where block/hang write <step_id>.started and .stopped")
	flag.Var(&kinds, "kind", "NAME=BEHAVIOUR, repeatable (also CYCLONE_KINDS, comma-separated)")
	flag.Parse()
	if env := os.Getenv("CYCLONE_KINDS"); env != "" && len(kinds) == 0 {
		kinds = strings.Split(env, ",")
	}
	if len(kinds) == 0 {
		log.Fatal("give at least one --kind NAME=BEHAVIOUR")
	}
	handlers := map[string]worker.Handler{}
	for _, spec := range kinds {
		i := strings.IndexByte(spec, '=')
		if i < 1 {
			log.Fatalf("--kind wants NAME=BEHAVIOUR, got %q", spec)
		}
		h, err := behaviour(spec[i+1:], *markerDir, *workerID)
		if err != nil {
			log.Fatal(err)
		}
		handlers[spec[:i]] = h
	}
	w := worker.New(worker.Options{Address: *address, Handlers: handlers, Slots: *slots, WorkerID: *workerID})
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		log.Printf("%v: draining", <-sigs)
		w.Stop(10 * time.Second)
	}()
	if err := w.Run(context.Background()); err != nil {
		log.Fatal(err)
	}
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}
