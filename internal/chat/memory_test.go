package chat

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hermesbus/hermes/internal/memory"
	"github.com/hermesbus/hermes/internal/scriptedllm"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// memoryScript is the scripted model of seed 003's sentences: it writes what the person says
// is worth keeping with memory_write, and uses what the prompt remembers (if_system_contains)
// where it would otherwise have to ask.
const memoryScript = `
intents:
  - {contains: 以后都发顺丰, domain: transaction, confidence: 0.93}
  - {contains: 发票开个人, domain: transaction, confidence: 0.9}
  - {contains: 库存, domain: consultation, confidence: 0.9}
  - {contains: 国贸店, domain: consultation, confidence: 0.86}
  - {contains: 好的谢谢, domain: chitchat, confidence: 0.97}
  - {contains: 寄个样品, domain: transaction, confidence: 0.88}
  - {contains: 订单, domain: transaction, confidence: 0.91}
  - {contains: 售后, domain: transaction, confidence: 0.84}
  - {contains: 天气真好, domain: chitchat, confidence: 0.95}
  - {contains: 刚才, domain: chitchat, confidence: 0.8}
  - {contains: 那个东西, domain: other, confidence: 0.3}
conversations:
  - match: 以后都发顺丰
    turns:
      - tool_calls: [{name: memory_write, arguments: {type: user_preference, key: default_shipping, value: SF-Express, lifespan: forever}}]
      - content: 好的，以后都用顺丰发货。
  - match: 发票开个人
    turns:
      - tool_calls: [{name: memory_write, arguments: {type: user_preference, key: invoice_type, value: personal, lifespan: 30d}}]
      - content: 好的，发票开个人。
  - match: 三里屯店的库存
    turns:
      - tool_calls:
          - {name: memory_write, arguments: {type: location_context, key: location_context, value: {city: 北京, district: 朝阳区, store: 三里屯店}, lifespan: session, semantic_tag: [inventory_query]}}
          - {name: inventory_query, arguments: {city: 北京, district: 朝阳区, store: 三里屯店}}
      # The follow-up ("再查一下国贸店"), at whatever step the door's history puts it: its
      # answer once the second store's stock is back…
      - any_step: true
        if_last_user_contains: 国贸店
        if_last_tool_contains: 国贸店
        content: 国贸店的库存查好了。
      # …the query, the city and district taken from what the prompt remembers…
      - any_step: true
        if_last_user_contains: 国贸店
        if_system_contains: 三里屯店
        tool_calls:
          - {name: memory_write, arguments: {type: location_context, key: location_context, value: {city: 北京, district: 朝阳区, store: 国贸店}, lifespan: session, semantic_tag: [inventory_query]}}
          - {name: inventory_query, arguments: {city: 北京, district: 朝阳区, store: 国贸店}}
      # …or, remembering nothing, a question.
      - any_step: true
        if_last_user_contains: 国贸店
        content: 请问是哪个城市的国贸店？
      - step: 1
        content: 三里屯店的库存查好了。
  - match: 好的谢谢
    turns:
      - tool_calls: [{name: memory_write, arguments: {type: chitchat, key: thanks, value: 好的谢谢, lifespan: 30d}}]
      - content: 不客气！
  - match: 寄个样品
    turns:
      - if_system_contains: SF-Express
        tool_calls: [{name: sample_send, arguments: {shipping_carrier: SF-Express}}]
      - step: 0
        content: 请问用哪家快递？
      - step: 1
        content: 样品已用顺丰寄出。
  - match: 订单 order_123
    turns:
      - tool_calls: [{name: memory_write, arguments: {type: order_context, key: current_order, value: order_123, lifespan: session}}]
      - if_last_user_contains: 售后
        if_system_contains: order_123
        content: 订单 order_123 的售后请在订单页申请。
      - step: 1
        if_last_user_contains: 售后
        content: 请问是哪个订单？
      - step: 1
        content: 订单 order_123 已发货。
  - match: 天气真好
    turns:
      - tool_calls: [{name: memory_write, arguments: {type: chitchat_context, key: small_talk, value: 天气, lifespan: session}}]
      - if_last_user_contains: 刚才
        if_system_contains: small_talk
        content: 我们刚才在聊天气。
      - step: 1
        if_last_user_contains: 刚才
        content: 我们刚才没有在聊什么。
      - step: 1
        content: 是啊，适合出门。
  - match: 那个东西
    turns:
      - content: 您说的是哪个东西？是订单、发票还是别的？
`

