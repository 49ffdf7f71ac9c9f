package integration

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/blueprints"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// The web view shows a blueprint run's steps above the requests they made: a row per step on
// the run's time axis (a bar for a step that ran, none for one skipped, with the condition
// that skipped it and the value it read) and how the run ended — succeeded, or transferred
// to a person with the fallback's message. The message log has a [blueprint] line per event.
func TestBrowserBlueprintRunWaterfall(t *testing.T) {
	long(t, "browser")
	chromium := chromiumPath(t)
	s := start(t, options{routesFile: "../../examples/routes.yaml", callers: true, workers: 1})
	keys := callerKeys(t, s, map[string]auth.Role{"ann": auth.RoleUser, "root": auth.RoleAdmin})
	if code, body := s.call(http.MethodPost, "/api/v1/blueprints", keys["root"], seedBlueprint(t), "Content-Type", "application/json"); code != http.StatusCreated {
		t.Fatalf("register: %d %s", code, body)
	}
	shipped := s.demoOrder(2, "shipped")
	if code, run, body := s.startRun(keys["ann"], "check_and_urge", "ui-shipped", fmt.Sprintf(`{"order_id":%q}`, shipped)); code != http.StatusOK || run.Status != blueprints.Succeeded {
		t.Fatalf("shipped: %d %s", code, body)
	}
	if code, run, body := s.startRun(keys["ann"], "check_and_urge", "ui-unknown", `{"order_id":"ORD209901010001"}`); code != http.StatusOK || run.Status != blueprints.Transferred {
		t.Fatalf("unknown order: %d %s", code, body)
	}

	b := newBrowser(t, chromium, s.base)
	b.do("open the run's session", chromedp.Navigate(b.base+"/#session="+protocol.RunSession("ui-shipped")))
	b.waitJS("the sign-in form", `!document.getElementById('signin').hidden`)
	b.do("give ann's key", chromedp.SetValue(chromedp.CSS("#signin-key"), keys["ann"]), chromedp.Click(chromedp.CSS("#signin-submit")))
	b.waitJS("signed in", `document.getElementById('who').textContent.includes('ann')`)

	run := func(id string) string { return fmt.Sprintf(`document.querySelector('.bp-run[data-run=%q]')`, id) }
	step := func(id, n string) string {
		return fmt.Sprintf(`(%s || document.createElement('div')).querySelector('.bp-step[data-step=%q]')`, run(id), n)
	}
	end := func(id string) string {
		return fmt.Sprintf(`((%s || document.createElement('div')).querySelector('.bp-end') || {}).textContent || ""`, run(id))
	}
	b.waitJS("the run, succeeded", `!document.getElementById('runs').hidden && !!`+run("ui-shipped")+` && `+run("ui-shipped")+`.dataset.status === 'succeeded' && `+
		end("ui-shipped")+`.includes('succeeded')`)
	b.waitJS("step 0 ran", `!!`+step("ui-shipped", "0")+` && `+step("ui-shipped", "0")+`.dataset.tool === 'order_query' && `+
		step("ui-shipped", "0")+`.dataset.status === 'succeeded' && !!`+step("ui-shipped", "0")+`.querySelector('.bar')`)
	skip := fmt.Sprintf(`((%s || document.createElement('div')).querySelector('.bp-skip') || {}).textContent || ""`, step("ui-shipped", "1"))
	b.waitJS("step 1 skipped, with its condition's value", `!!`+step("ui-shipped", "1")+` && `+step("ui-shipped", "1")+`.dataset.tool === 'logistics_urge' && `+
		step("ui-shipped", "1")+`.dataset.status === 'skipped' && !`+step("ui-shipped", "1")+`.querySelector('.bar') && `+
		skip+`.startsWith('skipped: ') && `+skip+`.includes("$.order_data.success.status == 'created'") && `+skip+`.includes('= false') && `+
		skip+`.includes('$.order_data.success.status = "shipped"')`)
	b.waitJS("the first step's request below", jsReqStatus(protocol.RunRequestID("ui-shipped", "s0"))+` === 'success'`)
	b.waitJS("[blueprint] lines in the message log", `[...document.querySelectorAll('#log-list li')].some((li) => li.textContent.includes('blueprint_step.v1') && `+
		`li.textContent.includes('[blueprint] check_and_urge run ui-shipped step 1 logistics_urge skipped'))`)
	b.clickLive("open the skipped step", `.bp-run[data-run="ui-shipped"] .bp-step[data-step="1"]`)
	b.waitJS("its event", `(() => { const d = document.getElementById('detail'); return !d.hidden && d.textContent.includes('blueprint_step.v1') && d.textContent.includes('"shipped"'); })()`)
	b.screenshot("blueprint-succeeded")

	b.do("open the unknown order's run", chromedp.Navigate(b.base+"/#session="+protocol.RunSession("ui-unknown")))
	b.waitJS("the run, transferred to a person", `!!`+run("ui-unknown")+` && `+run("ui-unknown")+`.dataset.status === 'transferred' && `+
		end("ui-unknown")+`.includes('transferred to human_agent') && `+end("ui-unknown")+`.includes('订单状态异常，已转人工客服') && !`+run("ui-shipped"))
	b.screenshot("blueprint-transferred")
}

