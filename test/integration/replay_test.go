package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// hermes runs a hermes command as the binary would and returns its exit code and output.
func hermes(t *testing.T, cmd app.Command, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = app.Exec(cmd, args, app.Env{Stdout: &out, Stderr: &errOut})
	return code, out.String(), errOut.String()
}

// waitRecorded waits until the response to requestID is in the record.
func (s *system) waitRecorded(requestID string) {
	s.t.Helper()
	waitFor(s.t, "the response to "+requestID+" in the record", func() bool {
		for _, m := range s.record() {
			if m.Type == protocol.TypeResponse && m.RequestID == requestID {
				return true
			}
		}
		return false
	})
}

func withSession(req map[string]any, session string) map[string]any {
	req["session_id"] = session
	return req
}

var flowLine = regexp.MustCompile(`^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} \[(request|route|start|done|response|\?)\] +(.*)$`)

type flow struct{ tag, text string }

func parseFlow(t *testing.T, out string) []flow {
	t.Helper()
	var lines []flow
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		m := flowLine.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("not a flow line: %q", l)
		}
		lines = append(lines, flow{m[1], m[2]})
	}
	return lines
}

// index returns the position of the only line with tag whose text contains every part.
func index(t *testing.T, lines []flow, tag string, parts ...string) int {
	t.Helper()
	found := -1
	for i, l := range lines {
		ok := l.tag == tag
		for _, p := range parts {
			ok = ok && strings.Contains(l.text, p)
		}
		if ok {
			if found >= 0 {
				t.Fatalf("two [%s] lines with %q: %q and %q", tag, parts, lines[found].text, l.text)
			}
			found = i
		}
	}
	if found < 0 {
		t.Fatalf("no [%s] line with %q in:\n%v", tag, parts, lines)
	}
	return found
}

func inOrder(t *testing.T, what string, idx ...int) {
	t.Helper()
	for i := 1; i < len(idx); i++ {
		if idx[i-1] >= idx[i] {
			t.Fatalf("%s: lines out of order: %v", what, idx)
		}
	}
}

