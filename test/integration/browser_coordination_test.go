package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/hermesbus/hermes/internal/registry"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// The web view marks a call that waits for its turn on a resource with the resource it waits
// for and who holds it, shows the turn's events under the call, and drops the mark once the
// call got its turn and ran.
func TestBrowserMarksACallWaitingForItsTurn(t *testing.T) {
	long(t, "browser")
	s, _, b, _ := browserScenario(t)
	const doc = "name: echo\neffects: idempotent\nresource_key: \"acct:{key}\"\ninput_schema:\n  key: {type: string, required: true}\n  delay_ms: {type: integer}\n"
	k, err := registry.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	_, admin := s.connect()
	if _, _, err := registry.NewStore(admin.Contracts).Register(s.ctx, k, []byte(doc), "test"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the contract in use", func() bool {
		r := s.route(request(fmt.Sprintf("coord_probe_%d", time.Now().UnixNano()), "", call("c", "echo", map[string]any{"key": "probe"})))
		return result(t, r, "c").Grant != nil
	})
	const session = "sess_ui_coord"
	b.do("open the session", chromedp.Navigate(b.base+"/#session="+session))
	b.waitJS("connected", `document.getElementById('conn').dataset.state === 'live'`)
	first := make(chan *protocol.Response, 1)
	go func() {
		first <- s.route(map[string]any{"request_id": "req_ui_hold", "session_id": session, "intent": "hold",
			"tool_calls": []map[string]any{call("h", "echo", map[string]any{"key": "x", "delay_ms": 4000})}})
	}()
	b.waitJS("the first call running", jsReqStatus("req_ui_hold")+` !== undefined`)
	second := make(chan *protocol.Response, 1)
	go func() {
		second <- s.route(map[string]any{"request_id": "req_ui_wait", "session_id": session, "intent": "wait",
			"tool_calls": []map[string]any{call("w", "echo", map[string]any{"key": "x"})}})
	}()
	mark := fmt.Sprintf(`(((r) => r && r.querySelector('.wf-wait[data-call="w"]'))(%s) || {textContent: '', dataset: {}})`, jsReq("req_ui_wait"))
	b.waitJS("the waiting call marked with its resource", mark+`.dataset.waitsFor === 'acct:x' && `+
		mark+`.textContent.includes('waits for its turn on acct:x') && `+mark+`.textContent.includes('behind req_ui_hold/h')`)
	b.screenshot("coordination-waiting")
	<-first
	if r := result(t, <-second, "w"); r.Status != protocol.ResultOK || r.Grant == nil {
		t.Fatalf("the waiting call: %+v", r)
	}
	b.waitJS("the mark gone once it ran", jsReqStatus("req_ui_wait")+` === 'success' && !`+jsReq("req_ui_wait")+`.querySelector('.wf-wait')`)
	b.waitJS("its turn's events under it", `[...(`+jsReq("req_ui_wait")+` || document).querySelectorAll('.wf-policy[data-call="w"]')].map((e) => e.dataset.coord).join(',') === 'waiting,granted,released'`)
}
