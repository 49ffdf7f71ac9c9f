// Package discovery shows Hermes' routers and tool workers to NATS micro discovery (nats micro
// ls, info, stats; the $SRV subjects), as the gateways' micro service hermes is: each process is
// an instance of its service, hermes-router or hermes-toolworker, named in its metadata.
//
// A tool worker's tools are the endpoints of its service, one each, added as it begins to serve
// them. Its calls come from the bus, never by request/reply, so micro's own counts of an
// endpoint's requests stay at what its subject was asked (the tool's live figures, as JSON);
// the calls the worker ran are each endpoint's stats data: calls, errors, in flight, and
// processing time (the time its tries took, total and per call, in nanoseconds).
package discovery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/worker"
)

// Version is the version of the discovery services' API.
const Version = "1.0.0"

// Names of the services.
const (
	RouterService = "hermes-router"
	WorkerService = "hermes-toolworker"
)

// subjectRoot is where the endpoints' subjects are: <root>.<instance>.<tool>.
const subjectRoot = "hermes.svc.toolworker"

// SubjectTool is the subject of the endpoint of tool at worker instance.
func SubjectTool(instance, tool string) string {
	return subjectRoot + "." + token(instance) + "." + token(tool)
}

// FilterTools matches the endpoints of every worker.
const FilterTools = subjectRoot + ".>"

// notName is what a micro endpoint name, or a subject token, may not hold.
var notName = regexp.MustCompile(`[^A-Za-z0-9_-]`)

// token is s as a micro endpoint name and a subject token.
func token(s string) string {
	if t := notName.ReplaceAllString(s, "_"); t != "" {
		return t
	}
	return "_"
}

// Serve registers a service with no endpoints, name, for the process instance, with metadata
// (besides the instance), until ctx ends.
func Serve(ctx context.Context, nc *nats.Conn, name, description, instance string, metadata map[string]string) error {
	md := maps.Clone(metadata)
	if md == nil {
		md = map[string]string{}
	}
	md["instance"] = instance
	svc, err := micro.AddService(nc, micro.Config{Name: name, Version: Version, Description: description, Metadata: md})
	if err != nil {
		return fmt.Errorf("discovery: %s: %w", name, err)
	}
	<-ctx.Done()
	return svc.Stop()
}

// Tools counts, per tool, the calls a tool worker runs, and shows them as the endpoints of its
// service. Use Observer as the worker's observer, Serving as its Serving hook, and Run beside it.
// It is safe for concurrent use.
type Tools struct {
	Conn     *nats.Conn
	Instance string
	Logger   *slog.Logger

	mu     sync.Mutex          // guards tools and names; never held while micro is called
	tools  map[string]*Figures // by tool
	names  map[string]string   // tool by endpoint name
	showMu sync.Mutex          // guards svc and shown: the endpoints' additions, one at a time
	svc    micro.Service       // nil before Run
	shown  map[string]bool     // tools with an endpoint
}

// Figures are what a worker ran of one tool: its endpoint's stats data, and its answer.
type Figures struct {
	Tool     string `json:"tool"`
	Kind     string `json:"kind"`
	Calls    int64  `json:"calls"`
	Errors   int64  `json:"errors"`
	InFlight int64  `json:"in_flight"`
	// InFlight counts the tries running now. ProcessingTime is the time its tries took, all
	// together; AverageProcessingTime that per call (ns).
	ProcessingTime        time.Duration `json:"processing_time" jsonschema:"description=nanoseconds"`
	AverageProcessingTime time.Duration `json:"average_processing_time" jsonschema:"description=nanoseconds"`
	LastError             string        `json:"last_error,omitempty"`
}

func (t *Tools) stats(tool string) *Figures {
	if t.tools == nil {
		t.tools = map[string]*Figures{}
	}
	s := t.tools[tool]
	if s == nil {
		s = &Figures{Tool: tool}
		t.tools[tool] = s
		if t.names == nil {
			t.names = map[string]string{}
		}
		t.names[token(tool)] = tool
	}
	return s
}

// Serving notes that the worker serves tool, of kind, and shows it.
func (t *Tools) Serving(kind, tool string) {
	t.mu.Lock()
	t.stats(tool).Kind = kind
	t.mu.Unlock()
	t.show(tool, kind)
}