func TestReplaySession(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1})
	resp := s.route(withSession(request("replay_1", "查询订单状态",
		call("ok", "echo", map[string]any{"n": 1}),
		call("down", "echo", map[string]any{"status": 503}),
		call("lost", "no_such_tool", map[string]any{})), "sess_replay"))
	if resp.Status != protocol.StatusPartialSuccess {
		t.Fatalf("response %+v", resp)
	}
	s.waitRecorded("replay_1")

	code, out, errOut := hermes(t, app.RunReplay, "--nats", s.srv.URL, "--session", "sess_replay")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	lines := parseFlow(t, out)
	// request, NO_ROUTE, 2 dispatches, 1 + 3 tries, 2 results, response.
	if len(lines) != 11 {
		t.Fatalf("%d lines:\n%s", len(lines), out)
	}
	req := index(t, lines, "request", `replay_1 (session sess_replay) 3 calls: echo ok, echo down, no_such_tool lost  intent="查询订单状态"`)
	if req != 0 {
		t.Fatalf("request at %d:\n%s", req, out)
	}
	resp1 := index(t, lines, "response", "replay_1 partial_success (3 results, 1 ok)", " ms")
	inOrder(t, "the call that succeeds", req,
		index(t, lines, "route", "replay_1 router-1 -> echo ok rule=echo", `args={"n":1}`),
		index(t, lines, "start", "replay_1 echo ok on worker-1 (try 1)"),
		index(t, lines, "done", "replay_1 echo ok ", " ms ok content=", `"n":1`))
	inOrder(t, "the call that fails after retries", req,
		index(t, lines, "route", "replay_1 router-1 -> echo down rule=echo", `args={"status":503}`),
		index(t, lines, "start", "echo down on worker-1 (try 1)"),
		index(t, lines, "start", "echo down on worker-1 (try 2)"),
		index(t, lines, "start", "echo down on worker-1 (try 3)"),
		index(t, lines, "done", "echo down", "error TOOL_HTTP_5XX (tool) after 3 tries"))
	inOrder(t, "the call with no route", req,
		index(t, lines, "done", `no_such_tool lost error NO_ROUTE (hermes): "no route matches tool \"no_such_tool\"`))
	responseFollows(t, lines, resp1)

	// JSON lines: the same messages, in stream order, with their payloads.
	code, out, errOut = hermes(t, app.RunReplay, "--nats", s.srv.URL, "--session", "sess_replay", "--json")
	if code != 0 {
		t.Fatalf("--json: exit %d: %s", code, errOut)
	}
	var seqs []uint64
	for i, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var e struct {
			Seq       uint64          `json:"seq"`
			Subject   string          `json:"subject"`
			Type      protocol.Type   `json:"type"`
			RequestID string          `json:"request_id"`
			SessionID string          `json:"session_id"`
			Payload   json.RawMessage `json:"payload"`
			Error     string          `json:"error"`
		}
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("line %d: %v: %s", i, err, l)
		}
		if e.RequestID != "replay_1" || e.SessionID != "sess_replay" || e.Error != "" || len(e.Payload) == 0 ||
			!strings.HasSuffix(e.Subject, ".sess_replay") || (len(seqs) > 0 && e.Seq <= seqs[len(seqs)-1]) {
			t.Fatalf("line %d: %s", i, l)
		}
		if i == 0 && (e.Type != protocol.TypeRequest || !strings.Contains(string(e.Payload), `"intent":"查询订单状态"`)) {
			t.Fatalf("first line: %s", l)
		}
		seqs = append(seqs, e.Seq)
	}
	if len(seqs) != len(lines) {
		t.Fatalf("%d JSON lines, %d text lines", len(seqs), len(lines))
	}

	// From a sequence: the history from there on.
	code, out, _ = hermes(t, app.RunReplay, "--nats", s.srv.URL, "--session", "sess_replay", "--from-seq", jsonNumber(seqs[2]))
	if got := parseFlow(t, out); code != 0 || len(got) != len(lines)-2 || got[0] != lines[2] {
		t.Fatalf("--from-seq %d: exit %d, %d lines:\n%s", seqs[2], code, len(got), out)
	}
	code, out, _ = hermes(t, app.RunReplay, "--nats", s.srv.URL, "--session", "sess_replay", "--since", "1h")
	if code != 0 || len(parseFlow(t, out)) != len(lines) {
		t.Fatalf("--since 1h: exit %d:\n%s", code, out)
	}

	// An unknown session: nothing on stdout, a note on stderr, exit 0 — at once, no waiting.
	code, out, errOut = hermes(t, app.RunReplay, "--nats", s.srv.URL, "--session", "nobody")
	if code != 0 || out != "" || !strings.Contains(errOut, "no messages for session nobody") {
		t.Fatalf("unknown session: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// Usage errors: exit 2, naming the problem.
	for _, args := range [][]string{
		{"--session", "a.b"},
		{"--session", ">"},
		{},
		{"--session", "s", "--since", "1h", "--from-seq", "3"},
		{"--session", "s", "--since", "yesterday"},
		{"--session", "s", "extra"},
	} {
		code, _, errOut = hermes(t, app.RunReplay, append([]string{"--nats", s.srv.URL}, args...)...)
		if code != 2 || !strings.Contains(errOut, "hermes: replay: ") {
			t.Errorf("replay %q: exit %d, stderr %q", args, code, errOut)
		}
	}
	if _, _, errOut = hermes(t, app.RunReplay, "--nats", s.srv.URL, "--session", "a.b"); !strings.Contains(errOut, "--session must hold only letters") {
		t.Errorf("invalid session: %q", errOut)
	}
}

// responseFollows checks what the record guarantees about a response: it comes after every
// dispatch and every start of its request, and after the result that completed it. (It may come
// just before another call's result message: results are recorded in KV before they are
// published, and the router aggregates from KV.)
func responseFollows(t *testing.T, lines []flow, resp int) {
	t.Helper()
	done := false
	for i, l := range lines {
		if (l.tag == "route" || l.tag == "start") && i > resp {
			t.Fatalf("[%s] line %d after the response (%d)", l.tag, i, resp)
		}
		done = done || (l.tag == "done" && i < resp)
	}
	if !done {
		t.Fatalf("the response (%d) follows no result", resp)
	}
}

func jsonNumber(n uint64) string { b, _ := json.Marshal(n); return string(b) }

// tail runs hermes tail until the test stops it, and waits until it follows.
func tail(t *testing.T, args ...string) (out *syncBuffer, stop func()) {
	t.Helper()
	out, errOut := &syncBuffer{}, &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.RunTail(ctx, args, app.Env{Stdout: out, Stderr: errOut}) }()
	waitFor(t, "hermes tail to follow", func() bool { return strings.Contains(errOut.String(), "following ") })
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("tail ended with %v; stderr %s", err, errOut)
		}
	}
	t.Cleanup(stop)
	return out, stop
}

