package whatif

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/internal/routes"
	"github.com/hermesbus/hermes/pkg/protocol"
)

const oldRoutes = `version: 1.0
rules:
  - name: policy_status
    match:
      tool_name: get_policy_status
      intent_regex: "查询(?P<name>[\\u4e00-\\u9fa5]{2,4})的"
    action:
      http: {url: "http://policy:8000/status", method: GET}
  - name: weather
    match:
      tool_name: weather_search
    action:
      http: {url: "http://weather:8000/v1", method: GET, timeout_ms: 3000}
  - name: echo
    match:
      tool_name: echo
    action:
      http: {url: "http://tools:8081/v1/echo"}
`

func table(t *testing.T, yaml string) *routes.Table {
	t.Helper()
	tb, err := routes.Parse("routes.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

func request(id, intent string, tools ...string) *protocol.Request {
	r := &protocol.Request{RequestID: id, Intent: intent}
	for i, tool := range tools {
		r.ToolCalls = append(r.ToolCalls, protocol.ToolCall{ToolCallID: "call_" + string(rune('0'+i)), Name: tool, Arguments: json.RawMessage(`{}`)})
	}
	return r
}

// route records req as a router with table t would have handled it: a dispatch for every call
// with a rule, a NO_ROUTE result for every other.
func route(rec *Record, t *routes.Table, req *protocol.Request) {
	rec.AddRequest(req)
	for _, c := range req.ToolCalls {
		rule, params, ok := t.Match(c.Name, req.Intent)
		if !ok {
			rec.AddResult(req.RequestID, &protocol.ToolResult{ToolCallID: c.ToolCallID, Name: c.Name, Status: protocol.ResultError, ErrorCode: protocol.CodeNoRoute})
			continue
		}
		rec.AddDispatch(req.RequestID, &protocol.Dispatch{Call: c, Route: rule.Name, Params: params, Action: rule.Action})
	}
}

// lines renders changed calls as hermes replay --routes prints them.
func lines(calls []Call) []string {
	var out []string
	for _, c := range calls {
		s := c.RequestID + " " + c.ToolCallID + " " + c.Tool + ": " + c.Before.String() + " -> " + c.After.String()
		if len(c.Differences) > 0 {
			s += " (" + strings.Join(c.Differences, ", ") + ")"
		}
		out = append(out, s)
	}
	return out
}

func recorded(t *testing.T) *Record {
	old := table(t, oldRoutes)
	var rec Record
	route(&rec, old, request("r1", "查询王五的保单状态", "get_policy_status", "weather_search"))
	route(&rec, old, request("r2", "北京天气", "weather_search", "fax_send"))
	route(&rec, old, request("r3", "", "echo"))
	return &rec
}

func TestCompareSameRoutesChangesNothing(t *testing.T) {
	rep := recorded(t).Compare(table(t, oldRoutes))
	if rep.Requests != 3 || rep.Calls != 5 || len(rep.Changed) != 0 || len(rep.NotDispatched) != 0 {
		t.Fatalf("report %+v: %v", rep, lines(rep.Changed))
	}
}

func TestCompare(t *testing.T) {
	cases := []struct {
		name, routes string
		want         []string
	}{
		{"a rule renamed", strings.Replace(oldRoutes, "name: weather\n", "name: weather_v2\n", 1), []string{
			"r1 call_1 weather_search: weather -> weather_v2",
			"r2 call_0 weather_search: weather -> weather_v2",
		}},
		{"a rule ahead takes some calls", strings.Replace(oldRoutes, "rules:\n", `rules:
  - name: weather_beijing
    match: {tool_name: weather_search, intent_contains: ["北京"]}
    action: {http: {url: "http://weather:8000/v1", method: GET, timeout_ms: 3000}}
`, 1), []string{
			"r2 call_0 weather_search: weather -> weather_beijing",
		}},
		{"a tool without a route gets one", oldRoutes + `  - name: fax
    match: {tool_name: fax_send}
    action: {http: {url: "http://fax:8000/"}}
`, []string{
			"r2 call_1 fax_send: no route -> fax",
		}},
		{"a rule removed", strings.Replace(oldRoutes, "      tool_name: echo\n", "      tool_name: echo_v2\n", 1), []string{
			"r3 call_0 echo: echo -> no route",
		}},
		{"the same rule sends elsewhere", strings.Replace(strings.Replace(oldRoutes, "http://weather:8000/v1", "http://weather-v2:8000/v1", 1),
			"timeout_ms: 3000", "timeout_ms: 2000", 1), []string{
			"r1 call_1 weather_search: weather -> weather (action.timeout_ms, action.http.url)",
			"r2 call_0 weather_search: weather -> weather (action.timeout_ms, action.http.url)",
		}},
		{"the same rule captures other parameters", strings.Replace(oldRoutes, "(?P<name>", "(?P<customer>", 1), []string{
			"r1 call_0 get_policy_status: policy_status -> policy_status (params)",
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rep := recorded(t).Compare(table(t, c.routes))
			if got := lines(rep.Changed); !slices.Equal(got, c.want) {
				t.Fatalf("changed:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(c.want, "\n"))
			}
			if rep.Calls != 5 || rep.Requests != 3 {
				t.Fatalf("counted %d calls in %d requests", rep.Calls, rep.Requests)
			}
		})
	}
}

func TestCompareDuplicatesCountOnce(t *testing.T) {
	rec := recorded(t)
	// The same request recorded again (a redelivery, a client retry), and a request_id reused
	// for other content, which the router ignored: neither counts again.
	route(rec, table(t, oldRoutes), request("r3", "", "echo"))
	rec.AddRequest(request("r1", "other", "echo"))
	rep := rec.Compare(table(t, strings.Replace(oldRoutes, "name: echo\n", "name: echo_v2\n", 1)))
	if rep.Requests != 3 || rep.Calls != 5 || rep.Duplicates != 2 {
		t.Fatalf("report %+v", rep)
	}
	if got := lines(rep.Changed); !slices.Equal(got, []string{"r3 call_0 echo: echo -> echo_v2"}) {
		t.Fatalf("changed %v", got)
	}
}

func TestCompareNotDispatched(t *testing.T) {
	var rec Record
	rec.AddRequest(request("r9", "", "echo", "fax_send"))
	rep := rec.Compare(table(t, oldRoutes))
	if len(rep.Changed) != 0 || rep.Calls != 2 {
		t.Fatalf("report %+v", rep)
	}
	if got := lines(rep.NotDispatched); !slices.Equal(got, []string{
		"r9 call_0 echo: not dispatched -> echo",
		"r9 call_1 fax_send: not dispatched -> no route",
	}) {
		t.Fatalf("not dispatched %v", got)
	}
}

func TestCompareRoutingFromResultsAndOrder(t *testing.T) {
	var rec Record
	req := request("r1", "", "echo", "weather_search")
	// Records may arrive before their request (reading from a sequence inside the request).
	rec.AddResult("r1", &protocol.ToolResult{ToolCallID: "call_0", Status: protocol.ResultOK, Route: "echo"})
	rec.AddResult("r1", &protocol.ToolResult{ToolCallID: "call_1", Status: protocol.ResultOK, Route: "weather"})
	rec.AddRequest(req)
	// A dispatch wins over what a result says; the first dispatch wins over a re-drive.
	rec.AddDispatch("r1", &protocol.Dispatch{Call: req.ToolCalls[1], Route: "old_weather"})
	rec.AddDispatch("r1", &protocol.Dispatch{Call: req.ToolCalls[1], Route: "weather"})
	rep := rec.Compare(table(t, oldRoutes))
	// call_0's routing is known from its result only: compared by rule name.
	if got := lines(rep.Changed); !slices.Equal(got, []string{"r1 call_1 weather_search: old_weather -> weather"}) {
		t.Fatalf("changed %v", got)
	}
}

func TestAddIgnoresOtherTypes(t *testing.T) {
	var rec Record
	m := &protocol.Message{RequestID: "r1"}
	rec.Add(m, request("r1", "", "echo"))
	rec.Add(m, &protocol.ToolStarted{ToolCallID: "call_0"})
	rec.Add(m, &protocol.Response{RequestID: "r1"})
	rec.Add(m, &protocol.Dispatch{Call: protocol.ToolCall{ToolCallID: "call_0", Name: "echo"}, Route: "echo"})
	rec.AddUnreadable()
	rep := rec.Compare(table(t, oldRoutes))
	if rep.Requests != 1 || rep.Calls != 1 || rep.Unreadable != 1 || len(rep.NotDispatched) != 0 {
		t.Fatalf("report %+v", rep)
	}
	// The dispatch carried no action: the same rule with the table's action is a change of action.
	if got := lines(rep.Changed); len(got) != 1 || !strings.Contains(got[0], "echo -> echo (action.kind") {
		t.Fatalf("changed %v", got)
	}
}
