package client

import (
	"errors"
	"fmt"
	"time"

	"github.com/cyclone-workflows/cyclone/sdks/go/cyclonepb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Workflow is a workflow definition being built: a named DAG of task, child, sleep and
// signal nodes, added with chained calls. Register it with Client.Register.
//
//	wf := client.NewWorkflow("order").
//		Task("reserve").
//		Task("charge", client.Deps("reserve"), client.MaxAttempts(5), client.BackoffInitial(2*time.Second)).
//		Signal("approval", client.Deps("reserve"), client.MaxWait(time.Hour)).
//		Task("ship", client.Deps("charge", "approval"))
//
// A mistake (a duplicate node id, an option a node type does not take) is kept and
// returned by Err and by Register; the server validates the rest (unknown dependencies,
// cycles, names).
type Workflow struct {
	name  string
	nodes []*cyclonepb.Node
	err   error
}

// NewWorkflow starts a definition named name.
func NewWorkflow(name string) *Workflow { return &Workflow{name: name} }

var (
	taskOptions = []string{"Kind", "Deps", "MaxAttempts", "BackoffInitial", "BackoffMax", "Priority", "MaxReclaims",
		"AttemptTimeout", "OnDepFailure", "Retention", "Limits"}
	waitOptions = []string{"Deps", "MaxWait", "OnDepFailure", "Retention"}
)

// Task adds a task node, run by a worker that handles its kind (Kind; default: the id).
// Options: Kind, Deps, MaxAttempts, BackoffInitial, BackoffMax, Priority, MaxReclaims,
// AttemptTimeout, OnDepFailure, Retention, Limits.
func (w *Workflow) Task(id string, opts ...Option) *Workflow {
	return w.add(id, cyclonepb.NodeType_NODE_TYPE_TASK, opts, taskOptions, nil)
}

// Child adds a child node: it starts the registered workflow as a child run and
// completes with that run's result. The child run's input is {"input": <this run's
// input>, "parents": {<dep id>: <dep output>}}. Options: Deps, MaxWait, OnDepFailure,
// Retention.
func (w *Workflow) Child(id, workflow string, opts ...Option) *Workflow {
	return w.add(id, cyclonepb.NodeType_NODE_TYPE_CHILD, opts, waitOptions, func(n *cyclonepb.Node) {
		n.Workflow = workflow
	})
}

// Sleep adds a durable timer: it completes d after its dependencies complete, with output
// {"fired_at": ...}. Options: Deps, MaxWait, OnDepFailure, Retention.
func (w *Workflow) Sleep(id string, d time.Duration, opts ...Option) *Workflow {
	if d < 0 && w.err == nil {
		w.err = fmt.Errorf("node %q: sleep %v is not a non-negative duration", id, d)
	}
	return w.add(id, cyclonepb.NodeType_NODE_TYPE_SLEEP, opts, waitOptions, func(n *cyclonepb.Node) {
		n.Sleep = durationpb.New(d)
	})
}

// Signal adds a signal node: it waits for Client.Signal(runID, name, payload) (name:
// SignalName, default the node id) and completes with the payload. Options: SignalName,
// Deps, MaxWait, OnDepFailure, Retention.
func (w *Workflow) Signal(id string, opts ...Option) *Workflow {
	return w.add(id, cyclonepb.NodeType_NODE_TYPE_SIGNAL, opts, append([]string{"SignalName"}, waitOptions...), nil)
}

func (w *Workflow) add(id string, typ cyclonepb.NodeType, opts []Option, allowed []string, fill func(*cyclonepb.Node)) *Workflow {
	if w.err != nil {
		return w
	}
	if id == "" {
		w.err = errors.New("node id: must be a non-empty string")
		return w
	}
	for _, n := range w.nodes {
		if n.Id == id {
			w.err = fmt.Errorf("node %q: duplicate node id in workflow %q", id, w.name)
			return w
		}
	}
	s, err := collect(fmt.Sprintf("node %q", id), opts, allowed...)
	if err != nil {
		w.err = err
		return w
	}
	node := &cyclonepb.Node{
		Id: id, Kind: s.kind, Deps: s.deps, Type: typ, Signal: s.signal,
		MaxAttempts: s.int32p("MaxAttempts", s.maxAttempts), MaxReclaims: s.int32p("MaxReclaims", s.maxReclaims),
		Priority:       s.int32p("Priority", s.priority),
		BackoffInitial: s.dur("BackoffInitial", s.backoffInitial), BackoffMax: s.dur("BackoffMax", s.backoffMax),
		AttemptTimeout: s.dur("AttemptTimeout", s.attemptTimeout), Retention: s.dur("Retention", s.retention),
		MaxWait: s.dur("MaxWait", s.maxWait), OnDepFailure: s.depFailure(), Limits: s.limits,
	}
	if fill != nil {
		fill(node)
	}
	w.nodes = append(w.nodes, node)
	return w
}

// Name is the workflow's name.
func (w *Workflow) Name() string { return w.name }

// Nodes are the node ids, in the order they were added.
func (w *Workflow) Nodes() []string {
	ids := make([]string, len(w.nodes))
	for i, n := range w.nodes {
		ids[i] = n.Id
	}
	return ids
}

// Kinds are the step kinds of the task nodes: what a worker for this workflow handles.
func (w *Workflow) Kinds() []string {
	var kinds []string
	seen := map[string]bool{}
	for _, n := range w.nodes {
		if n.Type != cyclonepb.NodeType_NODE_TYPE_TASK {
			continue
		}
		k := n.Kind
		if k == "" {
			k = n.Id
		}
		if !seen[k] {
			seen[k] = true
			kinds = append(kinds, k)
		}
	}
	return kinds
}

// Err is the first mistake made while building, or nil.
func (w *Workflow) Err() error { return w.err }

// Request is the RegisterWorkflow request for this definition, or Err.
func (w *Workflow) Request() (*cyclonepb.RegisterWorkflowRequest, error) {
	if w.err != nil {
		return nil, w.err
	}
	return &cyclonepb.RegisterWorkflowRequest{Name: w.name, Nodes: w.nodes}, nil
}