// A step whose call its tool's policy holds for a person shows as waiting for approval, with
// the approval's id and Approve under it; approved, the step runs and the run succeeds.
func TestBrowserBlueprintStepWaitsForApproval(t *testing.T) {
	long(t, "browser")
	chromium := chromiumPath(t)
	s := start(t, options{routesFile: "../../examples/routes.yaml", callers: true, workers: 1})
	keys := callerKeys(t, s, map[string]auth.Role{"ann": auth.RoleUser, "root": auth.RoleAdmin})
	if code, body := s.call(http.MethodPost, "/api/v1/blueprints", keys["root"], seedBlueprint(t), "Content-Type", "application/json"); code != http.StatusCreated {
		t.Fatalf("register: %d %s", code, body)
	}
	s.applyPolicy("logistics_urge", `{"confirm_required":true,"expires_in":"5m"}`)
	paid := s.demoOrder(0, "paid", "created")
	if code, body := s.call(http.MethodPost, "/v1/blueprints/check_and_urge/runs", keys["ann"], fmt.Sprintf(`{"run_id":"ui-wait","user_input":{"order_id":%q}}`, paid)); code >= 300 {
		t.Fatalf("start: %d %s", code, body)
	}
	var approval string
	waitFor(t, "the urge step waiting for approval", func() bool {
		run := s.runOf(keys["ann"], "ui-wait")
		if st := run.Step("1"); st != nil && st.Status == blueprints.StepParked {
			approval = st.ApprovalID
		}
		return approval != ""
	})

	b := newBrowser(t, chromium, s.base)
	b.do("open the run's session", chromedp.Navigate(b.base+"/#session="+protocol.RunSession("ui-wait")))
	b.waitJS("the sign-in form", `!document.getElementById('signin').hidden`)
	b.do("give ann's key", chromedp.SetValue(chromedp.CSS("#signin-key"), keys["ann"]), chromedp.Click(chromedp.CSS("#signin-submit")))
	b.waitJS("signed in", `document.getElementById('who').textContent.includes('ann')`)

	row := `document.querySelector('.bp-run[data-run="ui-wait"] .bp-step[data-step="1"]')`
	box := fmt.Sprintf(`document.querySelector('.bp-run[data-run="ui-wait"] .approval[data-approval=%q]')`, approval)
	b.waitJS("step 1 waiting, with its approval", `!!`+row+` && `+row+`.dataset.status === 'waiting_approval' && `+row+`.textContent.includes('waiting for approval') && `+
		row+`.textContent.includes('approval `+approval+`') && !!`+box+` && !!`+box+`.querySelector('.apr-approve')`)
	b.waitJS("the run not ended", `document.querySelector('.bp-run[data-run="ui-wait"]').dataset.status === 'running'`)
	b.screenshot("blueprint-waiting")

	b.clickLive("Approve", fmt.Sprintf(`.bp-run[data-run="ui-wait"] .approval[data-approval=%q] .apr-approve`, approval))
	b.waitJS("the step ran and the run succeeded", row+`.dataset.status === 'succeeded' && document.querySelector('.bp-run[data-run="ui-wait"]').dataset.status === 'succeeded'`)
}
