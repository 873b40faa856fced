package main

import (
	"context"
	"github.com/cyclone-workflows/cyclone/sdks/go/worker"
	"log"
)

func main() {
	w := worker.New(worker.Options{Address: "127.0.0.1:7233", Slots: 4})
	w.Handle("greet", func(ctx context.Context, l *worker.Lease) (any, error) {
		var in struct{ Name string }
		err := l.DecodeInput(&in) // the run input, {"name": "Ada"}
		return map[string]string{"greeting": "hello " + in.Name}, err
	})
	if err := w.RunUntilSignal(); err != nil { // SIGTERM or Ctrl-C: a graceful stop
		log.Fatal(err)
	}
}