// The seed's tools the script calls.
const (
	inventoryContract = `{"name":"inventory_query","description":"a store's stock","input_schema":{"type":"object","properties":{"city":{"type":"string"},"district":{"type":"string"},"store":{"type":"string"}},"required":["store"]}}`
	sampleContract    = `{"name":"sample_send","description":"send a sample","input_schema":{"type":"object","properties":{"shipping_carrier":{"type":"string"},"sku":{"type":"string"}},"required":["shipping_carrier"]}}`
)

// seedMemoryConfig is the seed's two files, loaded unchanged.
func seedMemoryConfig(t *testing.T) *memory.Config {
	t.Helper()
	_, here, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(here), "..", "..")
	var data []byte
	for _, name := range []string{"memory-config.yaml", "intent-decay.yaml"} {
		var b []byte
		var err error
		for _, p := range []string{filepath.Join(root, "..", "shared", "seed-examples", name), filepath.Join(root, "test", "integration", "testdata", "seed-examples", name)} {
			if b, err = os.ReadFile(p); err == nil {
				break
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		data = append(append(data, b...), '\n')
	}
	c, err := memory.LoadConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// opsLog keeps the memory history a store records, as "op key".
type opsLog struct {
	mu  sync.Mutex
	ops []string
}

func (o *opsLog) Record(_ context.Context, _ string, ev *protocol.MemoryEvent) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ops = append(o.ops, ev.Op+" "+ev.Key)
	return nil
}

func (o *opsLog) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return strings.Join(o.ops, ", ")
}

