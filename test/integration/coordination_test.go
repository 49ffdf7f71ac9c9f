package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// changer is a tool that changes accounts (POST /change {"key", "hold_ms"}) and keeps the
// evidence of interleaving a careful tool would: changes of one key in flight at once, and
// the fencing tokens it was given, in the order the changes came.
type changer struct {
	mu       sync.Mutex
	inFlight map[string]int
	overlaps int
	fences   map[string][]uint64
	txs      map[string]bool
	bare     int // calls that came without a grant
	addr     string
}

func newChanger(t *testing.T) *changer {
	c := &changer{inFlight: map[string]int{}, fences: map[string][]uint64{}, txs: map[string]bool{}}
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	c.addr = strings.TrimPrefix(srv.URL, "http://")
	return c
}

func (c *changer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var args struct {
		Key    string `json:"key"`
		HoldMS int    `json:"hold_ms"`
	}
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<16))
	_ = json.Unmarshal(body, &args)
	fence, err := strconv.ParseUint(r.Header.Get(protocol.HeaderFence), 10, 64)
	c.mu.Lock()
	if err != nil || !strings.HasPrefix(r.Header.Get(protocol.HeaderTx), protocol.TxPrefix) || r.Header.Get(protocol.HeaderResource) != "acct:"+args.Key {
		c.bare++
	}
	c.inFlight[args.Key]++
	if c.inFlight[args.Key] > 1 {
		c.overlaps++
	}
	c.fences[args.Key] = append(c.fences[args.Key], fence)
	c.txs[r.Header.Get(protocol.HeaderTx)] = true
	c.mu.Unlock()
	time.Sleep(time.Duration(args.HoldMS) * time.Millisecond)
	c.mu.Lock()
	c.inFlight[args.Key]--
	c.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = fmt.Fprintf(w, `{"key":%q,"fence":%d}`, args.Key, fence)
}

// changeContract makes the change tool's calls serialized per account.
const changeContract = `name: change
description: changes an account's balance
effects: side_effects
resource_key: "acct:{key}"
changes: [balance]
input_schema:
  key: {type: string, required: true}
  hold_ms: {type: integer}
`

