package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/blueprints"
	"github.com/hermesbus/hermes/internal/gateway"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// seedBlueprint is the seed's blueprint file, as shipped.
func seedBlueprint(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("../../examples/blueprints/check_and_urge.json")
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// demoOrder finds a demo order placed daysAgo whose status is one of want.
func (s *system) demoOrder(daysAgo int, want ...string) string {
	s.t.Helper()
	day := time.Now().In(time.FixedZone("CST", 8*3600)).AddDate(0, 0, -daysAgo).Format("20060102")
	for n := 1; n < 200; n++ {
		id := fmt.Sprintf("ORD%s%04d", day, n)
		resp, err := http.Get("http://" + s.demoAddr + "/v1/orders/" + id)
		if err != nil {
			s.t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var o struct {
			Success struct {
				Status string `json:"status"`
			} `json:"success"`
		}
		_ = json.Unmarshal(body, &o)
		for _, w := range want {
			if o.Success.Status == w {
				return id
			}
		}
	}
	s.t.Fatalf("no demo order placed %d days ago is %v", daysAgo, want)
	return ""
}

// startRun posts a run and waits for it to end.
func (s *system) startRun(key, blueprint, runID, input string) (int, *blueprints.Run, string) {
	s.t.Helper()
	code, body := s.call(http.MethodPost, "/v1/blueprints/"+blueprint+"/runs?wait=30s", key, fmt.Sprintf(`{"run_id":%q,"user_input":%s}`, runID, input))
	var run blueprints.Run
	if code < 300 {
		if err := json.Unmarshal([]byte(body), &run); err != nil {
			s.t.Fatalf("%d %s", code, body)
		}
	}
	return code, &run, body
}

// The seed's blueprint loads unchanged and runs: an order not yet shipped is urged (its
// condition true), one already shipped is not (the step skipped, the condition's value
// shown, urge_result null), an unknown order takes the fallback (transferred to
// human_agent); asking for a run again under its run_id is the same run, steps not run again.
func TestSeedBlueprintRunsBothBranches(t *testing.T) {
	t.Parallel()
	s := start(t, options{routesFile: "../../examples/routes.yaml", callers: true, workers: 1})
	keys := callerKeys(t, s, map[string]auth.Role{"ann": auth.RoleUser, "root": auth.RoleAdmin, "bob": auth.RoleUser})
	code, body := s.call(http.MethodPost, "/api/v1/blueprints", keys["root"], seedBlueprint(t), "Content-Type", "application/json")
	if code != http.StatusCreated || !strings.Contains(body, `"version":1`) {
		t.Fatalf("register: %d %s", code, body)
	}
	if code, body := s.call(http.MethodPost, "/api/v1/blueprints", keys["ann"], seedBlueprint(t), "Content-Type", "application/json"); code != http.StatusForbidden {
		t.Fatalf("a user registered a blueprint: %d %s", code, body)
	}

	paid := s.demoOrder(0, "paid", "created")
	code, run, body := s.startRun(keys["ann"], "check_and_urge", "cu-paid", fmt.Sprintf(`{"order_id":%q}`, paid))
	if code != http.StatusOK || run.Status != blueprints.Succeeded || len(run.Steps) != 2 {
		t.Fatalf("paid: %d %s", code, body)
	}
	urge := run.Steps[1]
	if urge.Status != blueprints.StepSucceeded || urge.Condition == nil || !urge.Condition.Result ||
		!strings.Contains(string(urge.Input), paid) || !strings.Contains(string(urge.Input), "用户咨询发货进度") ||
		!strings.Contains(string(urge.Output), "URG-") {
		t.Fatalf("paid: the urge step: %+v", urge)
	}
	if urge.RequestID != protocol.RunRequestID("cu-paid", "s1") {
		t.Fatalf("the urge step's request: %s", urge.RequestID)
	}

	shipped := s.demoOrder(2, "shipped")
	code, run, body = s.startRun(keys["ann"], "check_and_urge", "cu-shipped", fmt.Sprintf(`{"order_id":%q}`, shipped))
	if code != http.StatusOK || run.Status != blueprints.Succeeded {
		t.Fatalf("shipped: %d %s", code, body)
	}
	urge = run.Steps[1]
	if urge.Status != blueprints.StepSkipped || urge.Condition == nil || urge.Condition.Result ||
		urge.Condition.Values["$.order_data.success.status"] != "shipped" || string(urge.Output) != "null" {
		t.Fatalf("shipped: the urge step: %+v", urge)
	}

	code, run, body = s.startRun(keys["ann"], "check_and_urge", "cu-unknown", `{"order_id":"ORD209901010001"}`)
	if code != http.StatusOK || run.Status != blueprints.Transferred || run.Fallback == nil || run.Fallback.TransferTo != "human_agent" ||
		run.Fallback.Message != "订单状态异常，已转人工客服" || run.Steps[1].Status != blueprints.StepNotRun {
		t.Fatalf("unknown order: %d %s", code, body)
	}

	// Each step, and each run's end, is on the record: the skipped step with the value its
	// condition read, the transfer with its target.
	var skipped, transferred bool
	for _, m := range s.record() {
		if m.Type != protocol.TypeBlueprintStep {
			continue
		}
		ev, err := m.DecodeBlueprintStep()
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case ev.RunID == "cu-shipped" && ev.Step == "1":
			skipped = ev.Status == "skipped" && ev.Condition != nil && strings.Contains(string(ev.Condition.Values), `"shipped"`) &&
				m.SessionID == protocol.RunSession("cu-shipped")
		case ev.RunID == "cu-unknown" && ev.Step == "":
			transferred = ev.Status == "transferred" && ev.TransferTo == "human_agent"
		}
	}
	if !skipped || !transferred {
		t.Fatalf("the record: skipped step %t, transferred run %t", skipped, transferred)
	}

	// The same run again is the same run: nothing runs twice.
	before := len(s.record())
	code, again, body := s.startRun(keys["ann"], "check_and_urge", "cu-paid", fmt.Sprintf(`{"order_id":%q}`, paid))
	if code != http.StatusOK || again.Status != blueprints.Succeeded || string(again.Steps[1].Output) != string(s.runOf(keys["ann"], "cu-paid").Steps[1].Output) {
		t.Fatalf("again: %d %s", code, body)
	}
	if after := len(s.record()); after != before {
		t.Fatalf("asking again recorded %d messages", after-before)
	}
	// Another run under a used id is refused; another caller does not see the run.
	if code, body := s.call(http.MethodPost, "/v1/blueprints/check_and_urge/runs", keys["ann"], `{"run_id":"cu-paid","user_input":{"order_id":"ORD209901010002"}}`); code != http.StatusConflict || !strings.Contains(body, protocol.CodeRunIDConflict) {
		t.Fatalf("another run under a used id: %d %s", code, body)
	}
	if code, _ := s.call(http.MethodGet, "/v1/runs/cu-paid", keys["bob"], ""); code != http.StatusNotFound {
		t.Fatalf("another user reads the run: %d", code)
	}
	// A user_input the first step's mapping cannot use is refused before anything runs.
	if code, body := s.call(http.MethodPost, "/v1/blueprints/check_and_urge/runs", keys["ann"], `{"run_id":"cu-bad","user_input":{"order":"x"}}`); code != http.StatusBadRequest || !strings.Contains(body, "$.user_input.order_id") {
		t.Fatalf("a user_input without order_id: %d %s", code, body)
	}
	if code, _ := s.call(http.MethodGet, "/v1/runs/cu-bad", keys["ann"], ""); code != http.StatusNotFound {
		t.Fatalf("a refused run was kept: %d", code)
	}
}

// runOf reads a run.
func (s *system) runOf(key, id string) *blueprints.Run {
	s.t.Helper()
	code, body := s.call(http.MethodGet, "/v1/runs/"+id, key, "")
	var run blueprints.Run
	if code != http.StatusOK || json.Unmarshal([]byte(body), &run) != nil {
		s.t.Fatalf("run %s: %d %s", id, code, body)
	}
	return &run
}

// A blueprint naming an unknown tool, a mapping path nothing provides, an output_key used
// twice or a condition that does not compile is refused at registration, naming the step,
// the field and the reason.
func TestBadBlueprintsAreRefusedAtRegistration(t *testing.T) {
	t.Parallel()
	s := start(t, options{routesFile: "../../examples/routes.yaml", callers: true})
	keys := callerKeys(t, s, map[string]auth.Role{"root": auth.RoleAdmin})
	for _, c := range []struct{ doc, want string }{
		{`{"name":"b","steps":[{"tool":"no_such_tool","output_key":"x"}]}`, "steps[0]"},
		{`{"name":"b","steps":[{"tool":"order_query","input_mapping":{"order_id":"$.later.id"},"output_key":"x"}]}`, "$.later"},
		{`{"name":"b","steps":[{"tool":"order_query","output_key":"x"},{"tool":"order_query","output_key":"x"}]}`, "output_key"},
		{`{"name":"b","steps":[{"tool":"order_query","output_key":"x","condition":"$.user_input.a =="}]}`, "condition"},
	} {
		code, body := s.call(http.MethodPost, "/api/v1/blueprints", keys["root"], c.doc, "Content-Type", "application/json")
		if code != http.StatusBadRequest || !strings.Contains(body, protocol.CodeInvalidBlueprint) || !strings.Contains(body, c.want) {
			t.Errorf("%s: %d %s", c.doc, code, body)
		}
	}
	if code, body := s.call(http.MethodGet, "/api/v1/blueprints", keys["root"], ""); code != http.StatusOK || strings.Contains(body, `"name":"b"`) {
		t.Fatalf("a refused blueprint was kept: %d %s", code, body)
	}
}

// Policies apply to every step: an approval parks the run (waiting_approval), and approving
// it lets the run go on; a denied approval, or POLICY_DENIED, takes the fallback. A policy on
// the blueprint's name decides who may run it, and its listing.
func TestBlueprintStepsFollowPolicies(t *testing.T) {
	t.Parallel()
	s := start(t, options{routesFile: "../../examples/routes.yaml", callers: true, workers: 1})
	keys := callerKeys(t, s, map[string]auth.Role{"ann": auth.RoleUser, "root": auth.RoleAdmin})
	if code, body := s.call(http.MethodPost, "/api/v1/blueprints", keys["root"], seedBlueprint(t), "Content-Type", "application/json"); code != http.StatusCreated {
		t.Fatalf("register: %d %s", code, body)
	}
	s.applyPolicy("logistics_urge", `{"confirm_required":true,"expires_in":"5m"}`)
	paid := s.demoOrder(0, "paid", "created")
	code, body := s.call(http.MethodPost, "/v1/blueprints/check_and_urge/runs", keys["ann"], fmt.Sprintf(`{"run_id":"pol-1","user_input":{"order_id":%q}}`, paid))
	if code != http.StatusCreated {
		t.Fatalf("begin: %d %s", code, body)
	}
	var parked *blueprints.Run
	waitFor(t, "the run parked", func() bool {
		parked = s.runOf(keys["ann"], "pol-1")
		return parked.Status == blueprints.Waiting
	})
	apr := parked.Steps[1].ApprovalID
	if parked.Steps[1].Status != blueprints.StepParked || apr == "" {
		t.Fatalf("parked: %+v", parked.Steps[1])
	}
	if code, body := s.call(http.MethodPost, "/v1/approvals/"+apr+"/approve", keys["ann"], ""); code != http.StatusOK {
		t.Fatalf("approve: %d %s", code, body)
	}
	code, body = s.call(http.MethodGet, "/v1/runs/pol-1?wait=20s", keys["ann"], "")
	var run blueprints.Run
	_ = json.Unmarshal([]byte(body), &run)
	if code != http.StatusOK || run.Status != blueprints.Succeeded || !strings.Contains(string(run.Steps[1].Output), "URG-") {
		t.Fatalf("approved: %d %s", code, body)
	}

	// Denied: the step fails APPROVAL_DENIED, and the run takes the fallback.
	code, body = s.call(http.MethodPost, "/v1/blueprints/check_and_urge/runs", keys["ann"], fmt.Sprintf(`{"run_id":"pol-2","user_input":{"order_id":%q}}`, paid))
	if code != http.StatusCreated {
		t.Fatalf("begin: %d %s", code, body)
	}
	waitFor(t, "the second run parked", func() bool {
		parked = s.runOf(keys["ann"], "pol-2")
		return parked.Status == blueprints.Waiting
	})
	if code, body := s.call(http.MethodPost, "/v1/approvals/"+parked.Steps[1].ApprovalID+"/deny", keys["ann"], `{"reason":"not now"}`); code != http.StatusOK {
		t.Fatalf("deny: %d %s", code, body)
	}
	code, body = s.call(http.MethodGet, "/v1/runs/pol-2?wait=20s", keys["ann"], "")
	run = blueprints.Run{}
	_ = json.Unmarshal([]byte(body), &run)
	if run.Status != blueprints.Transferred || run.Steps[1].Error == nil || run.Steps[1].Error.Code != protocol.CodeApprovalDenied {
		t.Fatalf("denied: %d %s", code, body)
	}

	// POLICY_DENIED takes the fallback at once.
	s.applyPolicy("logistics_urge", `{"allowed_roles":["admin"]}`)
	waitFor(t, "the policy followed", func() bool {
		_, run, _ := s.startRun(keys["ann"], "check_and_urge", fmt.Sprintf("pol-3-%d", time.Now().UnixNano()), fmt.Sprintf(`{"order_id":%q}`, paid))
		return run.Status == blueprints.Transferred && run.Steps[1].Error != nil && run.Steps[1].Error.Code == protocol.CodePolicyDenied
	})

	// A policy on the blueprint's name: only admins may run it, or see it.
	if code, body := s.call(http.MethodPost, "/api/v1/policies", keys["root"], `{"policies":{"check_and_urge":{"allowed_roles":["admin"]}}}`); code != http.StatusCreated {
		t.Fatalf("a policy on the blueprint: %d %s", code, body)
	}
	waitFor(t, "the blueprint's policy followed", func() bool {
		code, _ := s.call(http.MethodPost, "/v1/blueprints/check_and_urge/runs", keys["ann"], `{"user_input":{"order_id":"ORD209901010001"}}`)
		return code == http.StatusForbidden
	})
	if code, body := s.call(http.MethodPost, "/v1/blueprints/check_and_urge/runs?wait=20s", keys["root"], `{"user_input":{"order_id":"ORD209901010001"}}`); code != http.StatusOK {
		t.Fatalf("an admin runs it: %d %s", code, body)
	}
}

// travel_advice takes each branch by the weather: rain (precipitation ≥ 50 %) suggests indoor
// activities, otherwise outdoor ones; the branch not taken is skipped and holds its default.
func TestTravelAdviceBranches(t *testing.T) {
	t.Parallel()
	s := start(t, options{routesFile: "../../examples/routes.yaml", callers: true, workers: 1})
	keys := callerKeys(t, s, map[string]auth.Role{"ann": auth.RoleUser, "root": auth.RoleAdmin})
	data, err := os.ReadFile("../../examples/blueprints/travel_advice.json")
	if err != nil {
		t.Fatal(err)
	}
	if code, body := s.call(http.MethodPost, "/api/v1/blueprints", keys["root"], string(data)); code != http.StatusCreated {
		t.Fatalf("register: %d %s", code, body)
	}
	for _, c := range []struct {
		date, ran, skipped, kind string
	}{
		{"2026-04-04", "indoor", "outdoor", "indoor_activities"},
		{"2026-04-05", "outdoor", "indoor", "outdoor_activities"},
	} {
		code, run, body := s.startRun(keys["ann"], "travel_advice", "ta-"+c.date, fmt.Sprintf(`{"city":"杭州","date":%q}`, c.date))
		if code != http.StatusOK || run.Status != blueprints.Succeeded {
			t.Fatalf("%s: %d %s", c.date, code, body)
		}
		for _, st := range run.Steps {
			switch st.OutputKey {
			case c.ran:
				if st.Status != blueprints.StepSucceeded || !strings.Contains(string(st.Output), c.kind) || !st.Condition.Result {
					t.Fatalf("%s: %s: %+v", c.date, c.ran, st)
				}
			case c.skipped:
				if st.Status != blueprints.StepSkipped || st.Condition.Result || st.Condition.Values["$.weather.precipitation_chance_pct"] == nil {
					t.Fatalf("%s: %s: %+v", c.date, c.skipped, st)
				}
			}
		}
	}
}

// A run's session streams its steps: GET /v1/sessions/bpr-<run_id>/events delivers, to the
// caller who ran it, each blueprint_step of the run (the skipped step with the value its
// condition read) and the run's end, among the requests of its steps.
func TestBlueprintStepsReachTheSessionStream(t *testing.T) {
	t.Parallel()
	s := start(t, options{routesFile: "../../examples/routes.yaml", callers: true, workers: 1})
	keys := callerKeys(t, s, map[string]auth.Role{"ann": auth.RoleUser, "root": auth.RoleAdmin})
	if code, body := s.call(http.MethodPost, "/api/v1/blueprints", keys["root"], seedBlueprint(t), "Content-Type", "application/json"); code != http.StatusCreated {
		t.Fatalf("register: %d %s", code, body)
	}
	shipped := s.demoOrder(2, "shipped")
	if code, run, body := s.startRun(keys["ann"], "check_and_urge", "sse-shipped", fmt.Sprintf(`{"order_id":%q}`, shipped)); code != http.StatusOK || run.Status != blueprints.Succeeded {
		t.Fatalf("run: %d %s", code, body)
	}

	session := protocol.RunSession("sse-shipped")
	ev := openEvents(t, s.base, session, "", "Authorization", "Bearer "+keys["ann"])
	var steps []string
	var requests int
	for {
		r := ev.next()
		if r.SessionID != session || r.Error != "" {
			t.Fatalf("event %d: %+v", r.ID, r)
		}
		if r.Type == protocol.TypeRequest {
			requests++
		}
		if r.Type != protocol.TypeBlueprintStep {
			continue
		}
		var st protocol.BlueprintStep
		if err := json.Unmarshal(r.Payload, &st); err != nil {
			t.Fatalf("a blueprint_step payload %s: %v", r.Payload, err)
		}
		line := st.Step + " " + st.Tool + " " + st.Status
		if st.Condition != nil {
			line += " " + string(st.Condition.Values)
		}
		steps = append(steps, strings.TrimSpace(line))
		if st.Step == "" {
			break
		}
	}
	want := []string{"0 order_query running", "0 order_query succeeded",
		`1 logistics_urge skipped {"$.order_data.success.status":"shipped"}`, "succeeded"}
	if strings.Join(steps, "; ") != strings.Join(want, "; ") {
		t.Fatalf("the run's steps on its stream:\n  %s\nwant\n  %s", strings.Join(steps, "; "), strings.Join(want, "; "))
	}
	if requests != 1 {
		t.Fatalf("%d requests on the run's stream; one, the first step's", requests)
	}
}

// Runs are bounded, each bound with a clear error: a user_input the first tool's contract
// refuses is refused before any step runs; a caller has at most MaxRunsPerCaller runs going.
func TestBlueprintRunBounds(t *testing.T) {
	t.Parallel()
	s := start(t, options{routesFile: "../../examples/routes.yaml", callers: true, workers: 1})
	keys := callerKeys(t, s, map[string]auth.Role{"ann": auth.RoleUser, "bob": auth.RoleUser, "cat": auth.RoleUser, "root": auth.RoleAdmin})
	contract, err := os.ReadFile("../../examples/contracts/order_query.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if code, _, body := s.registerContract(keys["root"], string(contract)); code != http.StatusCreated {
		t.Fatalf("register the contract: %d %s", code, body)
	}
	if code, body := s.call(http.MethodPost, "/api/v1/blueprints", keys["root"], seedBlueprint(t)); code != http.StatusCreated {
		t.Fatalf("register: %d %s", code, body)
	}
	code, body := s.call(http.MethodPost, "/v1/blueprints/check_and_urge/runs", keys["ann"], `{"run_id":"bad-input","user_input":{"order_id":"12345"}}`)
	if code != http.StatusBadRequest || !strings.Contains(body, "order_query") || !strings.Contains(body, "order_id") {
		t.Fatalf("a user_input the contract refuses: %d %s", code, body)
	}
	if code, _ := s.call(http.MethodGet, "/v1/runs/bad-input", keys["ann"], ""); code != http.StatusNotFound {
		t.Fatalf("a refused run was kept: %d", code)
	}

	s.applyBlueprint(`{"name":"slow","steps":[{"tool":"echo","input_mapping":{"delay_ms":4000,"n":"$.user_input.n"},"output_key":"x"}]}`)
	for i := range gateway.MaxRunsPerCaller {
		if code, body := s.call(http.MethodPost, "/v1/blueprints/slow/runs", keys["ann"], fmt.Sprintf(`{"run_id":"slow-%d","user_input":{"n":%d}}`, i, i)); code != http.StatusCreated {
			t.Fatalf("run %d: %d %s", i, code, body)
		}
	}
	waitFor(t, "the runs counted", func() bool {
		code, _ := s.call(http.MethodPost, "/v1/blueprints/slow/runs", keys["ann"], `{"run_id":"slow-more","user_input":{"n":-1}}`)
		return code == http.StatusTooManyRequests
	})
	code, body = s.call(http.MethodPost, "/v1/blueprints/slow/runs", keys["ann"], `{"run_id":"slow-more","user_input":{"n":-1}}`)
	if code != http.StatusTooManyRequests || !strings.Contains(body, protocol.CodeTooManyRuns) {
		t.Fatalf("one run too many: %d %s", code, body)
	}
	// Asking again for a run already going is no new run; another caller is not held back.
	if code, body := s.call(http.MethodPost, "/v1/blueprints/slow/runs", keys["ann"], `{"run_id":"slow-0","user_input":{"n":0}}`); code != http.StatusAccepted {
		t.Fatalf("a run going, asked again: %d %s", code, body)
	}
	if code, body := s.call(http.MethodPost, "/v1/blueprints/slow/runs", keys["bob"], `{"run_id":"slow-bob","user_input":{"n":0}}`); code != http.StatusCreated {
		t.Fatalf("another caller: %d %s", code, body)
	}
	// Concurrent POSTs of one caller do not pass the bound together. (The caller's key is
	// used once first: 48 first uses of a key at once can be counted as failed credentials.)
	if code, body := s.call(http.MethodGet, "/api/v1/blueprints", keys["cat"], ""); code != http.StatusOK {
		t.Fatalf("cat: %d %s", code, body)
	}
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for i := range gateway.MaxRunsPerCaller + 16 {
		wg.Go(func() {
			code, body := s.call(http.MethodPost, "/v1/blueprints/slow/runs", keys["cat"], fmt.Sprintf(`{"run_id":"cat-%d","user_input":{"n":%d}}`, i, i))
			mu.Lock()
			codes[code]++
			if code == http.StatusTooManyRequests && !strings.Contains(body, protocol.CodeTooManyRuns) || code >= 500 {
				t.Errorf("run cat-%d: %d %s", i, code, body)
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	if codes[http.StatusCreated] != gateway.MaxRunsPerCaller || codes[http.StatusTooManyRequests] != 16 {
		t.Fatalf("%d concurrent runs asked for: %v", gateway.MaxRunsPerCaller+16, codes)
	}
	waitForWithin(t, "the runs to end, and room again", 40*time.Second, func() bool {
		code, _ := s.call(http.MethodPost, "/v1/blueprints/slow/runs", keys["ann"], `{"run_id":"slow-more","user_input":{"n":-1}}`)
		return code == http.StatusCreated || code == http.StatusAccepted
	})
}

// A wait for a run's end is one of the caller's waiting requests: over its limit, 429; a wait
// that does not parse is 400 naming it.
func TestRunWaitsAreBounded(t *testing.T) {
	t.Parallel()
	s := start(t, options{routesFile: "../../examples/routes.yaml", callers: true, workers: 1,
		callerLimits: admission.CallerLimits{Waiting: 1}})
	keys := callerKeys(t, s, map[string]auth.Role{"ann": auth.RoleUser})
	s.applyBlueprint(`{"name":"slow","steps":[{"tool":"echo","input_mapping":{"delay_ms":4000,"n":"$.user_input.n"},"output_key":"x"}]}`)
	if code, body := s.call(http.MethodPost, "/v1/blueprints/slow/runs", keys["ann"], `{"run_id":"w1","user_input":{"n":1}}`); code != http.StatusCreated {
		t.Fatalf("begin: %d %s", code, body)
	}
	if code, body := s.call(http.MethodGet, "/v1/runs/w1?wait=soon", keys["ann"], ""); code != http.StatusBadRequest || !strings.Contains(body, "wait") {
		t.Fatalf("a wait that does not parse: %d %s", code, body)
	}
	done := make(chan int)
	go func() {
		for { // until it holds the caller's one waiting slot (a probe below may hold it a moment)
			code, _ := s.call(http.MethodGet, "/v1/runs/w1?wait=20s", keys["ann"], "")
			if code != http.StatusTooManyRequests {
				done <- code
				return
			}
		}
	}()
	waitFor(t, "a second wait refused", func() bool {
		code, _ := s.call(http.MethodGet, "/v1/runs/w1?wait=1ms", keys["ann"], "")
		return code == http.StatusTooManyRequests
	})
	if code := <-done; code != http.StatusOK {
		t.Fatalf("the first wait: %d", code)
	}
}
