package whatif

import (
	"maps"

	"github.com/hermesbus/hermes/internal/routes"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Kind says how a call was, or would be, routed.
type Kind int

// Kinds of routing.
const (
	// NotDispatched: nothing on record says how the call was routed.
	NotDispatched Kind = iota
	// Routed by a rule, named in Outcome.Rule.
	Routed
	// NoRoute: no rule matched; the call failed with NO_ROUTE.
	NoRoute
)

// Outcome is how one call is routed.
type Outcome struct {
	Kind Kind
	// Rule is the rule's name when Kind is Routed.
	Rule string
}

// String returns the rule's name, "no route" or "not dispatched".
func (o Outcome) String() string {
	switch o.Kind {
	case Routed:
		return o.Rule
	case NoRoute:
		return "no route"
	}
	return "not dispatched"
}

// Call is one recorded call compared with a new routes table.
type Call struct {
	RequestID  string
	SessionID  string
	ToolCallID string
	Tool       string
	// Before is how the call was routed, by the record; After is how the new table routes it.
	Before, After Outcome
	// Differences lists, when Before and After name the same rule, what would change about it:
	// "action.kind", "action.timeout_ms", "action.retry", "action.http.url",
	// "action.http.method", "action.http.headers", "action.grpc.service", "action.grpc.method",
	// "action.grpc.headers", "params".
	Differences []string
}

// Report is the outcome of [Record.Compare].
type Report struct {
	// Requests and Calls count what was compared, each request once.
	Requests, Calls int
	// Duplicates counts request records ignored because their request_id was recorded before.
	Duplicates int
	// Unreadable counts recorded requests that could not be read (see Record.AddUnreadable).
	Unreadable int
	// Changed are the calls the new table routes differently, in record order.
	Changed []Call
	// NotDispatched are the calls with no routing on record, in record order, with After set;
	// they are not counted as changed.
	NotDispatched []Call
}

type callKey struct{ request, call string }

type routing struct {
	outcome Outcome
	// dispatched is set when the outcome comes from the call's tool_call message; action and
	// params are then what the router sent.
	dispatched bool
	action     protocol.Action
	params     map[string]string
}

// Record collects requests and their calls' routing from a reading of the record. The zero
// value is ready to use.
type Record struct {
	requests   []*protocol.Request
	seen       map[string]bool
	routed     map[callKey]*routing
	duplicates int
	unreadable int
}

func (r *Record) init() {
	if r.seen == nil {
		r.seen, r.routed = make(map[string]bool), make(map[callKey]*routing)
	}
}

// AddRequest adds a recorded request. A request_id recorded before makes it a duplicate: it is
// counted as one and otherwise ignored.
func (r *Record) AddRequest(req *protocol.Request) {
	r.init()
	if r.seen[req.RequestID] {
		r.duplicates++
		return
	}
	r.seen[req.RequestID] = true
	r.requests = append(r.requests, req)
}

// AddDispatch adds the tool_call message of a call of requestID: the call was routed by
// d.Route. The first dispatch of a call counts (a re-driven call is dispatched again, alike).
func (r *Record) AddDispatch(requestID string, d *protocol.Dispatch) {
	r.init()
	k := callKey{requestID, d.Call.ToolCallID}
	if have := r.routed[k]; have != nil && have.dispatched {
		return
	}
	r.routed[k] = &routing{outcome: Outcome{Kind: Routed, Rule: d.Route}, dispatched: true, action: d.Action, params: d.Params}
}

// AddResult adds the tool_result message of a call of requestID. A NO_ROUTE result says the
// call had no route; any other result names its route, used when the call's dispatch is not
// on record. A dispatch always wins over what a result says.
func (r *Record) AddResult(requestID string, res *protocol.ToolResult) {
	r.init()
	k := callKey{requestID, res.ToolCallID}
	if r.routed[k] != nil {
		return
	}
	switch {
	case res.ErrorCode == protocol.CodeNoRoute:
		r.routed[k] = &routing{outcome: Outcome{Kind: NoRoute}}
	case res.Route != "":
		r.routed[k] = &routing{outcome: Outcome{Kind: Routed, Rule: res.Route}}
	}
}

// AddUnreadable counts a recorded request that could not be read; it cannot be compared.
func (r *Record) AddUnreadable() { r.unreadable++ }

// Add adds a decoded message of any type; types other than requests, tool calls and tool
// results are ignored.
func (r *Record) Add(m *protocol.Message, payload any) {
	switch p := payload.(type) {
	case *protocol.Request:
		r.AddRequest(p)
	case *protocol.Dispatch:
		r.AddDispatch(m.RequestID, p)
	case *protocol.ToolResult:
		r.AddResult(m.RequestID, p)
	}
}

// Compare matches every call of every recorded request against t, exactly as the router would
// (t.Match(call.Name, request.Intent)), and reports what would be routed differently. It runs
// nothing and publishes nothing.
func (r *Record) Compare(t *routes.Table) *Report {
	rep := &Report{Requests: len(r.requests), Duplicates: r.duplicates, Unreadable: r.unreadable}
	for _, req := range r.requests {
		for i := range req.ToolCalls {
			c := &req.ToolCalls[i]
			rep.Calls++
			call := Call{RequestID: req.RequestID, SessionID: req.Session(), ToolCallID: c.ToolCallID, Tool: c.Name}
			rule, params, ok := t.Match(c.Name, req.Intent)
			if ok {
				call.After = Outcome{Kind: Routed, Rule: rule.Name}
			} else {
				call.After = Outcome{Kind: NoRoute}
			}
			was := r.routed[callKey{req.RequestID, c.ToolCallID}]
			if was == nil {
				rep.NotDispatched = append(rep.NotDispatched, call)
				continue
			}
			call.Before = was.outcome
			if call.Before != call.After {
				rep.Changed = append(rep.Changed, call)
				continue
			}
			if ok && was.dispatched {
				call.Differences = actionDiff(was.action, rule.Action)
				if !sameParams(was.params, params) {
					call.Differences = append(call.Differences, "params")
				}
				if len(call.Differences) > 0 {
					rep.Changed = append(rep.Changed, call)
				}
			}
		}
	}
	return rep
}

// actionDiff names the fields in which two actions differ.
func actionDiff(a, b protocol.Action) []string {
	var d []string
	if a.Kind != b.Kind {
		d = append(d, "action.kind")
	}
	if a.TimeoutMS != b.TimeoutMS {
		d = append(d, "action.timeout_ms")
	}
	if a.Retry != b.Retry {
		d = append(d, "action.retry")
	}
	ah, bh := a.HTTP, b.HTTP
	if ah == nil {
		ah = &protocol.HTTPAction{}
	}
	if bh == nil {
		bh = &protocol.HTTPAction{}
	}
	if ah.URL != bh.URL {
		d = append(d, "action.http.url")
	}
	if ah.Method != bh.Method {
		d = append(d, "action.http.method")
	}
	if !maps.Equal(ah.Headers, bh.Headers) {
		d = append(d, "action.http.headers")
	}
	ag, bg := a.GRPC, b.GRPC
	if ag == nil {
		ag = &protocol.GRPCAction{}
	}
	if bg == nil {
		bg = &protocol.GRPCAction{}
	}
	if ag.Service != bg.Service {
		d = append(d, "action.grpc.service")
	}
	if ag.Method != bg.Method {
		d = append(d, "action.grpc.method")
	}
	if !maps.Equal(ag.Headers, bg.Headers) {
		d = append(d, "action.grpc.headers")
	}
	return d
}

// sameParams compares captured parameters; nil and empty are the same.
func sameParams(a, b map[string]string) bool { return maps.Equal(a, b) }