// startWithChanger runs Hermes with the change tool routed to a changer.
func startWithChanger(t *testing.T, routers, workers int) (*system, *changer, map[string]string) {
	t.Helper()
	ch := newChanger(t)
	base, err := os.ReadFile("testdata/routes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	routesFile := filepath.Join(t.TempDir(), "routes.yaml")
	extra := fmt.Sprintf(`
  - name: change
    match:
      tool_name: change
    action:
      http:
        url: http://%s/change
        method: POST
        timeout_ms: 10000
`, ch.addr)
	if err := os.WriteFile(routesFile, append(base, extra...), 0o600); err != nil {
		t.Fatal(err)
	}
	s := start(t, options{routesFile: routesFile, routers: routers, workers: workers, callers: true})
	keys := callerKeys(t, s, map[string]auth.Role{"admin": auth.RoleAdmin, "alice": auth.RoleUser})
	if code, _, body := s.registerContract(keys["admin"], changeContract); code != http.StatusCreated {
		t.Fatalf("register change: %d %s", code, body)
	}
	// A router sees the contract when its watch delivers it; the test's calls must go under it.
	waitFor(t, "every router follows change's contract", func() bool {
		for _, r := range s.routers {
			if c, err := r.Contract("change"); err != nil || c == nil {
				return false
			}
		}
		return true
	})
	return s, ch, keys
}

// coordinationEvents reads the coordination events on the record.
func (s *system) coordinationEvents() []*protocol.CoordinationEvent {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
	defer cancel()
	c, err := s.js.OrderedConsumer(ctx, protocol.StreamName, jetstream.OrderedConsumerConfig{FilterSubjects: []string{protocol.FilterEvents(protocol.EventCoordination)}})
	if err != nil {
		s.t.Fatal(err)
	}
	var out []*protocol.CoordinationEvent
	for {
		batch, err := c.Fetch(256, jetstream.FetchMaxWait(200*time.Millisecond))
		if err != nil {
			s.t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			msg, err := protocol.Unmarshal(m.Data())
			if err != nil {
				s.t.Fatal(err)
			}
			e, err := msg.DecodeCoordination()
			if err != nil {
				s.t.Fatal(err)
			}
			out = append(out, e)
		}
		if n == 0 {
			info, err := c.Info(ctx)
			if err != nil {
				s.t.Fatal(err)
			}
			if info.NumPending == 0 {
				return out
			}
		}
	}
}

// N calls on K keys, from concurrent callers through two routers and two workers: no two
// changes of one key ever overlap at the tool, each runs under a grant whose fencing token
// rises with every turn of its key, and every grant and release is on the record.
func TestChangesOfOneResourceNeverInterleave(t *testing.T) {
	t.Parallel()
	s, ch, keys := startWithChanger(t, 2, 2)
	const n, k, callers = 24, 3, 8
	var wg sync.WaitGroup
	results := make(chan protocol.ToolResult, n)
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += callers {
				body := fmt.Sprintf(`{"session_id":"s_chg_%d","request_id":"r_chg_%d","intent":"change","tool_calls":[{"tool_call_id":"c1","name":"change","arguments":{"key":"k%d","hold_ms":20}}]}`, i, i, i%k)
				code, out := s.call("POST", "/v1/route", keys["alice"], body)
				if code != http.StatusOK {
					t.Errorf("request %d: %d %s", i, code, out)
					return
				}
				results <- result(t, decodeResponse(t, []byte(out)), "c1")
			}
		}()
	}
	wg.Wait()
	close(results)
	got := 0
	for r := range results {
		got++
		if r.Status != protocol.ResultOK || r.Grant == nil || !protocol.ValidTx(r.Grant.Tx) || r.Grant.Fence == 0 {
			t.Fatalf("result %+v (grant %+v)", r, r.Grant)
		}
	}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if got != n || ch.overlaps != 0 || ch.bare != 0 || len(ch.txs) != n {
		t.Fatalf("%d results; overlaps %d; calls without a grant %d; transactions %d", got, ch.overlaps, ch.bare, len(ch.txs))
	}
	for key, fs := range ch.fences {
		for i := 1; i < len(fs); i++ {
			if fs[i] <= fs[i-1] {
				t.Fatalf("%s: fences %v do not rise", key, fs)
			}
		}
	}
	counts := map[string]int{}
	waitFor(t, "every grant and release on the record", func() bool {
		counts = map[string]int{}
		for _, e := range s.coordinationEvents() {
			counts[e.Op]++
		}
		return counts[protocol.CoordGranted] == n && counts[protocol.CoordReleased] == n
	})
	t.Logf("%d calls on %d keys through 2 routers and 2 workers: overlaps 0, fences per key %v; events %v", n, k, ch.fences, counts)
}

