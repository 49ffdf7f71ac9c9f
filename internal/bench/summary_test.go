package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/chat"
	"github.com/hermesbus/hermes/internal/llm"
	"github.com/hermesbus/hermes/internal/record"
	"github.com/hermesbus/hermes/internal/scriptedllm"
	"github.com/hermesbus/hermes/internal/scriptedllm/scriptedllmtest"
	"github.com/hermesbus/hermes/internal/summarize"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Tokens sent to the model per turn in a long conversation through POST /v1/chat (the
// session's history read from its record), without summaries and with one every 10 messages
// (seed 001 §2.3: "halving tokens"). Each op is one conversation of 40 exchanges — a person's
// message of about 40 characters, the model's answer of about 60 — with the demo's four
// meeting tools offered each turn (their contracts: about 500 tokens of every prompt). The summary of the scripted model is the latest 400
// characters of what it condenses (a model is told: at most 200 words). With summaries, each
// next message waits until the summary due is recorded (at most 5 s): the steady state, as a
// conversation at a person's pace sees it. Reported: the mean prompt tokens per turn, the
// prompt at the 40th, and the summarizer's own tokens per turn (its prompts and answers, spread
// over the turns).

const summaryExchanges = 40

var chatter = &scriptedllm.Script{
	Conversations: []scriptedllm.Conversation{{Name: "summarize", Match: "Summarize this conversation.", Turns: []scriptedllm.Turn{{Summarize: true}}}},
	Otherwise:     &scriptedllm.Turn{Content: "好的，我已经记下了这个安排。会议室、参会人和时间都按你说的来，如果有变化请随时告诉我，我会更新日程并通知所有参会人。"},
}

func benchSummaries(b *testing.B, every int) {
	_, base := scriptedllmtest.Start(b, chatter, "")
	c, err := llm.New(llm.Config{Backend: llm.Backend{Name: "scripted", BaseURL: base, Model: "scripted"}})
	if err != nil {
		b.Fatal(err)
	}
	sys := runSystem(b, app.SystemConfig{Instance: "bench-summary", NATSListen: "127.0.0.1:0", Worker: app.WorkerConfig{Concurrency: 8},
		Chat: &app.ChatConfig{Config: chat.Config{LLM: c, Model: "scripted"}, SummarizeEvery: every}}, "echo", "{}")
	seed, err := nats.NkeyOptionFromSeed(sys.Seeds[bus.RoleAdmin])
	if err != nil {
		b.Fatal(err)
	}
	nc, err := nats.Connect(sys.ClientURL, seed)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	hc := &http.Client{}
	b.Cleanup(hc.CloseIdleConnections)
	ctx := context.Background()
	// The demo's meeting tools register their contracts once the gateway is up: from then on
	// the model is offered them, every turn alike.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		req, _ := http.NewRequest("GET", sys.GatewayURL+"/api/v1/tools/notify_send", nil)
		req.Header.Set("Authorization", "Bearer "+sys.Key.Key)
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			b.Fatal("the meeting tools never registered")
		}
	}
	prefix := fmt.Sprintf("summary%d-%d", os.Getpid(), runs.Add(1))
	var prompt, last, summarizer int64
	b.ResetTimer()
	for i := range b.N {
		session := fmt.Sprintf("%s-%d", prefix, i)
		for turn := 1; turn <= summaryExchanges; turn++ {
			msg := fmt.Sprintf("第%d件事：下周三下午两点在三楼会议室和张伟、李娜讨论项目进度，请记下来并提醒我。", turn)
			body, _ := json.Marshal(map[string]any{"session_id": session, "message": msg})
			req, _ := http.NewRequestWithContext(ctx, "POST", sys.GatewayURL+"/v1/chat", bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+sys.Key.Key)
			req.Header.Set("Content-Type", "application/json")
			resp, err := hc.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			var out struct {
				Turns int `json:"turns"`
				Usage struct {
					Prompt int64 `json:"prompt_tokens"`
				} `json:"usage"`
			}
			err = json.NewDecoder(resp.Body).Decode(&out)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK {
				b.Fatalf("turn %d: %d %v", turn, resp.StatusCode, err)
			}
			prompt += out.Usage.Prompt
			if i == 0 && (turn == 1 || turn%5 == 0) {
				b.Logf("summaries every %d messages: turn %d, %d prompt tokens (%d model turns)", every, turn, out.Usage.Prompt, out.Turns)
			}
			if turn == summaryExchanges {
				last += out.Usage.Prompt
			}
			if every > 0 && (2*turn)%every == 0 {
				b.StopTimer()
				deadline := time.Now().Add(5 * time.Second)
				for {
					s, _, err := summarize.Latest(ctx, js, session)
					if err == nil && s != nil && s.Messages == 2*turn {
						break
					}
					if time.Now().After(deadline) {
						b.Fatalf("turn %d: no summary of %d messages (latest %+v, %v)", turn, 2*turn, s, err)
					}
					time.Sleep(5 * time.Millisecond)
				}
				b.StartTimer()
			}
		}
	}
	b.StopTimer()
	for i := range b.N {
		_, err := record.Read(ctx, js, []string{protocol.SubjectEvent(protocol.EventSummary, fmt.Sprintf("%s-%d", prefix, i))}, record.Start{}, func(e *record.Entry) error {
			if s, ok := e.Payload.(*protocol.LLMSummary); ok {
				summarizer += s.Usage.Total
			}
			return nil
		})
		if err != nil && !errors.Is(err, record.ErrNoRecord) {
			b.Fatal(err)
		}
	}
	turns := float64(b.N * summaryExchanges)
	b.ReportMetric(float64(prompt)/turns, "prompt-tokens/turn")
	b.ReportMetric(float64(last)/float64(b.N), "prompt-tokens@turn40")
	b.ReportMetric(float64(summarizer)/turns, "summarizer-tokens/turn")
}

func BenchmarkSummaryTokensNone(b *testing.B)    { benchSummaries(b, 0) }
func BenchmarkSummaryTokensEvery10(b *testing.B) { benchSummaries(b, 10) }
