package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// The web UI in headless Chromium against the in-process system. The browser reaches the
// gateway through cutProxy, so a test can cut every connection (the page's event stream
// included) and restart the gateway behind the same address.
//
// Chromium is found at $HERMES_CHROMIUM, /usr/bin/chromium or on the PATH; without it the
// tests skip, unless CI=true, where they fail. With HERMES_UI_SCREENSHOTS=DIR they leave
// screenshots of the page in DIR.

// browserWait bounds every wait for the page to show something.
const browserWait = 20 * time.Second

// browser is one headless Chromium with one tab.
type browser struct {
	t    *testing.T
	ctx  context.Context
	base string // the page's origin

	mu       sync.Mutex
	problems []string // exceptions and security errors the page reported
}

// chromiumPath finds Chromium: $HERMES_CHROMIUM when set (and only there), else
// /usr/bin/chromium or the PATH.
func chromiumPath(t *testing.T) string {
	t.Helper()
	candidates := []string{"/usr/bin/chromium"}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			candidates = append(candidates, p)
		}
	}
	if p := os.Getenv("HERMES_CHROMIUM"); p != "" {
		candidates = []string{p}
	}
	for _, p := range candidates {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no Chromium found (set HERMES_CHROMIUM, or apt-get install chromium); CI=true, so this fails instead of skipping")
	}
	t.Skip("no Chromium found (set HERMES_CHROMIUM, or apt-get install chromium)")
	return ""
}

// newBrowser starts the Chromium at path with a fresh profile, its tab on base; it is closed
// when the test ends.
func newBrowser(t *testing.T, path, base string) *browser {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1440, 900),
	}
	var (
		ctx                    context.Context
		cancelAlloc, cancelTab context.CancelFunc
		started                = time.Now()
	)
	for try := 1; ; try++ {
		var actx context.Context
		actx, cancelAlloc = chromedp.NewExecAllocator(context.Background(), opts...)
		ctx, cancelTab = chromedp.NewContext(actx)
		err := chromedp.Do(ctx)
		if err == nil {
			break
		}
		cancelTab()
		cancelAlloc()
		if try == 3 {
			t.Fatalf("start %s: %v", path, err)
		}
		// Chromium now and then crashes as it starts on a loaded machine: started again.
		t.Logf("start %s (try %d): %v", path, try, err)
	}
	b := &browser{t: t, ctx: ctx, base: base}
	var watched sync.WaitGroup
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
		watched.Wait()
	})
	t.Logf("browser: %s started in %s", path, time.Since(started).Round(time.Millisecond))
	console := chromedp.Console(ctx)
	watched.Add(1)
	go func() {
		defer watched.Done()
		for m, err := range console {
			if err != nil {
				return
			}
			if m.IsException() || strings.Contains(m.Text, "Content Security Policy") || strings.Contains(m.Text, "Content-Security-Policy") {
				b.mu.Lock()
				b.problems = append(b.problems, m.String())
				b.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, p := range b.problems {
			t.Errorf("the page reported: %s", p)
		}
	})
	return b
}

// do runs steps, failing the test with the page's text when one fails.
func (b *browser) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, browserWait+10*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.t.Fatalf("%s: %v\npage:\n%s", what, err, b.pageText())
	}
}

// waitJS waits until the JavaScript expression is truthy.
func (b *browser) waitJS(what, expr string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, browserWait+5*time.Second)
	defer cancel()
	var err error
	for end := time.Now().Add(browserWait); ; {
		_, err = chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr,
			chromedp.WithPollingTimeout(time.Until(end)), chromedp.WithPollingInterval(25*time.Millisecond)))
		// A page that navigated while it was polled (a sign-in reloads it) is polled again.
		if err == nil || !strings.Contains(err.Error(), "Cannot find context with specified id") || time.Now().After(end) {
			break
		}
	}
	if err != nil {
		b.t.Fatalf("waiting for %s: %v\npage:\n%s", what, err, b.pageText())
	}
}

// clickLive clicks the element selector names in the page itself, as soon as there is one: a
// live view may replace the node between a lookup and a click made from outside the page.
func (b *browser) clickLive(what, selector string) {
	b.t.Helper()
	b.live(what, selector, `e.click();`)
}

