package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/memory"
	"github.com/hermesbus/hermes/internal/scriptedllm"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// The seed's sentences through hermes up's system — gateway, router, demo tools, the built-in
// scripted model and hermes up's memory configuration (the seed's two files) — with /v1/chat:
// a preference kept forever fills a later call of another session, a store's location is
// reused in the same session, small talk is kept out, and the record holds the history and
// which fragments each turn was given.
func TestChatRemembersThroughTheBus(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../examples/memory.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := memory.LoadConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	cs := startChat(t, "chat-memory", scriptedllm.Meeting(), func(cc *app.ChatConfig) { cc.Memory = cfg })
	say := func(session, message string) map[string]any {
		t.Helper()
		body, _ := json.Marshal(map[string]string{"session_id": session, "message": message})
		code, out := cs.postJSON(t, "/v1/chat", string(body))
		if code != http.StatusOK {
			t.Fatalf("%s: %d %v", message, code, out)
		}
		return out
	}
	out := say("mem_s1", "以后都发顺丰")
	if in, _ := out["intent"].(map[string]any); in["domain"] != "transaction" || in["ttl_seconds"] != float64(7200) {
		t.Fatalf("the intent: %v", out["intent"])
	}
	say("mem_s2", "寄个样品")
	text, _ := cs.transcript(t, "mem_s2")
	if !strings.Contains(text, "-> sample_send") || !strings.Contains(text, `"shipping_carrier":"SF-Express"`) {
		t.Fatalf("the sample's call:\n%s", text)
	}
	say("mem_s3", "帮我查北京朝阳区三里屯店的库存")
	say("mem_s3", "再查一下国贸店")
	text, entries := cs.transcript(t, "mem_s3")
	if !strings.Contains(text, `args={"city":"北京","district":"朝阳区","store":"国贸店"}`) {
		t.Fatalf("the second store's query:\n%s", text)
	}
	var given []string
	for _, d := range decisionsOf(entries) {
		for _, m := range d.Memory {
			given = append(given, m.Key)
		}
	}
	if !strings.Contains(strings.Join(given, ","), "location_context") {
		t.Fatalf("no decision says the location was given: %v", given)
	}
	out = say("mem_s4", "好的谢谢")
	if out["text"] != "不客气！" {
		t.Fatalf("small talk: %v", out)
	}
	out = say("mem_s5", "那个东西怎么样了")
	if in, _ := out["intent"].(map[string]any); in["clarify"] != true || !strings.Contains(out["text"].(string), "哪个") {
		t.Fatalf("a vague message: %v", out)
	}
	req, _ := http.NewRequest("GET", cs.sys.GatewayURL+"/v1/memory", nil)
	req.Header.Set("Authorization", "Bearer "+cs.sys.Key.Key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Owner     string `json:"owner"`
		Fragments []struct {
			Key string `json:"key"`
		} `json:"fragments"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	var keys []string
	for _, f := range list.Fragments {
		keys = append(keys, f.Key)
	}
	if got := strings.Join(keys, ","); !strings.Contains(got, "default_shipping") || !strings.Contains(got, "location_context") || strings.Contains(got, "thanks") {
		t.Fatalf("what is kept: %s", got)
	}
	history, hist := cs.transcript(t, memory.HistorySession(list.Owner))
	if count(hist, protocol.TypeMemory) < 3 || !strings.Contains(history, "replaced location_context/location_context v2") {
		t.Fatalf("the memory's history:\n%s", history)
	}

	// memory_write goes under its tool policy like any tool: what it cannot honour is refused
	// when applied, naming the field; a rate limit is counted, and a write over it refused.
	apply := func(yaml string) (int, map[string]any) {
		t.Helper()
		return cs.postJSON(t, "/api/v1/policies", yaml, "Content-Type", "application/yaml")
	}
	if code, out := apply("policies:\n  memory_write: {confirm_required: true}\n"); code != http.StatusBadRequest ||
		!strings.Contains(fmt.Sprint(out), "policies.memory_write.confirm_required") {
		t.Fatalf("confirm_required on memory_write: %d %v", code, out)
	}
	if code, out := apply("policies:\n  memory_write: {rate_limit: 1/h, on_limit: refuse}\n"); code != http.StatusCreated {
		t.Fatalf("a rate limit on memory_write: %d %v", code, out)
	}
	limited := func(out map[string]any) bool {
		calls, _ := out["tool_calls"].([]any)
		for _, c := range calls {
			if c := c.(map[string]any); c["name"] == "memory_write" && c["error_code"] == protocol.CodeRateLimited {
				return true
			}
		}
		return false
	}
	n := 0
	waitFor(t, "a memory_write over its rate limit refused", func() bool {
		n++
		return limited(say(fmt.Sprintf("mem_limited_%d", n), "以后都发顺丰"))
	})
	if n < 2 {
		t.Fatalf("the first write under a limit of 1/h was refused")
	}
}