// memoryClock is a clock the test moves.
type memoryClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *memoryClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *memoryClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// The seed's sentences, end to end through the OpenAI door with the scripted model: what is
// worth keeping is kept for as long as it says, what the filters refuse is not, and a later
// turn uses what was kept instead of asking. Then intent decay on a moved clock: a
// transaction's context is there 20 minutes later, small talk's is archived after 6.
func TestTheSeedsSentencesAreRememberedAndUsed(t *testing.T) {
	script, err := scriptedllm.Parse([]byte(memoryScript))
	if err != nil {
		t.Fatal(err)
	}
	b := bustest.NewServer(t).Provision(t, bus.Config{Buckets: memory.Buckets(0)})
	clock := &memoryClock{now: time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)}
	ops := &opsLog{}
	cfg := seedMemoryConfig(t)
	store := &memory.Store{KV: b.Bucket(memory.Bucket), JS: b.JS, History: ops, Now: clock.Now, Decay: cfg.Intent.Durations()}
	h := newHarness(t, script, func(_ *Config, env *Env) { env.Memory, env.MemoryConfig = store, cfg })
	h.contracts.tools = []*contract.Compiled{compiled(t, inventoryContract), compiled(t, sampleContract)}
	ctx := context.Background()
	owner := memory.Anonymous

	var transcript []string
	say := func(session string, history []string, text string) (string, *protocol.LLMDecision) {
		t.Helper()
		var msgs []map[string]string
		for i, m := range history {
			role := "user"
			if i%2 == 1 {
				role = "assistant"
			}
			msgs = append(msgs, map[string]string{"role": role, "content": m})
		}
		msgs = append(msgs, map[string]string{"role": "user", "content": text})
		body, _ := json.Marshal(map[string]any{"model": "scripted", "messages": msgs})
		before := len(h.pub.published())
		r := h.post("/v1/chat/completions", string(body), headerSession, session)
		if r.code != 200 {
			t.Fatalf("%s: %d %s", text, r.code, r.body)
		}
		var out struct {
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(r.body, &out); err != nil || len(out.Choices) == 0 {
			t.Fatalf("%s: %s", text, r.body)
		}
		answer := out.Choices[0].Message.Content
		d := h.pub.published()[before]
		line := fmt.Sprintf("[%s] %s → %s", session, text, answer)
		if d.Intent != nil {
			line += fmt.Sprintf("  (intent %s %.2f", d.Intent.Domain, d.Intent.Confidence)
			if d.Intent.Clarify {
				line += ", asked"
			}
			line += ")"
		}
		for _, m := range d.Memory {
			line += fmt.Sprintf("  [remembered %s v%d]", m.Key, m.Version)
		}
		transcript = append(transcript, line)
		return answer, d
	}
	get := func(session, key string) (memory.Fragment, bool) {
		f, err := store.Get(ctx, owner, session, key)
		return f, err == nil
	}

	say("s1", nil, "以后都发顺丰")
	if f, ok := get("", "default_shipping"); !ok || string(f.Value) != `"SF-Express"` || f.Lifespan != "forever" || f.Source != "model" {
		t.Fatalf("default_shipping: %+v %v", f, ok)
	}
	say("s2", nil, "发票开个人")
	if f, ok := get("", "invoice_type"); !ok || string(f.Value) != `"personal"` || f.Lifespan != "30d" || !f.ExpiresAt.Equal(clock.Now().Add(30*24*time.Hour)) {
		t.Fatalf("invoice_type: %+v %v", f, ok)
	}
	first := "帮我查北京朝阳区三里屯店的库存"
	a1, _ := say("s3", nil, first)
	if f, ok := get("s3", "location_context"); !ok || f.Session != "s3" || !strings.Contains(string(f.Value), "三里屯店") {
		t.Fatalf("location_context: %+v %v", f, ok)
	}
	_, d := say("s3", []string{first, a1}, "再查一下国贸店")
	subs := h.sub.submitted()
	last := subs[len(subs)-1].Request.ToolCalls[0]
	var args map[string]string
	_ = json.Unmarshal(last.Arguments, &args)
	if last.Name != "inventory_query" || args["city"] != "北京" || args["district"] != "朝阳区" || args["store"] != "国贸店" {
		for _, r := range h.model.Requests() {
			t.Logf("model read: %s", systemText(r))
		}
		t.Fatalf("the second query: %s %s (%s)", last.Name, last.Arguments, transcript)
	}
	if f, _ := get("s3", "location_context"); !strings.Contains(string(f.Value), "国贸店") || f.Version != 2 {
		t.Fatalf("the location replaced: %+v", f)
	}
	if !remembered(d, "location_context") {
		t.Fatalf("the decision does not say the location was given: %+v", d.Memory)
	}
	if _, ok := get("s1", "location_context"); ok {
		t.Fatal("another session sees s3's location")
	}
	a, _ := say("s4", nil, "好的谢谢")
	if _, ok := get("", "thanks"); ok || a != "不客气！" {
		t.Fatalf("small talk was kept (%v) or the answer is %q", ok, a)
	}
	a, d = say("s5", nil, "寄个样品")
	subs = h.sub.submitted()
	last = subs[len(subs)-1].Request.ToolCalls[0]
	if a != "样品已用顺丰寄出。" || last.Name != "sample_send" || !strings.Contains(string(last.Arguments), "SF-Express") || !remembered(d, "default_shipping") {
		t.Fatalf("the sample: %q %s %s %+v", a, last.Name, last.Arguments, d.Memory)
	}
	// The prompt said what it carried is data, delimited.
	reqs := h.model.Requests()
	if sys := systemText(reqs[len(reqs)-2]); !strings.Contains(sys, "<remembered>") || !strings.Contains(sys, "not instructions") {
		t.Fatalf("the prompt's memory: %q", sys)
	}
	a, d = say("s8", nil, "那个东西怎么样了")
	if d.Intent == nil || !d.Intent.Clarify || len(d.Offered) != 0 || !strings.Contains(a, "哪个") {
		t.Fatalf("below the threshold: %q %+v offered %v", a, d.Intent, d.Offered)
	}

	// Intent decay, on a moved clock.
	q := "查一下订单 order_123 的物流"
	a6, _ := say("s6", nil, q)
	small := "今天天气真好"
	a7, _ := say("s7", nil, small)
	clock.Add(6 * time.Minute)
	a, d = say("s7", []string{small, a7}, "刚才我们聊到哪了")
	if a != "我们刚才没有在聊什么。" || remembered(d, "small_talk") {
		t.Fatalf("small talk's context 6 minutes on: %q %+v", a, d.Memory)
	}
	clock.Add(14 * time.Minute)
	a, d = say("s6", []string{q, a6}, "售后怎么申请")
	if a != "订单 order_123 的售后请在订单页申请。" || !remembered(d, "current_order") || d.Intent.LifetimeSeconds != 7200 {
		t.Fatalf("a transaction's context 20 minutes on: %q %+v %+v", a, d.Memory, d.Intent)
	}
	if err := store.Sweep(ctx, owner); err != nil {
		t.Fatal(err)
	}
	if got := ops.String(); !strings.Contains(got, "archived small_talk") || strings.Contains(got, "archived current_order") || strings.Contains(got, "thanks") {
		t.Fatalf("the memory's history: %s", got)
	}
	clock.Add(2 * time.Hour)
	if _, ok := get("s6", "current_order"); ok {
		t.Fatal("a transaction's context outlived its 2 hours")
	}
	for _, l := range transcript {
		t.Log(l)
	}
	t.Log("history: " + ops.String())
}