func TestTailFollowsLiveFlow(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1})
	s.route(withSession(request("tail_before", "", call("c", "echo", map[string]any{})), "sess_tail"))
	s.waitRecorded("tail_before")

	one, stopOne := tail(t, "--nats", s.srv.URL, "--session", "sess_tail")
	all, stopAll := tail(t, "--nats", s.srv.URL, "--json")
	s.route(withSession(request("tail_other", "", call("c", "echo", map[string]any{})), "sess_other"))
	s.route(withSession(request("tail_1", "", call("a", "echo", map[string]any{"x": 1}), call("b", "echo", map[string]any{"status": 404})), "sess_tail"))
	// tail_1 makes 8 messages: request, 2 dispatches, 2 starts, 2 results (404 is not retried),
	// response.
	tail1 := regexp.MustCompile(`(?m)^\S+ \[\w+\] +tail_1 `)
	waitFor(t, "tail to print tail_1's 8 messages", func() bool { return len(tail1.FindAllString(one.String(), -1)) == 8 })
	waitFor(t, "tail --json to print tail_1's 8 messages", func() bool { return jsonRequests(t, all.String())["tail_1"] == 8 })
	stopOne()
	stopAll()

	var lines []flow
	for _, l := range strings.Split(strings.TrimSuffix(one.String(), "\n"), "\n") {
		m := regexp.MustCompile(`^\d\d:\d\d:\d\d\.\d{3} \[(\w+)\] +(.*)$`).FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("not a tail line: %q", l)
		}
		lines = append(lines, flow{m[1], m[2]})
	}
	req := index(t, lines, "request", "tail_1 (session sess_tail) 2 calls: echo a, echo b")
	if req != 0 {
		t.Fatalf("request at %d:\n%s", req, one)
	}
	inOrder(t, "call a", req,
		index(t, lines, "route", "tail_1 router-1 -> echo a rule=echo"),
		index(t, lines, "start", "tail_1 echo a on worker-1 (try 1)"),
		index(t, lines, "done", "tail_1 echo a ", " ms ok"))
	inOrder(t, "call b", req,
		index(t, lines, "route", "tail_1 router-1 -> echo b rule=echo"),
		index(t, lines, "start", "tail_1 echo b on worker-1 (try 1)"),
		index(t, lines, "done", "tail_1 echo b ", "error TOOL_HTTP_4XX (tool) after 1 try"))
	responseFollows(t, lines, index(t, lines, "response", "tail_1 partial_success (2 results, 1 ok)"))
	if out := one.String(); strings.Contains(out, "tail_before") || strings.Contains(out, "tail_other") {
		t.Fatalf("tail --session printed what it should not:\n%s", out)
	}
	// Following every session sees the other session too, and nothing from before it started.
	if n := jsonRequests(t, all.String()); n["tail_other"] == 0 || n["tail_before"] != 0 {
		t.Fatalf("tail of every session saw messages of requests %v", n)
	}
}

// jsonRequests counts the messages of each request in JSON lines.
func jsonRequests(t *testing.T, out string) map[string]int {
	t.Helper()
	n := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" {
			continue
		}
		var e struct {
			RequestID string `json:"request_id"`
		}
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("%v: %s", err, l)
		}
		n[e.RequestID]++
	}
	return n
}

