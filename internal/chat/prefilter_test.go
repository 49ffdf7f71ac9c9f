package chat

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hermesbus/hermes/internal/scriptedllm"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// answers answers every message "ok".
func answers() *scriptedllm.Script {
	return &scriptedllm.Script{Otherwise: &scriptedllm.Turn{Content: "ok"}}
}

// ask posts text as a new conversation of session and returns its first decision.
func (h *harness) ask(session, text string) *protocol.LLMDecision {
	h.t.Helper()
	before := len(h.pub.published())
	if r := h.post("/v1/chat/completions", `{"model":"scripted","messages":[{"role":"user","content":"`+text+`"}]}`, headerSession, session); r.code != http.StatusOK {
		h.t.Fatalf("%d %s", r.code, r.body)
	}
	return h.pub.published()[before]
}

// With a prefilter, the model is offered only the registered tools the message is about, and
// the decision records them; when none is, the model is told so and offered none of them.
func TestPrefilterNarrowsTheTools(t *testing.T) {
	h := newHarness(t, answers(), func(c *Config, _ *Env) { c.Prefilter = PrefilterConfig{TopK: 1} })
	d := h.ask("sess_p1", "what is the weather forecast for my city")
	offered := h.model.Requests()[0].Tools
	if !d.Prefiltered || len(d.Candidates) != 1 || d.Candidates[0].Name != "weather_search" || d.Candidates[0].Score <= 0 ||
		len(offered) != 1 || offered[0].Function.Name != "weather_search" {
		t.Errorf("decision %+v, offered %+v", d, offered)
	}
	d = h.ask("sess_p2", "zzz qqq")
	req := h.model.Requests()[1]
	if !d.Prefiltered || len(d.Candidates) != 0 || len(req.Tools) != 0 || req.Messages[len(req.Messages)-1].Text() != noCandidates {
		t.Errorf("nothing qualified, yet: %+v %+v", d, req)
	}
}

// By meaning too: with an embedding model, a message none of whose words names a tool finds
// it. The first message, while the tools' vectors are asked for, is ranked by words and says
// so; an embedding model that is down leaves the lexical ranking, and the decision says so.
func TestPrefilterByMeaning(t *testing.T) {
	script := func(status int) *scriptedllm.Script {
		s := answers()
		s.Embeddings = &scriptedllm.Embeddings{Concepts: [][]string{{"weather", "rain", "umbrella"}}, Status: status}
		return s
	}
	semantic := func(c *Config, _ *Env) { c.Prefilter = PrefilterConfig{TopK: 1, Embedder: c.LLM, MinSimilarity: 0.5} }
	h := newHarness(t, script(0), semantic)
	d := h.ask("sess_m1", "will it rain, do I need an umbrella")
	if len(d.Warnings) != 1 || d.Warnings[0].Kind != protocol.WarnEmbeddings || !strings.Contains(d.Warnings[0].Message, "still being asked for") {
		t.Errorf("while the vectors come: %+v", d.Warnings)
	}
	run(t, h.srv)
	ix := h.srv.index(offersOf(h.srv, h.contracts.tools[:2]))
	waitFor(t, "the tools' vectors", func() bool {
		_, err := h.srv.semantic.Rank(t.Context(), ix, "rain", 1, 0)
		return err == nil
	})
	d = h.ask("sess_m2", "will it rain, do I need an umbrella")
	if len(d.Warnings) != 0 || len(d.Candidates) == 0 || d.Candidates[0].Name != "weather_search" || d.Candidates[0].Similarity < 0.5 {
		t.Errorf("by meaning: %+v", d)
	}

	down := newHarness(t, script(503), semantic)
	down.ask("sess_m3", "what is the weather forecast")
	if err := down.srv.semantic.Warm(t.Context(), down.srv.index(offersOf(down.srv, down.contracts.tools[:2]))); err == nil {
		t.Fatal("the embedding model answered")
	}
	d = down.ask("sess_m4", "what is the weather forecast")
	if len(d.Warnings) != 1 || d.Warnings[0].Kind != protocol.WarnEmbeddings || !strings.Contains(d.Warnings[0].Message, "the embedding model failed") ||
		len(d.Candidates) == 0 || d.Candidates[0].Name != "weather_search" {
		t.Errorf("the embedding model down: %+v", d)
	}
}

// offersOf are the registered tools ks as s offers them.
func offersOf(s *Server, ks []*contract.Compiled) []offer {
	var out []offer
	for _, k := range ks {
		out = append(out, s.contractOffer(k))
	}
	return out
}

// run runs s until t ends.
func run(t *testing.T, s *Server) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// waitFor waits until ok holds, failing t after a while.
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("waited in vain for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The model is offered only the registered tools Env.Offers lets the run's caller's role see
// (a door asking nobody who they are: no role).
func TestToolsOfferedByRole(t *testing.T) {
	var mu sync.Mutex
	var roles []string
	h := newHarness(t, answers(), func(_ *Config, env *Env) {
		env.Offers = func(tool string, _ *contract.Compiled, role string) bool {
			mu.Lock()
			defer mu.Unlock()
			roles = append(roles, role)
			return tool != "weather_search"
		}
	})
	h.ask("sess_o1", "what is the weather forecast for my city")
	var offered []string
	for _, tl := range h.model.Requests()[0].Tools {
		offered = append(offered, tl.Function.Name)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(offered) != "[echo]" || len(roles) == 0 || roles[0] != "" {
		t.Errorf("offered %v, roles asked %q", offered, roles)
	}
}
