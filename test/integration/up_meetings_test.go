package integration

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/examples"
	"github.com/hermesbus/hermes/internal/gateway"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// hermes up serves both kinds of tool: the HTTP demo tools and the seed's meeting tools as Go
// functions on the SDK, whose contracts it registers through its own gateway (each tried by
// the sandbox first; notify_send, with side effects, is not tried). The examples' requests
// reach them.
func TestUpServesTheGoMeetingTools(t *testing.T) {
	t.Parallel()
	sys, _ := startUp(t, "meetings-it")
	call := func(method, path, body string) (int, string) {
		req, _ := http.NewRequest(method, sys.GatewayURL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+sys.Key.Key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	tool := func(name string) (gateway.ToolView, bool) {
		code, body := call("GET", "/api/v1/tools/"+name, "")
		var v gateway.ToolView
		return v, code == http.StatusOK && json.Unmarshal([]byte(body), &v) == nil
	}
	waitFor(t, "the Go tools' contracts registered", func() bool {
		_, ok := tool("notify_send")
		return ok
	})
	for name, verdict := range map[string]string{"calendar_free_slots": "passed", "meeting_book": "passed", "notify_send": "skipped"} {
		v, ok := tool(name)
		if !ok || v.Contract == nil || v.Contract.Reach == nil || v.Contract.Reach.Kind != protocol.ActionGo ||
			!strings.Contains(string(v.Sandbox), `"verdict":"`+verdict+`"`) {
			t.Errorf("%s: %+v %s", name, v, v.Sandbox)
		}
	}
	for _, file := range []string{"request-calendar_free_slots.json", "request-meeting_book.json", "request-notify_send.json"} {
		body, _ := examples.Files.ReadFile(file)
		code, out := call("POST", "/v1/route", string(body))
		r := decodeResponse(t, []byte(out))
		if code != http.StatusOK || r.Status != protocol.StatusSuccess {
			t.Fatalf("%s: %d %s", file, code, out)
		}
		for _, res := range r.Results {
			if res.ContractVersion != 1 || !strings.HasPrefix(res.Route, "contract:") || !strings.HasPrefix(string(res.Content), `{"success":{`) {
				t.Errorf("%s: %+v %s", file, res, res.Content)
			}
		}
	}
}