func remembered(d *protocol.LLMDecision, key string) bool {
	for _, m := range d.Memory {
		if m.Key == key {
			return true
		}
	}
	return false
}

func systemText(r scriptedllm.Request) string {
	var b strings.Builder
	for _, m := range r.Messages {
		if m.Role == "system" {
			b.WriteString(m.Text())
		}
	}
	return b.String()
}

// A rule draws a fragment from the person's message before the model is asked, past the
// filters; the same turn's prompt carries it.
func TestARuleRemembersWithoutTheModel(t *testing.T) {
	script, err := scriptedllm.Parse([]byte(`
conversations:
  - match: 以后都发顺丰
    turns:
      - if_system_contains: SF-Express
        content: 记下了：顺丰。
      - step: 0
        content: 好的。
`))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := memory.LoadConfig([]byte(`
memory:
  filters:
    - type: semantic
      include_tags: [user_preference]
      exclude_patterns: ["^.*[?？]$"]
  rules:
    - {pattern: "以后都发(顺丰|圆通)", type: user_preference, key: default_shipping, value: "$1", values: {顺丰: SF-Express}, lifespan: forever}
`))
	if err != nil {
		t.Fatal(err)
	}
	b := bustest.NewServer(t).Provision(t, bus.Config{Buckets: memory.Buckets(0)})
	store := &memory.Store{KV: b.Bucket(memory.Bucket), JS: b.JS}
	h := newHarness(t, script, func(_ *Config, env *Env) { env.Memory, env.MemoryConfig = store, cfg })
	h.contracts.tools = []*contract.Compiled{compiled(t, sampleContract)} // what the preference is about
	for _, msg := range []string{"以后都发顺丰吗？", "以后都发顺丰"} {
		body, _ := json.Marshal(map[string]any{"model": "scripted", "messages": []map[string]string{{"role": "user", "content": msg}}})
		r := h.post("/v1/chat/completions", string(body), headerSession, "rules")
		if r.code != 200 {
			t.Fatalf("%d %s", r.code, r.body)
		}
		f, err := store.Get(context.Background(), memory.Anonymous, "", "default_shipping")
		switch {
		case strings.HasSuffix(msg, "？") && err == nil:
			t.Fatalf("a question was remembered: %+v", f)
		case !strings.HasSuffix(msg, "？") && (err != nil || string(f.Value) != `"SF-Express"` || f.Source != "rule" || !strings.Contains(string(r.body), "记下了")):
			t.Fatalf("%+v %v %s", f, err, r.body)
		}
	}
}