// A call that does not name its resource never runs; a contract whose resource_key or
// precedence cannot hold is refused at registration, with the reason.
func TestAChangeThatNamesNoResourceNeverRuns(t *testing.T) {
	t.Parallel()
	s, ch, keys := startWithChanger(t, 1, 1)
	for i, args := range []string{`{"key":""}`, `{"key":"  "}`, `{"key":{"a":1}}`} {
		body := fmt.Sprintf(`{"session_id":"s_nokey","request_id":"r_nokey_%d","intent":"change","tool_calls":[{"tool_call_id":"c1","name":"change","arguments":%s}]}`, i, args)
		code, out := s.call("POST", "/v1/route", keys["alice"], body)
		if code != http.StatusOK {
			t.Fatalf("%s: %d %s", args, code, out)
		}
		r := result(t, decodeResponse(t, []byte(out)), "c1")
		if r.ErrorCode != protocol.CodeResourceKeyMissing && r.ErrorCode != protocol.CodeContractViolation && r.ErrorCode != protocol.CodeBadArguments {
			t.Fatalf("%s: %+v", args, r)
		}
	}
	// The schema allows an empty key; the resource still must be named.
	body := `{"session_id":"s_nokey","request_id":"r_nokey_empty","intent":"change","tool_calls":[{"tool_call_id":"c1","name":"change","arguments":{"key":""}}]}`
	_, out := s.call("POST", "/v1/route", keys["alice"], body)
	if r := result(t, decodeResponse(t, []byte(out)), "c1"); r.ErrorCode != protocol.CodeResourceKeyMissing || !strings.Contains(string(r.Content), "empty") {
		t.Fatalf("empty key: %+v %s", r, r.Content)
	}
	ch.mu.Lock()
	if len(ch.fences) != 0 {
		t.Fatalf("the tool was called: %v", ch.fences)
	}
	ch.mu.Unlock()
	for _, bad := range []struct{ doc, want string }{
		{strings.Replace(changeContract, `"acct:{key}"`, "account_id", 1), `resource_key: names the argument \"account_id\", which the input_schema does not declare`},
		{strings.Replace(changeContract, `"acct:{key}"`, `"acct:{owner}"`, 1), `names the argument \"owner\"`},
		{strings.Replace(changeContract, `"acct:{key}"`, `"acct:{key"`, 1), `a '{' with no '}' after it`},
		{strings.Replace(changeContract, "effects: side_effects", "effects: none", 1), "changes nothing (effects: none)"},
		{changeContract + "precedence: {before: [change]}\n", "names the tool itself"},
		{changeContract + "on_conflict: merge\n", "must be refuse or order"},
	} {
		if code, _, body := s.registerContract(keys["admin"], bad.doc); code != http.StatusBadRequest || !strings.Contains(body, bad.want) {
			t.Fatalf("%q: %d %s", bad.want, code, body)
		}
	}
	// A cycle across contracts: change before audit_write, audit_write before change.
	audit := strings.NewReplacer("name: change", "name: audit_write", "[balance]", "[log]").Replace(changeContract)
	if code, _, body := s.registerContract(keys["admin"], changeContract+"precedence: {before: [audit_write]}\n"); code != http.StatusCreated {
		t.Fatalf("register: %d %s", code, body)
	}
	if code, _, body := s.registerContract(keys["admin"], audit+"precedence: {before: [change]}\n"); code != http.StatusBadRequest || !strings.Contains(body, "precedence cycle") {
		t.Fatalf("a cycle: %d %s", code, body)
	}
}

