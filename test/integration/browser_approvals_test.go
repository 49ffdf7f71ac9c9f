package integration

import (
	"fmt"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/hermesbus/hermes/internal/auth"
)

// The web view shows a call its policy parked with Approve and Deny for the caller who may
// decide it — under the call, and in the session's list of approvals. Approving runs the call
// (its request appears and succeeds, once); denying asks for a reason first. A caller who may
// see an approval but not decide it gets no buttons.
func TestBrowserApprovesAParkedCall(t *testing.T) {
	long(t, "browser")
	chromium := chromiumPath(t)
	s := start(t, options{workers: 1, callers: true})
	keys := callerKeys(t, s, map[string]auth.Role{"ann": auth.RoleUser, "ops": auth.RoleOperator})
	s.applyPolicy("record", `{"confirm_required":true,"expires_in":"5m"}`)
	const session = "sess_ui_apr"
	var ids []string
	for i := 1; i <= 3; i++ {
		res := s.routeOne(keys["ann"], fmt.Sprintf("ui_apr_%d", i), session, "record", fmt.Sprintf(`{"n":%d}`, i))
		if res.Policy == nil || res.Policy.ApprovalID == "" {
			t.Fatalf("call %d not parked: %+v", i, res)
		}
		ids = append(ids, res.Policy.ApprovalID)
	}
	listed := func(id string) string {
		return fmt.Sprintf(`document.querySelector('#approvals-list li[data-approval=%q]')`, id)
	}
	under := func(req string) string { return jsReq(req) + `.querySelector('.approval')` }

	b := newBrowser(t, chromium, s.base)
	signIn := func(who string) {
		// A fresh page: signing in on one that was signed in before reloads it.
		b.do("open the page for "+who, chromedp.Navigate("about:blank"), chromedp.Navigate(b.base+"/#session="+session))
		b.waitJS("the sign-in form", `!document.getElementById('signin').hidden`)
		b.do("give "+who+"'s key", chromedp.SetValue(chromedp.CSS("#signin-key"), keys[who]), chromedp.Click(chromedp.CSS("#signin-submit")))
		b.waitJS("signed in as "+who, `document.getElementById('who').textContent.includes('`+who+`')`)
	}
	signIn("ann")
	b.waitJS("the approvals listed", `!document.getElementById('approvals').hidden && document.querySelectorAll('#approvals-list li').length === 3 && `+
		listed(ids[0])+`.textContent.includes('{"n":1}') && `+listed(ids[0])+`.querySelector('.approval').dataset.state === 'pending'`)
	b.waitJS("Approve under the parked call", `!!`+jsReq("ui_apr_1")+` && !!`+under("ui_apr_1")+` && `+
		under("ui_apr_1")+`.dataset.approval === '`+ids[0]+`' && !!`+under("ui_apr_1")+`.querySelector('.apr-approve')`)
	b.screenshot("approvals-pending")

	b.clickLive("Approve", `.req[data-request="ui_apr_1"] .approval .apr-approve`)
	b.waitJS("the approved call ran", jsReqStatus(ids[0])+` === 'success' && `+jsCallStatus(ids[0], "c1")+` === 'ok'`)
	b.waitJS("its approval used", under("ui_apr_1")+`.dataset.state === 'used' && !`+under("ui_apr_1")+`.querySelector('button') && `+
		listed(ids[0])+`.textContent.includes('runs as request `+ids[0]+`')`)

	b.clickLive("Deny without a reason", fmt.Sprintf(`#approvals-list li[data-approval=%q] .apr-deny`, ids[1]))
	b.waitJS("a reason asked for", listed(ids[1])+`.textContent.includes('Say why') && `+listed(ids[1])+`.querySelector('.apr-reason').getAttribute('aria-invalid') === 'true'`)
	// The list redraws whenever an approval comes or changes — here a fourth call parks while
	// the reason waits to be sent — and keeps what was typed.
	b.typeLive("type a reason", fmt.Sprintf(`#approvals-list li[data-approval=%q] .apr-reason`, ids[1]), "not this week")
	if res := s.routeOne(keys["ann"], "ui_apr_4", session, "record", `{"n":4}`); res.Policy == nil || res.Policy.ApprovalID == "" {
		t.Fatalf("call 4 not parked: %+v", res)
	}
	b.waitJS("the list redrawn with the fourth", `document.querySelectorAll('#approvals-list li').length === 4`)
	b.clickLive("Deny", fmt.Sprintf(`#approvals-list li[data-approval=%q] .apr-deny`, ids[1]))
	b.waitJS("denied with its reason", listed(ids[1])+`.querySelector('.approval').dataset.state === 'denied' && `+listed(ids[1])+`.textContent.includes('not this week') && `+
		under("ui_apr_2")+`.dataset.state === 'denied'`)
	b.screenshot("approvals-decided")
	if _, v := s.approval(keys["ann"], ids[1]); v.State != "denied" || v.Reason != "not this week" {
		t.Errorf("the denial: %+v", v)
	}

	// An operator reads every session, and decides no one's approvals.
	b.do("sign out", chromedp.Click(chromedp.CSS("#signout")))
	signIn("ops")
	b.waitJS("the pending approval, without buttons", listed(ids[2])+` && `+listed(ids[2])+`.querySelector('.approval').dataset.state === 'pending' && `+
		`!document.querySelector('#approvals .apr-approve, #approvals .apr-deny, .req .approval button') && `+
		listed(ids[2])+`.textContent.includes('for its requester to confirm')`)

	if n := len(s.recorder.tries(ids[0] + "/c1")); n != 1 {
		t.Errorf("the approved call ran %d times; once", n)
	}
	if keys := s.recorder.idempotencyKeys(); len(keys) != 1 {
		t.Errorf("the tool ran under %v; once", keys)
	}
}