func TestReplayRoutesWhatIf(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1})
	s.route(request("whatif_a", "urgent: please check", call("ok", "echo", map[string]any{"n": 1}), call("lost", "no_such_tool", map[string]any{})))
	s.route(request("whatif_b", "routine", call("plain", "echo", map[string]any{"n": 2}), call("order", "order_query", map[string]any{"order_id": "ORD-1"})))
	s.waitRecorded("whatif_a")
	s.waitRecorded("whatif_b")
	// The same request recorded twice (published again without a message id, as a client
	// retrying past the duplicate window would): it counts once.
	for _, raw := range s.stored() {
		if raw.Subject == s.storedRequest("whatif_a") {
			s.publishRaw(protocol.SubjectRequest("whatif_a"), raw.Data)
			break
		}
	}
	waitFor(t, "the router to be done with the repeated request", func() bool {
		c, err := s.js.Consumer(context.Background(), protocol.StreamName, bus.RequestConsumer(s.partitionOf("whatif_a")))
		if err != nil {
			return false
		}
		info, err := c.Info(context.Background())
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})

	current, err := os.ReadFile("testdata/routes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	changed := strings.Replace(string(current), "rules:\n", `rules:
  - name: echo_urgent
    match:
      tool_name: echo
      intent_contains: ["urgent"]
    action:
      http:
        url: http://127.0.0.1:8081/v1/echo
  - name: no_such_tool_v1
    match:
      tool_name: no_such_tool
    action:
      http:
        url: http://127.0.0.1:8081/v1/echo
`, 1)
	changed = strings.Replace(changed, "http://127.0.0.1:8081/v1/orders/{order_id}", "http://127.0.0.1:8081/v2/orders/{order_id}", 1)
	newRoutes := filepath.Join(dir, "new.yaml")
	if err := os.WriteFile(newRoutes, []byte(changed), 0o600); err != nil {
		t.Fatal(err)
	}
	stream, err := s.js.Stream(context.Background(), protocol.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	before, err := stream.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}

	code, out, errOut := hermes(t, app.RunReplay, "--nats", s.srv.URL, "--routes", newRoutes)
	want := []string{
		"whatif_a ok echo: echo -> echo_urgent",
		"whatif_a lost no_such_tool: no route -> no_such_tool_v1",
		"whatif_b order order_query: order_by_id -> order_by_id (same rule, changed: action.http.url)",
	}
	got := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if code != 1 || len(got) != len(want)+1 || strings.Join(got[:len(want)], "\n") != strings.Join(want, "\n") {
		t.Fatalf("exit %d (want 1), stderr %q, output:\n%s\nwant:\n%s", code, errOut, out, strings.Join(want, "\n"))
	}
	summary := got[len(want)]
	if !strings.HasPrefix(summary, "3 of 4 calls in 2 requests would route differently with "+newRoutes) ||
		!strings.Contains(summary, "1 repeated record of a request_id seen before, counted once") {
		t.Fatalf("summary %q", summary)
	}

	// The routes in force: nothing changes, exit 0.
	code, out, errOut = hermes(t, app.RunReplay, "--nats", s.srv.URL, "--routes", "testdata/routes.yaml")
	if code != 0 || !strings.HasPrefix(out, "0 of 4 calls in 2 requests would route differently") || strings.Count(out, "\n") != 1 {
		t.Fatalf("same routes: exit %d, stderr %q, output:\n%s", code, errOut, out)
	}

	// One session only, and JSON lines.
	code, out, _ = hermes(t, app.RunReplay, "--nats", s.srv.URL, "--routes", newRoutes, "--session", "whatif_b", "--json")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 1 || len(lines) != 2 ||
		lines[0] != `{"kind":"changed","request_id":"whatif_b","session_id":"whatif_b","tool_call_id":"order","tool":"order_query","before":{"state":"routed","rule":"order_by_id"},"after":{"state":"routed","rule":"order_by_id"},"differences":["action.http.url"]}` ||
		!strings.Contains(lines[1], `"kind":"summary"`) || !strings.Contains(lines[1], `"requests":1,"calls":2,"changed":1`) {
		t.Fatalf("--session --json: exit %d:\n%s", code, out)
	}

	// A bad routes file: the loader's error with file and line, exit 2.
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("version: 1.0\nrules:\n  - name: x\n    match: {}\n    action: {http: {url: \"http://a/\"}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = hermes(t, app.RunReplay, "--nats", s.srv.URL, "--routes", bad)
	if code != 2 || out != "" || !strings.Contains(errOut, bad+":4: rules[0].match.tool_name") {
		t.Fatalf("bad routes: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	// Nothing ran and nothing was published: the record is as it was, and no consumer was made
	// for the tool the new routes would route.
	after, err := stream.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if after.State.LastSeq != before.State.LastSeq {
		t.Fatalf("the record grew from %d to %d during what-if replays", before.State.LastSeq, after.State.LastSeq)
	}
	if _, err := stream.Consumer(context.Background(), bus.ToolConsumer(protocol.ActionHTTP, "no_such_tool")); err != jetstream.ErrConsumerNotFound {
		t.Fatalf("consumer of no_such_tool: %v", err)
	}
}