// show adds tool's endpoint once the service runs. micro takes its own lock to add it, and
// holds that lock while it asks endpointData, which takes mu: mu is never held here.
func (t *Tools) show(tool, kind string) {
	t.showMu.Lock()
	defer t.showMu.Unlock()
	if t.svc == nil || t.shown[tool] {
		return
	}
	err := t.svc.AddEndpoint(token(tool), micro.HandlerFunc(func(r micro.Request) { t.answer(r, tool) }),
		micro.WithEndpointSubject(SubjectTool(t.Instance, tool)),
		micro.WithEndpointQueueGroupDisabled(),
		micro.WithEndpointMetadata(map[string]string{"tool": tool, "kind": kind,
			"description": "the calls of " + tool + " this worker ran: see the stats' data, or ask this subject"}))
	if err != nil {
		t.Logger.Warn("discovery: the tool's endpoint", "tool", tool, "err", err)
		return
	}
	t.shown[tool] = true
}

// answer replies with the tool's figures.
func (t *Tools) answer(r micro.Request, tool string) {
	t.mu.Lock()
	s := *t.stats(tool)
	t.mu.Unlock()
	b, _ := json.Marshal(s)
	_ = r.Respond(b, micro.WithHeaders(micro.Headers{"Content-Type": {protocol.ContentTypeJSON}}))
}

// endpointData is what micro's stats show of an endpoint: its tool's figures.
func (t *Tools) endpointData(e *micro.Endpoint) any {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.tools[t.names[e.Name]]; ok {
		return *s
	}
	return nil
}

// Run registers the service and shows the tools served so far, then those served later, until
// ctx ends.
func (t *Tools) Run(ctx context.Context) error {
	if t.Logger == nil {
		t.Logger = slog.New(slog.DiscardHandler)
	}
	if t.Conn == nil {
		return errors.New("discovery: no connection")
	}
	svc, err := micro.AddService(t.Conn, micro.Config{Name: WorkerService, Version: Version,
		Description:  "a Hermes tool worker: its tools, with the calls it ran of each",
		Metadata:     map[string]string{"instance": t.Instance},
		StatsHandler: t.endpointData})
	if err != nil {
		return fmt.Errorf("discovery: %s: %w", WorkerService, err)
	}
	t.showMu.Lock()
	t.svc, t.shown = svc, map[string]bool{}
	t.showMu.Unlock()
	t.mu.Lock()
	kinds := map[string]string{}
	for tool, s := range t.tools {
		if s.Kind != "" {
			kinds[tool] = s.Kind
		}
	}
	t.mu.Unlock()
	for _, tool := range slices.Sorted(maps.Keys(kinds)) {
		t.show(tool, kinds[tool])
	}
	<-ctx.Done()
	t.showMu.Lock()
	t.svc = nil
	t.showMu.Unlock()
	return svc.Stop()
}

// Observer is an observer that counts each tool's calls for discovery, and tells next (nil for
// none) all it is told.
func (t *Tools) Observer(next worker.Observer) worker.Observer { return &observer{t: t, next: next} }

type observer struct {
	t    *Tools
	next worker.Observer
}

func (o *observer) Started(tool string, attempt int, waited time.Duration) {
	o.t.mu.Lock()
	o.t.stats(tool).InFlight++
	o.t.mu.Unlock()
	if o.next != nil {
		o.next.Started(tool, attempt, waited)
	}
}

func (o *observer) Finished(tool string, took time.Duration) {
	o.t.mu.Lock()
	s := o.t.stats(tool)
	if s.InFlight > 0 {
		s.InFlight--
	}
	s.ProcessingTime += took
	o.t.mu.Unlock()
	if o.next != nil {
		o.next.Finished(tool, took)
	}
}

func (o *observer) Retrying(tool, errorCode string) {
	if o.next != nil {
		o.next.Retrying(tool, errorCode)
	}
}

// Recorded counts a call's one result, and an error unless it is ok.
func (o *observer) Recorded(r *protocol.ToolResult) {
	if r.Name == "" {
		if o.next != nil {
			o.next.Recorded(r)
		}
		return
	}
	o.t.mu.Lock()
	s := o.t.stats(r.Name)
	s.Calls++
	s.AverageProcessingTime = s.ProcessingTime / time.Duration(s.Calls)
	if r.Status != protocol.ResultOK {
		s.Errors++
		s.LastError = strings.TrimSpace(r.ErrorCode + " " + protocol.Shorten(string(r.Content), 120))
	}
	o.t.mu.Unlock()
	if o.next != nil {
		o.next.Recorded(r)
	}
}
