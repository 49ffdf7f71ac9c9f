package integration

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/hermesbus/hermes/internal/auth"
)

// With callers required, the page asks for a key, signs in, and from then on works with a
// cookie no script can read — the form's POST and the session's event stream included — showing
// who made each request and only the caller's own sessions; signing out ends it. A page on
// another origin, in the same browser, cannot make the signed-in gateway run a call.
func TestBrowserSignsIn(t *testing.T) {
	long(t, "browser")
	chromium := chromiumPath(t)
	s := start(t, options{workers: 1, callers: true})
	keys := callerKeys(t, s, map[string]auth.Role{"alice": auth.RoleUser, "bob": auth.RoleUser, "ops": auth.RoleOperator})
	if code, body := s.call("POST", "/v1/route", keys["bob"], `{"request_id":"bob_1","session_id":"sess_bob","tool_calls":[{"tool_call_id":"c","name":"echo","arguments":{}}]}`); code != 200 {
		t.Fatalf("bob: %d %s", code, body)
	}
	b := newBrowser(t, chromium, s.base)

	b.do("open the page", chromedp.Navigate(b.base+"/"))
	b.waitJS("the sign-in form", `!document.getElementById('signin').hidden && document.getElementById('layout').hidden`)
	b.do("a wrong key",
		chromedp.SetValue(chromedp.CSS("#signin-key"), "hk_aaaaaaaaaaaaaaaa_"+strings.Repeat("b", 52)),
		chromedp.Click(chromedp.CSS("#signin-submit")))
	b.waitJS("the refusal", `document.getElementById('signin-error').textContent.includes('not valid')`)
	b.do("alice's key",
		chromedp.SetValue(chromedp.CSS("#signin-key"), keys["alice"]),
		chromedp.Click(chromedp.CSS("#signin-submit")))
	b.waitJS("signed in", `!document.getElementById('layout').hidden && document.getElementById('who').textContent.includes('alice (user)')`)
	if got := evalJS[string](b, `document.cookie`); strings.Contains(got, "hermes_signin") {
		t.Errorf("a script reads the sign-in cookie: %q", got)
	}
	if got := evalJS[string](b, `document.getElementById('signin-key').value`); got != "" {
		t.Error("the key stays in the form")
	}

	b.do("send a request",
		chromedp.Click(chromedp.CSS("#new-request")),
		chromedp.WaitVisible(chromedp.CSS("#send-form")),
		chromedp.SetValue(chromedp.CSS("#f-session"), "sess_alice"),
		chromedp.SetValue(chromedp.CSS("#f-request"), "alice_1"),
		chromedp.SetValue(chromedp.CSS("#f-calls .call-form:nth-child(1) .c-args"), `{"message":"hi"}`),
		chromedp.Click(chromedp.CSS("#f-submit")))
	b.waitJS("the call, live over the event stream", jsCallStatus("alice_1", "call_1")+` === 'ok'`)
	b.waitJS("who made it", jsReq("alice_1")+`.querySelector('.req-meta').textContent.includes('by alice (user)')`)
	b.waitJS("alice's session listed", `!!document.querySelector('.session-item[data-session="sess_alice"]')`)
	if evalJS[bool](b, `!!document.querySelector('.session-item[data-session="sess_bob"]')`) {
		t.Error("bob's session is listed for alice")
	}

	// A page of another origin fires what a CORS-simple request can carry, with the browser's
	// cookies: nothing runs.
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<!doctype html><body><script>
window.done = 0;
const body = JSON.stringify({request_id: "evil_1", session_id: "sess_alice", tool_calls: [{tool_call_id: "c", name: "echo", arguments: {}}]});
Promise.allSettled([
  fetch(%[1]q + "/v1/route", {method: "POST", mode: "no-cors", credentials: "include", headers: {"Content-Type": "text/plain"}, body}),
  fetch(%[1]q + "/v1/route", {method: "POST", mode: "no-cors", credentials: "include", body: new URLSearchParams({x: body})}),
]).then(() => { window.done = 1; });
</script></body>`, s.base)
	}))
	t.Cleanup(evil.Close)
	// The page is served from 127.0.0.1 on another port: the same site as the gateway (so
	// SameSite lets the cookie go) but another origin, which the gateway refuses.
	b.do("visit the other origin", chromedp.Navigate(evil.URL+"/"))
	b.waitJS("its requests sent", `window.done === 1`)
	if code, body := s.call("GET", "/v1/requests/evil_1", keys["ops"], ""); code != http.StatusNotFound {
		t.Errorf("the other site's request was accepted: %d %s", code, body)
	}

	b.do("back to Hermes", chromedp.Navigate(b.base+"/"))
	b.waitJS("still signed in", `!document.getElementById('layout').hidden`)
	b.do("sign out", chromedp.Click(chromedp.CSS("#signout")))
	b.waitJS("the sign-in form again", `!document.getElementById('signin').hidden`)
	b.do("ask for sessions", chromedp.Evaluate[chromedp.Void](`fetch('/v1/sessions').then((r) => { window.after = r.status; })`))
	b.waitJS("401 after signing out", `window.after === 401`)
}