// typeLive gives the input selector names text in the page itself, with the input event a
// keystroke fires, for the reason clickLive clicks there: a value set on a node the view has
// just replaced would land on no input anyone sees.
func (b *browser) typeLive(what, selector, text string) {
	b.t.Helper()
	val, _ := json.Marshal(text)
	b.live(what, selector, `e.value = `+string(val)+`; e.dispatchEvent(new Event('input', {bubbles: true}));`)
}

// live runs act, JavaScript on the element e that selector names, in the page as soon as
// there is one, in the same turn as the lookup.
func (b *browser) live(what, selector, act string) {
	b.t.Helper()
	sel, _ := json.Marshal(selector)
	b.waitJS(what, `(() => { const e = document.querySelector(`+string(sel)+`); if (!e) return false; `+act+` return true; })()`)
}

func evalJS[T any](b *browser, expr string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

func (b *browser) pageText() string {
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
	if err != nil {
		return "(page text unavailable: " + err.Error() + ")"
	}
	return s
}

// screenshot saves the page to $HERMES_UI_SCREENSHOTS/hermes-ui-name.png, when set.
func (b *browser) screenshot(name string) {
	b.t.Helper()
	dir := os.Getenv("HERMES_UI_SCREENSHOTS")
	if dir == "" {
		return
	}
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot: %v", err)
	}
	p := filepath.Join(dir, "hermes-ui-"+name+".png")
	if err := os.WriteFile(p, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("screenshot: %s", p)
}

// JavaScript expressions reading the page.

func jsReq(requestID string) string {
	return fmt.Sprintf(`document.querySelector('.req[data-request=%q]')`, requestID)
}

func jsReqStatus(requestID string) string {
	return fmt.Sprintf(`(%s || {dataset: {}}).dataset.status`, jsReq(requestID))
}

func jsCall(requestID, callID string) string {
	return fmt.Sprintf(`(%s || document.createElement('div')).querySelector('.wf-row.call[data-call=%q]')`, jsReq(requestID), callID)
}

func jsCallStatus(requestID, callID string) string {
	return fmt.Sprintf(`(%s || {dataset: {}}).dataset.status`, jsCall(requestID, callID))
}

// jsCallError is the text of the error line under a failed call.
func jsCallError(requestID, callID string) string {
	return fmt.Sprintf(`((%s || document.createElement('div')).querySelector('.wf-err[data-call=%q]') || {}).textContent || ""`, jsReq(requestID), callID)
}

// browserScenario starts a system, a cutting proxy in front of its gateway and a browser that
// reaches the gateway through it; began is when the scenario started.
func browserScenario(t *testing.T) (*system, *cutProxy, *browser, time.Time) {
	chromium := chromiumPath(t)
	began := time.Now()
	s := start(t, options{workers: 1})
	proxy := newCutProxy(t, frontAddr(s))
	return s, proxy, newBrowser(t, chromium, proxy.url()), began
}

func TestBrowserSendAndWatch(t *testing.T) {
	long(t, "browser")
	s, _, b, began := browserScenario(t)
	const session = "sess_ui"

	b.do("open the page", chromedp.Navigate(b.base+"/"))
	b.waitJS("the empty state", `!document.getElementById('empty').hidden`)

	// Send a request from the form: one call that succeeds, one that fails on every try.
	b.do("fill the form",
		chromedp.Click(chromedp.CSS("#new-request")),
		chromedp.WaitVisible(chromedp.CSS("#send-form")),
		chromedp.SetValue(chromedp.CSS("#f-session"), session),
		chromedp.SetValue(chromedp.CSS("#f-request"), "req_ui_1"),
		chromedp.SendKeys(chromedp.CSS("#f-intent"), "look up my policy"),
		chromedp.SetValue(chromedp.CSS("#f-calls .call-form:nth-child(1) .c-args"), `{"message":"hello, hermes"}`),
		chromedp.Click(chromedp.CSS("#f-add-call")),
		chromedp.SetValue(chromedp.CSS("#f-calls .call-form:nth-child(2) .c-name"), "echo"),
		chromedp.SetValue(chromedp.CSS("#f-calls .call-form:nth-child(2) .c-args"), `{"status":500}`),
		chromedp.Click(chromedp.CSS("#f-submit")),
	)
	b.waitJS("the session in the URL", fmt.Sprintf(`location.hash === '#session=%s'`, session))
	b.waitJS("call_1 ok", jsCallStatus("req_ui_1", "call_1")+` === 'ok'`)
	b.waitJS("call_2 failed", jsCallStatus("req_ui_1", "call_2")+` === 'error'`)
	b.waitJS("the response", jsReqStatus("req_ui_1")+` === 'partial_success'`)
	b.waitJS("call_2's error code", jsCallError("req_ui_1", "call_2")+`.includes('TOOL_HTTP_5XX')`)
	b.waitJS("call_2's three tries", jsCall("req_ui_1", "call_2")+`.dataset.attempts === '3'`)
	b.waitJS("a tick for each try of call_2", jsCall("req_ui_1", "call_2")+`.querySelectorAll('.tick').length === 3`)
	b.waitJS("the form's answer", `document.getElementById('send-result').textContent.includes('partial success')`)
	if got := evalJS[string](b, jsCall("req_ui_1", "call_2")+`.textContent`); !strings.Contains(got, "failed") || !strings.Contains(got, "2 retries") {
		t.Errorf("call_2 row = %q; want it to say failed and 2 retries in words", got)
	}

	// A request sent by someone else appears live; its intent is shown as text, never markup.
	hostile := `<img src=x onerror="window.__pwned=1"><b>bold</b>`
	status, _, body := s.post(map[string]any{"request_id": "req_ui_2", "session_id": session, "intent": hostile,
		"tool_calls": []map[string]any{call("c1", "fax_send", map[string]any{})}}, "")
	if status != 200 {
		t.Fatalf("POST: %d %s", status, body)
	}
	b.waitJS("req_ui_2 failed", jsReqStatus("req_ui_2")+` === 'failed'`)
	b.waitJS("NO_ROUTE shown", jsCallError("req_ui_2", "c1")+`.includes('NO_ROUTE')`)
	if got := evalJS[string](b, jsReq("req_ui_2")+`.querySelector('.intent').textContent`); got != hostile {
		t.Errorf("intent shown as %q, want the text %q", got, hostile)
	}
	if n := evalJS[int](b, `document.querySelectorAll('#requests img, #requests .intent b').length + (window.__pwned ? 100 : 0)`); n != 0 {
		t.Errorf("bus data became markup (%d)", n)
	}

	// The full JSON of a call's messages.
	b.clickLive("open call_2", `.req[data-request="req_ui_1"] .wf-row.call[data-call="call_2"]`)
	b.waitJS("call_2's messages", `(() => { const d = document.getElementById('detail'); const t = d.textContent;
		return !d.hidden && t.includes('tool_call.v1') && t.includes('tool_started.v1') && t.includes('tool_result.v1') && t.includes('"error_code": "TOOL_HTTP_5XX"'); })()`)
	b.screenshot("session")

	// A request the gateway refuses shows its JSON error, naming the field.
	b.do("send a bad request",
		chromedp.SetValue(chromedp.CSS("#f-request"), "req ui bad"),
		chromedp.Click(chromedp.CSS("#f-submit")),
	)
	b.waitJS("the 400", `(() => { const r = document.getElementById('send-result'); return r.classList.contains('bad') &&
		r.textContent.includes('HTTP 400') && r.textContent.includes('INVALID_REQUEST') && r.textContent.includes('request_id'); })()`)
	b.waitJS("the field marked", `document.getElementById('f-request').getAttribute('aria-invalid') === 'true'`)
	b.screenshot("form-error")

	// After a reload the history is still there, once each.
	b.do("reload", chromedp.Reload())
	b.waitJS("req_ui_1 after reload", jsReqStatus("req_ui_1")+` === 'partial_success'`)
	b.waitJS("req_ui_2 after reload", jsReqStatus("req_ui_2")+` === 'failed'`)
	b.waitJS("call_2 failed after reload", jsCallError("req_ui_1", "call_2")+`.includes('TOOL_HTTP_5XX')`)
	if n := evalJS[int](b, `document.querySelectorAll('#requests .req').length`); n != 2 {
		t.Errorf("%d request blocks after reload, want 2", n)
	}
	b.waitJS("the session listed", fmt.Sprintf(`!!document.querySelector('.session-item[data-session=%q]')`, session))

	// Another session shows up in the list; clicking it opens it.
	s.route(map[string]any{"request_id": "req_other_1", "session_id": "sess_other", "intent": "x",
		"tool_calls": []map[string]any{call("c1", "echo", map[string]any{"n": 1})}})
	b.waitJS("sess_other listed first", `(document.querySelector('.session-item') || {dataset: {}}).dataset.session === 'sess_other'`)
	b.clickLive("open sess_other", `.session-item[data-session="sess_other"]`)
	b.waitJS("sess_other open", `location.hash === '#session=sess_other' && `+jsReqStatus("req_other_1")+` === 'success'`)
	b.do("back", chromedp.NavigateBack())
	b.waitJS("back in sess_ui", jsReqStatus("req_ui_1")+` === 'partial_success' && !`+jsReq("req_other_1"))

	// A call in flight is drawn as running and grows until its result.
	if status, _, body := s.post(map[string]any{"request_id": "req_ui_3", "session_id": session, "intent": "slow",
		"tool_calls": []map[string]any{call("slow", "echo", map[string]any{"delay_ms": 1500}), call("fast", "echo", map[string]any{})}},
		"?timeout=50ms"); status != 504 {
		t.Fatalf("POST: %d %s; want 504 while the slow call runs", status, body)
	}
	b.waitJS("the slow call running", jsCallStatus("req_ui_3", "slow")+` === 'running' && `+jsReqStatus("req_ui_3")+` === 'pending'`)
	b.screenshot("running")
	b.waitJS("the slow call done", jsCallStatus("req_ui_3", "slow")+` === 'ok' && `+jsReqStatus("req_ui_3")+` === 'success'`)

	// A request cancelled while it runs shows who cancelled it, and its call as CANCELLED.
	if status, _, body := s.post(map[string]any{"request_id": "req_ui_4", "session_id": session, "intent": "cancel me",
		"tool_calls": []map[string]any{call("long", "echo", map[string]any{"delay_ms": 60_000})}}, "?timeout=50ms"); status != 504 {
		t.Fatalf("POST: %d %s; want 504 while the call runs", status, body)
	}
	b.waitJS("the long call running", jsCallStatus("req_ui_4", "long")+` === 'running'`)
	if status, _, body := s.deleteRequest("req_ui_4", "?reason=changed+my+mind"); status != 200 {
		t.Fatalf("DELETE: %d %s", status, body)
	}
	b.waitJS("the cancelled call", jsCallError("req_ui_4", "long")+`.includes('CANCELLED')`)
	b.waitJS("who cancelled", jsReq("req_ui_4")+`.textContent.includes('Cancelled: cancelled by http 127.0.0.1:') && `+
		jsReq("req_ui_4")+`.textContent.includes('changed my mind')`)
	b.screenshot("cancelled")
	if os.Getenv("HERMES_UI_SCREENSHOTS") != "" {
		b.do("a laptop's screen", chromedp.EmulateViewport(1366, 768))
		b.screenshot("laptop")
	}
	t.Logf("browser scenario took %s", time.Since(began).Round(time.Millisecond))
}

func TestBrowserCatchesUpAfterDisconnect(t *testing.T) {
	long(t, "browser")
	s, proxy, b, began := browserScenario(t)
	const session = "sess_live"
	echo := func(id string, args map[string]any) map[string]any {
		return map[string]any{"request_id": id, "session_id": session, "intent": "live",
			"tool_calls": []map[string]any{call("c1", "echo", args)}}
	}

	b.do("open the session", chromedp.Navigate(b.base+"/#session="+session))
	b.waitJS("connected", `document.getElementById('conn').dataset.state === 'live'`)
	s.route(echo("req_live_1", map[string]any{"n": 1}))
	b.waitJS("req_live_1", jsReqStatus("req_live_1")+` === 'success'`)

	// Every connection cut and the gateway restarted: messages sent meanwhile are caught up.
	proxy.cut()
	b.waitJS("the page notices", `document.getElementById('conn').dataset.state !== 'live'`)
	s.restartGateway("gateway-2")
	s.route(echo("req_live_2", map[string]any{"n": 2}))
	if status, _, body := s.post(echo("req_live_3", map[string]any{"status": 500}), ""); status != 200 {
		t.Fatalf("POST: %d %s", status, body)
	}
	b.screenshot("disconnected")
	if evalJS[bool](b, jsReq("req_live_2")+` !== null`) {
		t.Fatal("req_live_2 shown while every connection was cut")
	}
	cut := time.Now()
	proxy.resume(frontAddr(s))
	b.waitJS("req_live_2 caught up", jsReqStatus("req_live_2")+` === 'success'`)
	b.waitJS("req_live_3 caught up", jsReqStatus("req_live_3")+` === 'failed' && `+jsCallError("req_live_3", "c1")+`.includes('TOOL_HTTP_5XX')`)
	b.waitJS("live again", `document.getElementById('conn').dataset.state === 'live'`)
	t.Logf("caught up %s after the connections were allowed again", time.Since(cut).Round(time.Millisecond))

	// The gateway refusing the event stream (the browser then gives up by itself): the page
	// says why, keeps asking, and catches up from the last message it had.
	refusal := `{"error":{"code":"BUS_UNAVAILABLE","message":"the gateway is not connected to NATS (reconnecting); retry"}}`
	proxy.cutWith(fmt.Sprintf("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"+
		"Content-Length: %d\r\nConnection: close\r\n\r\n%s", len(refusal), refusal))
	b.waitJS("the refusal shown", `(() => { const e = document.getElementById('session-error');
		return !e.hidden && e.textContent.includes('HTTP 503 BUS_UNAVAILABLE') && document.getElementById('conn').dataset.state === 'offline'; })()`)
	b.screenshot("refused")
	s.route(echo("req_live_4", map[string]any{"n": 4}))
	cut = time.Now()
	proxy.resume(frontAddr(s))
	b.waitJS("req_live_4 caught up", jsReqStatus("req_live_4")+` === 'success' && document.getElementById('conn').dataset.state === 'live'`)
	b.waitJS("the refusal gone", `document.getElementById('session-error').hidden`)
	t.Logf("caught up %s after the gateway answered again", time.Since(cut).Round(time.Millisecond))

	// Nothing missing and nothing twice: the page holds exactly the session's record.
	want := 0
	for _, m := range s.stored() {
		if strings.HasSuffix(m.Subject, "."+session) {
			want++
		}
	}
	b.waitJS(fmt.Sprintf("all %d messages of the session", want), fmt.Sprintf(`document.getElementById('log-count').textContent === '%d'`, want))
	if n := evalJS[int](b, `document.querySelectorAll('#requests .req').length`); n != 4 {
		t.Errorf("%d request blocks, want 4", n)
	}
	if n := evalJS[int](b, `new Set([...document.querySelectorAll('#log-list .log-item span:first-child')].map(e => e.textContent)).size`); n != want {
		t.Errorf("%d distinct messages in the log, want %d", n, want)
	}
	b.screenshot("caught-up")
	t.Logf("browser scenario took %s", time.Since(began).Round(time.Millisecond))
}

// cutProxy forwards TCP connections to a target and can cut them all at once, as a network
// failure or a gateway restart would.
type cutProxy struct {
	ln net.Listener
	wg sync.WaitGroup

	mu      sync.Mutex
	target  string
	paused  bool
	refusal string // while paused: the HTTP answer to each new connection; "" closes it
	conns   map[net.Conn]struct{}
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target, conns: make(map[net.Conn]struct{})}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *cutProxy) url() string { return "http://" + p.ln.Addr().String() }

