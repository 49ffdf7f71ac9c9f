package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/hermesbus/hermes/internal/policies"
	"github.com/hermesbus/hermes/pkg/policy"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// The web view shows what a tool's policy decided: the decision a call was dispatched under
// on its line, and a policy event — a call waiting for its rate window — under it.
func TestBrowserShowsPolicyDecisions(t *testing.T) {
	long(t, "browser")
	s, _, b, _ := browserScenario(t)
	_, admin := s.connect()
	store := policies.NewStore(admin.Bucket(policies.PoliciesBucket))
	ctx := context.Background()
	// One echo a second, whoever calls: a second call waits for the window.
	if _, _, err := store.Apply(ctx, "echo", &policy.Policy{RateLimit: &policy.Rate{Count: 1, Per: time.Second},
		Scope: policy.ScopeTool, OnLimit: policy.OnLimitWait}, "test"); err != nil {
		t.Fatal(err)
	}
	// Applied after echo's: once the routers decide by it, they decide by echo's too.
	if _, _, err := store.Apply(ctx, "policy_probe", &policy.Policy{AllowedRoles: []string{"nobody"}}, "test"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the policies in use", func() bool {
		r := s.route(request(fmt.Sprintf("policy_probe_%d", time.Now().UnixNano()), "", call("c", "policy_probe", map[string]any{})))
		return result(t, r, "c").ErrorCode == protocol.CodePolicyDenied
	})
	const session = "sess_ui_policy"
	b.do("open the session", chromedp.Navigate(b.base+"/#session="+session))
	b.waitJS("connected", `document.getElementById('conn').dataset.state === 'live'`)
	s.route(map[string]any{"request_id": "req_ui_p1", "session_id": session, "intent": "twice",
		"tool_calls": []map[string]any{call("first", "echo", map[string]any{"n": 1}), call("second", "echo", map[string]any{"n": 2})}})
	b.waitJS("both calls ran", jsReqStatus("req_ui_p1")+` === 'success'`)
	b.waitJS("the decision on a call's line", jsCall("req_ui_p1", "first")+`.querySelector('.policy').textContent === 'policy: allowed (policy v1)'`)
	waited := fmt.Sprintf(`(%s.querySelector('.wf-policy[data-call="second"]') || {}).textContent || ""`, jsReq("req_ui_p1"))
	b.waitJS("the wait under the second call", waited+`.includes('[policy]') && `+waited+`.includes('echo second waited: rate_limit (policy v1)') && `+
		waited+`.includes('retry at')`)
	b.waitJS("the wait in the message log", `[...document.querySelectorAll('#log-list li')].some((li) => li.textContent.includes('policy_decision.v1') && li.textContent.includes('waited: rate_limit'))`)
	b.clickLive("open the second call", `.req[data-request="req_ui_p1"] .wf-row.call[data-call="second"]`)
	b.waitJS("its messages", `(() => { const d = document.getElementById('detail'); const t = d.textContent;
		return !d.hidden && t.includes('policy_decision.v1') && t.includes('tool_call.v1'); })()`)
	b.screenshot("policies")
}