// While a change holds a resource, the next waits: GET /debug/coordination and hermes
// coordination ls show who holds it and who waits, and the wait is an event on the record
// naming the resource and the holder.
func TestWhoHoldsAndWhoWaitsIsInspectable(t *testing.T) {
	long(t, "holds a resource for seconds")
	t.Parallel()
	s, _, keys := startWithChanger(t, 1, 1)
	keys2 := callerKeys(t, s, map[string]auth.Role{"ops": auth.RoleAdmin})
	send := func(rid string, hold int) <-chan protocol.ToolResult {
		out := make(chan protocol.ToolResult, 1)
		go func() {
			body := fmt.Sprintf(`{"session_id":"s_%s","request_id":"%s","intent":"change","tool_calls":[{"tool_call_id":"c1","name":"change","arguments":{"key":"shared","hold_ms":%d}}]}`, rid, rid, hold)
			code, resp := s.call("POST", "/v1/route", keys["alice"], body)
			if code != http.StatusOK {
				t.Errorf("%s: %d %s", rid, code, resp)
				close(out)
				return
			}
			out <- result(t, decodeResponse(t, []byte(resp)), "c1")
		}()
		return out
	}
	first := send("r_hold", 3000)
	waitFor(t, "the first change holds the resource", func() bool {
		code, body := s.call("GET", "/debug/coordination", keys2["ops"], "")
		return code == http.StatusOK && strings.Contains(body, `"request_id":"r_hold"`)
	})
	second := send("r_wait", 0)
	var view struct {
		Resources []struct {
			Resource string `json:"resource"`
			Holder   *struct {
				RequestID string `json:"request_id"`
				Tx        string `json:"tx"`
				Fence     uint64 `json:"fence"`
			} `json:"holder"`
			Waiting []struct {
				RequestID string `json:"request_id"`
			} `json:"waiting"`
		} `json:"resources"`
		Held, Waiting int
	}
	waitFor(t, "the second change waits", func() bool {
		_, body := s.call("GET", "/debug/coordination?resource=acct:shared", keys2["ops"], "")
		_ = json.Unmarshal([]byte(body), &view)
		return view.Waiting == 1
	})
	r := view.Resources[0]
	if r.Resource != "acct:shared" || r.Holder == nil || r.Holder.RequestID != "r_hold" || !protocol.ValidTx(r.Holder.Tx) || r.Waiting[0].RequestID != "r_wait" {
		t.Fatalf("view %+v", view)
	}
	if code, _ := s.call("GET", "/debug/coordination", keys["alice"], ""); code != http.StatusForbidden {
		t.Fatalf("a user reads every caller's turns: %d", code)
	}
	keyFile := filepath.Join(t.TempDir(), "ops.key")
	if err := os.WriteFile(keyFile, []byte(keys2["ops"]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := hermes(t, app.RunCoordination, "ls", "--url", s.base, "--key-file", keyFile)
	if code != 0 || !strings.Contains(out, "acct:shared") || !strings.Contains(out, "holds") || !strings.Contains(out, "waits #1") || !strings.Contains(out, "r_wait/c1") {
		t.Fatalf("hermes coordination ls: %d\n%s%s", code, out, errOut)
	}
	t.Logf("hermes coordination ls:\n%s", out)
	var waited *protocol.CoordinationEvent
	for _, e := range s.coordinationEvents() {
		if e.Op == protocol.CoordWaiting && e.Resource == "acct:shared" {
			waited = e
		}
	}
	// The holder is another session's call: its ids are not written into this session's record.
	if waited == nil || waited.HeldBy != "a call of another session" || waited.Position != 1 {
		t.Fatalf("the wait on the record: %+v", waited)
	}
	a, b := <-first, <-second
	if a.Status != protocol.ResultOK || b.Status != protocol.ResultOK || b.Grant.Fence <= a.Grant.Fence {
		t.Fatalf("results %+v %+v", a, b)
	}
}

// The seed's example (seed 003 §2.3): two changes of one order in one request are refused
// with exactly the answer the seed expects, and nothing changes; sent one at a time in the
// suggested order, each runs under its transaction id with rising fences, and the refund goes
// to the new address. With on_conflict: order, Hermes orders them itself, whatever order the
// request gives.
func TestTheSeedsTwoChangesOfOneOrder(t *testing.T) {
	long(t, "waits for the routers to follow changed contracts")
	t.Parallel()
	s := start(t, options{routesFile: "../../examples/routes.yaml", workers: 1, callers: true})
	keys := callerKeys(t, s, map[string]auth.Role{"admin": auth.RoleAdmin, "alice": auth.RoleUser})
	contracts := map[string]string{}
	for _, name := range []string{"address_update", "refund_apply"} {
		doc, err := os.ReadFile("../../examples/contracts/" + name + ".yaml")
		if err != nil {
			t.Fatal(err)
		}
		contracts[name] = string(doc)
		if code, _, body := s.registerContract(keys["admin"], string(doc)); code != http.StatusCreated {
			t.Fatalf("register %s: %d %s", name, code, body)
		}
	}
	// A router sees a contract when its watch delivers it: the conflict is found only between
	// calls routed under both.
	waitFor(t, "every router follows both contracts", func() bool {
		for _, r := range s.routers {
			for name := range contracts {
				if c, err := r.Contract(name); err != nil || c == nil {
					return false
				}
			}
		}
		return true
	})
	data, err := os.ReadFile(seedPath("state-coordination.json"))
	if err != nil {
		t.Fatal(err)
	}
	var seed struct {
		Proposals []struct{ Key, Field, Old, New, Tool string } `json:"proposals"`
		Expected  json.RawMessage                               `json:"expected_on_conflict"`
	}
	if err := json.Unmarshal(data, &seed); err != nil {
		t.Fatal(err)
	}
	argsOf := func(i int) map[string]any {
		p := seed.Proposals[i]
		if p.Tool == "address_update" {
			return map[string]any{"order_id": p.Key, "shipping_address": p.New}
		}
		return map[string]any{"order_id": p.Key}
	}
	route := func(id string, calls ...map[string]any) *protocol.Response {
		body, _ := json.Marshal(map[string]any{"request_id": id, "session_id": "s_seed_order", "intent": "change order", "tool_calls": calls})
		code, out := s.call("POST", "/v1/route", keys["alice"], string(body))
		if code != http.StatusOK {
			t.Fatalf("%s: %d %s", id, code, out)
		}
		t.Logf("%s → %s", id, out)
		return decodeResponse(t, []byte(out))
	}
	changes := func(order string) string {
		resp, err := http.Get("http://" + s.demoAddr + "/v1/orders/" + order + "/changes")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}

	// Both proposals in one request: the seed's expected answer, exactly, for each call.
	resp := route("seed_both", call("c1", seed.Proposals[0].Tool, argsOf(0)), call("c2", seed.Proposals[1].Tool, argsOf(1)))
	for _, id := range []string{"c1", "c2"} {
		r := result(t, resp, id)
		got, _ := json.Marshal(map[string]any{"error_code": r.ErrorCode, "suggested_order": r.SuggestedOrder})
		var want, have any
		_ = json.Unmarshal(seed.Expected, &want)
		_ = json.Unmarshal(got, &have)
		if fmt.Sprint(want) != fmt.Sprint(have) {
			t.Fatalf("%s: %s, want the seed's %s", id, got, seed.Expected)
		}
	}
	if c := changes("order_123"); !strings.Contains(c, `"changes":[]`) {
		t.Fatalf("a refused conflict changed the order: %s", c)
	}

	// In the suggested order, one at a time.
	addr := result(t, route("seed_first", call("c1", "address_update", argsOf(0))), "c1")
	refund := result(t, route("seed_second", call("c1", "refund_apply", argsOf(1))), "c1")
	var refundBody struct {
		RefundTo string `json:"refund_to"`
		Old, New string
	}
	_ = json.Unmarshal(refund.Content, &refundBody)
	if addr.Status != protocol.ResultOK || refund.Status != protocol.ResultOK || refundBody.RefundTo != seed.Proposals[0].New ||
		refundBody.Old != seed.Proposals[1].Old || refundBody.New != seed.Proposals[1].New ||
		!protocol.ValidTx(addr.Grant.Tx) || refund.Grant.Fence <= addr.Grant.Fence || addr.Grant.Resource != "order_123" {
		t.Fatalf("in order: %+v %+v (%s)", addr, refund, refund.Content)
	}
	t.Logf("address_update %s fence %d, then refund_apply %s fence %d: refund to %q", addr.Grant.Tx, addr.Grant.Fence,
		refund.Grant.Tx, refund.Grant.Fence, refundBody.RefundTo)

	// on_conflict: order — the request lists the refund first; Hermes runs the address change
	// first, then the refund, under one transaction.
	for name, doc := range contracts {
		if code, _, body := s.registerContract(keys["admin"], doc+"on_conflict: order\n"); code != http.StatusCreated {
			t.Fatalf("register %s with on_conflict: order: %d %s", name, code, body)
		}
	}
	var a, r protocol.ToolResult
	rid := ""
	waitFor(t, "the routers follow the contracts with on_conflict: order", func() bool {
		// Until a router has seen the new versions, the request is refused as a conflict
		// again, changing nothing.
		rid = fmt.Sprintf("seed_ordered_%d", time.Now().UnixNano())
		resp := route(rid, call("r", "refund_apply", map[string]any{"order_id": "order_456"}),
			call("a", "address_update", map[string]any{"order_id": "order_456", "shipping_address": "Shanghai, 88 Century Ave"}))
		a, r = result(t, resp, "a"), result(t, resp, "r")
		return a.ErrorCode != protocol.CodeConflictResolveRequired
	})
	_ = json.Unmarshal(r.Content, &refundBody)
	if a.Status != protocol.ResultOK || r.Status != protocol.ResultOK || refundBody.RefundTo != "Shanghai, 88 Century Ave" ||
		a.Grant.Tx != r.Grant.Tx || a.Grant.Tx != protocol.TxID(rid, "order_456") || r.Grant.Fence <= a.Grant.Fence {
		t.Fatalf("ordered by Hermes: %+v %+v (%s)", a, r, r.Content)
	}
	t.Logf("ordered by Hermes under %s: address_update fence %d, refund_apply fence %d, refund to %q", a.Grant.Tx, a.Grant.Fence, r.Grant.Fence, refundBody.RefundTo)
}