// cut closes every connection and closes new ones at once until resume, as a network failure
// would.
func (p *cutProxy) cut() { p.cutWith("") }

// cutWith closes every connection and answers each new one with the HTTP response answer
// until resume, as a gateway refusing requests would.
func (p *cutProxy) cutWith(answer string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused, p.refusal = true, answer
	for c := range p.conns {
		_ = c.Close()
	}
}

// resume forwards new connections to target.
func (p *cutProxy) resume(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused, p.target = false, target
}

// refuse reads one request from c and answers it.
func (p *cutProxy) refuse(c net.Conn, answer string) {
	defer p.wg.Done()
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
		return
	}
	_, _ = io.WriteString(c, answer)
}

func (p *cutProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		target, paused, refusal := p.target, p.paused, p.refusal
		if !paused {
			p.conns[c] = struct{}{}
		}
		p.mu.Unlock()
		if paused {
			if refusal == "" {
				_ = c.Close()
				continue
			}
			p.wg.Add(1)
			go p.refuse(c, refusal)
			continue
		}
		p.wg.Add(1)
		go p.pipe(c, target)
	}
}

func (p *cutProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *cutProxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
		_ = c.Close()
	}
}

// pipe copies between c and a new connection to target until either side ends or is cut.
func (p *cutProxy) pipe(c net.Conn, target string) {
	defer p.wg.Done()
	up, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		p.untrack(c)
		return
	}
	if !p.track(up) {
		p.untrack(c, up)
		return
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
	p.untrack(c, up) // ends the other copy
	<-done
}

// frontAddr is where the proxy forwards: the gateway.
func frontAddr(s *system) string { return strings.TrimPrefix(s.base, "http://") }
