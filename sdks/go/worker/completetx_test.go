package worker

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/cyclone-workflows/cyclone/sdks/go/cyclonepb"
)

// fakeDB is a database/sql driver that answers cyclone_step_complete with `answer` and
// records what the transaction did.
type fakeDB struct {
	mu     sync.Mutex
	answer string
	log    []string
}

func (d *fakeDB) record(s string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.log = append(d.log, s)
}

func (d *fakeDB) events() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return strings.Join(d.log, "; ")
}

func (d *fakeDB) Open(string) (driver.Conn, error)             { return &fakeConn{d}, nil }
func (d *fakeDB) Connect(context.Context) (driver.Conn, error) { return &fakeConn{d}, nil }
func (d *fakeDB) Driver() driver.Driver                        { return d }

type fakeConn struct{ d *fakeDB }

func (c *fakeConn) Prepare(query string) (driver.Stmt, error) { return &fakeStmt{c.d, query}, nil }
func (c *fakeConn) Close() error                              { return nil }
func (c *fakeConn) Begin() (driver.Tx, error)                 { c.d.record("begin"); return &fakeTx{c.d}, nil }

type fakeTx struct{ d *fakeDB }

func (t *fakeTx) Commit() error   { t.d.record("commit"); return nil }
func (t *fakeTx) Rollback() error { t.d.record("rollback"); return nil }

type fakeStmt struct {
	d     *fakeDB
	query string
}

func (s *fakeStmt) Close() error  { return nil }
func (s *fakeStmt) NumInput() int { return -1 }
func (s *fakeStmt) Exec(args []driver.Value) (driver.Result, error) {
	s.d.record("exec " + s.query)
	return driver.RowsAffected(1), nil
}
func (s *fakeStmt) Query(args []driver.Value) (driver.Rows, error) {
	var parts []string
	for _, a := range args {
		parts = append(parts, fmt.Sprint(a))
	}
	s.d.record(s.query + " [" + strings.Join(parts, ", ") + "]")
	return &fakeRows{value: s.d.answer}, nil
}

type fakeRows struct {
	value string
	done  bool
}

func (r *fakeRows) Columns() []string { return []string{"status"} }
func (r *fakeRows) Close() error      { return nil }
func (r *fakeRows) Next(dest []driver.Value) error {
	if r.done {
		return io.EOF
	}
	r.done = true
	dest[0] = r.value
	return nil
}

func openFake(t *testing.T, answer string) (*sql.DB, *fakeDB) {
	d := &fakeDB{answer: answer}
	db := sql.OpenDB(d)
	t.Cleanup(func() { db.Close() })
	return db, d
}

func TestCompleteInTxCommitsOnlyAnAppliedCompletion(t *testing.T) {
	f := startFake(t)
	w, logs := newWorker(t, f.addr, Options{})
	dbApplied, applied := openFake(t, "applied")
	dbFenced, fenced := openFake(t, "stale")
	dbTooBig, tooBig := openFake(t, "output_too_large")
	errs := make(chan error, 3)
	handler := func(db *sql.DB) Handler {
		return func(ctx context.Context, l *Lease) (any, error) {
			out, err := l.CompleteInTx(ctx, db, func(tx *sql.Tx) (any, error) {
				_, err := tx.ExecContext(ctx, "INSERT INTO payments VALUES (42)")
				return map[string]any{"paid": 42, "note": "<ok>"}, err
			})
			errs <- err
			return out, err
		}
	}
	w.Handle("applied", handler(dbApplied))
	w.Handle("fenced", handler(dbFenced))
	w.Handle("toobig", handler(dbTooBig))
	w.Handle("fails", func(ctx context.Context, l *Lease) (any, error) {
		return l.CompleteInTx(ctx, dbApplied, func(tx *sql.Tx) (any, error) { return nil, errors.New("insert failed") })
	})
	run(t, w)
	fs, _ := f.welcome(t, 0)

	fs.lease(lease("s-applied", 3, "applied"))
	r := fs.result()
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	// Completed in the transaction: the answer only frees the slot, without the output.
	if c := r.GetCompleted(); c == nil || c.Output != nil {
		t.Fatalf("answer after a commit: %v", r)
	}
	want := "begin; exec INSERT INTO payments VALUES (42); SELECT cyclone_step_complete($1, $2, $3::jsonb) " +
		`[s-applied, 3, {"note":"<ok>","paid":42}]; commit`
	if got := applied.events(); got != want {
		t.Fatalf("applied:\n got %s\nwant %s", got, want)
	}
	fs.ack(r, cyclonepb.AckStatus_ACK_STATUS_ENDED, "the step already left running")
	eventually(t, "the ack", func() bool { return w.table.running() == 0 })
	if strings.Contains(logs.String(), "result refused") {
		t.Fatalf("an ENDED ack after a CompleteInTx is expected, not a warning:\n%s", logs)
	}

	fs.lease(lease("s-fenced", 5, "fenced"))
	r = fs.result()
	var fe *FencedError
	if err := <-errs; !errors.As(err, &fe) || fe.Status != "stale" || fe.StepID != "s-fenced" || fe.LeaseGeneration != 5 {
		t.Fatalf("fenced: %v", err)
	}
	if !strings.HasSuffix(fenced.events(), "; rollback") || r.GetFailed() == nil {
		t.Fatalf("fenced: %s / %v", fenced.events(), r)
	}

	fs.lease(lease("s-big", 1, "toobig"))
	r = fs.result()
	<-errs
	if f := r.GetFailed(); f == nil || !f.Permanent || !strings.HasPrefix(f.Message, "output_too_large") ||
		!strings.HasSuffix(tooBig.events(), "; rollback") {
		t.Fatalf("too big: %v / %s", r, tooBig.events())
	}

	fs.lease(lease("s-fails", 1, "fails"))
	if f := fs.result().GetFailed(); f == nil || f.Message != "insert failed" {
		t.Fatalf("fails: %v", f)
	}
	if got := applied.events(); !strings.HasSuffix(got, "commit; begin; rollback") {
		t.Fatalf("a failing fn rolls back: %s", got)
	}
}
