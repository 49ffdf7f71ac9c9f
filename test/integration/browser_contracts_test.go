package integration

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/hermesbus/hermes/internal/registry"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// The web view shows the contract version a call ran under and what the contract refused — a
// bad argument, an answer outside the contract — and never the refused answer itself.
func TestBrowserShowsContracts(t *testing.T) {
	long(t, "browser")
	s, _, b, _ := browserScenario(t)
	seed, err := os.ReadFile(seedPath("contract-order-query.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// Only orders just created keep this version: the demo's older orders break it.
	doc := strings.Replace(string(seed), "enum: [created, paid, shipped, delivered, cancelled]", "enum: [created]", 1)
	c, err := registry.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	_, admin := s.connect()
	if _, _, err := registry.NewStore(admin.Contracts).Register(context.Background(), c, []byte(doc), "test"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the contract in use", func() bool {
		r := s.route(request(fmt.Sprintf("ui_probe_%d", time.Now().UnixNano()), "", call("c", "order_query", map[string]any{"order_id": "x"})))
		return result(t, r, "c").ErrorCode == protocol.CodeBadArguments
	})
	const session = "sess_ui_contract"
	b.do("open the session", chromedp.Navigate(b.base+"/#session="+session))
	b.waitJS("connected", `document.getElementById('conn').dataset.state === 'live'`)
	s.route(map[string]any{"request_id": "req_ui_c1", "session_id": session, "intent": "订单到哪了",
		"tool_calls": []map[string]any{
			call("bad", "order_query", map[string]any{"order_id": "ORD-20260312-0042"}),
			call("broken", "order_query", map[string]any{"order_id": "ORD202603120042"}),
		}})
	b.waitJS("the bad argument", jsCallError("req_ui_c1", "bad")+`.includes('BAD_ARGUMENTS') && `+
		jsCallError("req_ui_c1", "bad")+`.includes('order_id: does not match ^ORD[0-9]{12}$')`)
	b.waitJS("the broken answer", jsCallError("req_ui_c1", "broken")+`.includes('CONTRACT_VIOLATION') && `+
		jsCallError("req_ui_c1", "broken")+`.includes('success.status')`)
	b.waitJS("the contract's version", jsCall("req_ui_c1", "broken")+`.textContent.includes('contract v1')`)
	b.clickLive("open the broken call", `.req[data-request="req_ui_c1"] .wf-row.call[data-call="broken"]`)
	b.waitJS("its messages", `(() => { const d = document.getElementById('detail'); const t = d.textContent;
		return !d.hidden && t.includes('tool_result.v1') && t.includes('withheld'); })()`)
	if got := evalJS[string](b, `document.getElementById('detail').textContent`); strings.Contains(got, "delivered_at") || strings.Contains(got, "carrier_zh") {
		t.Errorf("the refused answer reached the page: %.400s", got)
	}
	b.screenshot("contracts")
}
