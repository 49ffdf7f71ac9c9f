package chat

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/scriptedllm"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// keyedRun is the run id and the state key of a POST with an Idempotency-Key, made by nobody
// (no caller), and its body's digest.
func keyedRun(session, key, body string) (run, stateKey, digest string) {
	sum := sha256.Sum256([]byte("\x00" + session + "\x00" + key))
	run = "chat-" + hex.EncodeToString(sum[:12])
	b := sha256.Sum256([]byte(body))
	return run, chatRunKey(run), hex.EncodeToString(b[:16])
}

// A POST with an Idempotency-Key runs once: its retry gets the first run's answer (replayed,
// the model not asked, nothing submitted again), whole or streamed as it was asked; the key
// with another body is refused.
func TestIdempotencyKeyReplays(t *testing.T) {
	h := newHarness(t, echoThenAnswer(), nil)
	body := `{"model":"scripted","messages":[{"role":"user","content":"say hi"}]}`
	first := h.post("/v1/chat/completions", body, headerSession, "sess_i", headerIdemKey, "k-1")
	run, _, _ := keyedRun("sess_i", "k-1", body)
	if first.code != http.StatusOK || first.header.Get("X-Hermes-Run-ID") != run || first.header.Get("X-Hermes-Replayed") != "" {
		t.Fatalf("%d %v %s", first.code, first.header, first.body)
	}
	asked := len(h.model.Requests())
	again := h.post("/v1/chat/completions", body, headerSession, "sess_i", headerIdemKey, "k-1")
	if again.code != http.StatusOK || again.header.Get("X-Hermes-Replayed") != "true" || again.json(t)["id"] != run ||
		!strings.Contains(string(again.body), "echoed hi") {
		t.Fatalf("%d %v %s", again.code, again.header, again.body)
	}
	if len(h.model.Requests()) != asked || len(h.sub.submitted()) != 1 {
		t.Errorf("the retry asked the model or ran again")
	}
	// Another body under the key.
	r := h.post("/v1/chat/completions", `{"model":"scripted","messages":[{"role":"user","content":"other"}]}`, headerSession, "sess_i", headerIdemKey, "k-1")
	if e := r.openAIError(t); r.code != http.StatusUnprocessableEntity || e["code"] != "idempotency_key_reused" || e["param"] != headerIdemKey {
		t.Errorf("%d %s", r.code, r.body)
	}

	// Streamed, the retry is streamed from the kept answer.
	body = `{"model":"scripted","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"say hi"}]}`
	first = h.post("/v1/chat/completions", body, headerSession, "sess_i", headerIdemKey, "k-2")
	again = h.post("/v1/chat/completions", body, headerSession, "sess_i", headerIdemKey, "k-2")
	if again.header.Get("X-Hermes-Replayed") != "true" {
		t.Fatalf("%v", again.header)
	}
	cs := chunks(t, again)
	if text := cs[1].Choices[0].Delta["content"]; text != "echoed hi" || len(cs) != 4 || cs[3].Usage == nil {
		t.Errorf("replayed %s", again.body)
	}
	if !strings.Contains(string(first.body), `"event":"decided"`) || strings.Contains(string(again.body), `"event":"decided"`) {
		t.Errorf("progress: the run's, never the replay's")
	}

	// Through /api/chat and /v1/chat the kept answer is rendered in their shapes.
	ollama := `{"model":"scripted","stream":false,"messages":[{"role":"user","content":"say hi"}]}`
	h.post("/api/chat", ollama, headerSession, "sess_i", headerIdemKey, "k-3")
	if r := h.post("/api/chat", ollama, headerSession, "sess_i", headerIdemKey, "k-3"); r.header.Get("X-Hermes-Replayed") != "true" ||
		r.json(t)["message"].(map[string]any)["content"] != "echoed hi" {
		t.Errorf("ollama replayed %s", r.body)
	}
}

// A first run that ran nothing (the model refused) leaves its key to be retried: the retry runs
// as the key's next attempt, under a run id of its own, and is then the key's answer.
func TestIdempotencyRetryOfARunThatRanNothing(t *testing.T) {
	zero := 0
	h := newHarness(t, conversation(scriptedllm.Turn{Status: 400, Message: "not now", Times: 1},
		scriptedllm.Turn{Step: &zero, Content: "now"}), nil)
	body := `{"model":"scripted","messages":[{"role":"user","content":"x"}]}`
	run, _, _ := keyedRun("sess_n", "k", body)
	if r := h.post("/v1/chat/completions", body, headerSession, "sess_n", headerIdemKey, "k"); r.code != http.StatusBadRequest {
		t.Fatalf("%d %s", r.code, r.body)
	}
	r := h.post("/v1/chat/completions", body, headerSession, "sess_n", headerIdemKey, "k")
	if r.code != http.StatusOK || r.header.Get("X-Hermes-Run-ID") != run+"-a2" || r.json(t)["id"] != run+"-a2" {
		t.Fatalf("%d %v %s", r.code, r.header, r.body)
	}
	if r := h.post("/v1/chat/completions", body, headerSession, "sess_n", headerIdemKey, "k"); r.header.Get("X-Hermes-Replayed") != "true" || r.json(t)["id"] != run+"-a2" {
		t.Errorf("a third POST: %v %s", r.header, r.body)
	}
}

// A keyed run that began on a gateway that stopped before it ended is abandoned: 409, send with
// a new key. One still running is waited for, and its answer given.
func TestIdempotencyRunningAndAbandoned(t *testing.T) {
	body := `{"model":"scripted","messages":[{"role":"user","content":"x"}]}`
	_, key, digest := keyedRun("sess_k", "k", body)
	state := func(st chatRunState) []byte { b, _ := json.Marshal(st); return b }

	h := newHarness(t, echoThenAnswer(), nil)
	if _, err := h.kv.Put(t.Context(), key, state(chatRunState{State: "running", Body: digest, Attempt: 1, Deadline: time.Now().Add(-time.Minute)})); err != nil {
		t.Fatal(err)
	}
	r := h.post("/v1/chat/completions", body, headerSession, "sess_k", headerIdemKey, "k")
	if e := r.openAIError(t); r.code != http.StatusConflict || e["code"] != "run_abandoned" {
		t.Errorf("%d %s", r.code, r.body)
	}

	// Running elsewhere: the POST reads the key's state until it has the answer.
	reads := make(chan struct{}, 16)
	seen := &watchedKV{KV: bustest.NewMemKV(), key: key, reads: reads}
	h = newHarness(t, echoThenAnswer(), func(_ *Config, e *Env) { e.Sessions = seen })
	if _, err := seen.Put(t.Context(), key, state(chatRunState{State: "running", Body: digest, Attempt: 1, Deadline: time.Now().Add(time.Hour)})); err != nil {
		t.Fatal(err)
	}
	done := make(chan reply, 1)
	go func() { done <- h.post("/v1/chat/completions", body, headerSession, "sess_k", headerIdemKey, "k") }()
	<-reads
	answer, _ := json.Marshal(map[string]any{"id": "the first run's", "choices": []any{}})
	if _, err := seen.Put(t.Context(), key, state(chatRunState{State: "done", Body: digest, Status: http.StatusOK, Answer: answer})); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.code != http.StatusOK || r.json(t)["id"] != "the first run's" || r.header.Get("X-Hermes-Replayed") != "true" {
		t.Errorf("%d %s", r.code, r.body)
	}
	if n := len(h.model.Requests()); n != 0 {
		t.Errorf("the model was asked %d times", n)
	}

	// A client that goes away while it waits gets nothing more.
	if _, err := seen.Put(t.Context(), key, state(chatRunState{State: "running", Body: digest, Attempt: 1, Deadline: time.Now().Add(time.Hour)})); err != nil {
		t.Fatal(err)
	}
	for len(reads) > 0 {
		<-reads // the reads of the POST before
	}
	ctx, cancel := context.WithCancel(t.Context())
	go func() { <-reads; cancel() }()
	if r := h.do(ctx, http.MethodPost, "/v1/chat/completions", body, headerSession, "sess_k", headerIdemKey, "k"); len(r.body) != 0 {
		t.Errorf("%d %s", r.code, r.body)
	}
}

// The bus away, or a key's state unreadable: nothing is run, and the client is told to retry.
func TestIdempotencyKeyUnreadable(t *testing.T) {
	body := `{"model":"scripted","messages":[{"role":"user","content":"x"}]}`
	_, key, _ := keyedRun("sess_u", "k", body)
	h := newHarness(t, echoThenAnswer(), nil)
	if _, err := h.kv.Put(t.Context(), key, []byte("not json")); err != nil {
		t.Fatal(err)
	}
	r := h.post("/v1/chat/completions", body, headerSession, "sess_u", headerIdemKey, "k")
	if e := r.openAIError(t); r.code != http.StatusServiceUnavailable || e["code"] != protocol.CodeBusUnavailable {
		t.Errorf("unreadable: %d %s", r.code, r.body)
	}
	h.kv.Err = bustest.ErrUnreachable
	r = h.post("/v1/chat/completions", body, headerSession, "sess_u", headerIdemKey, "k")
	if e := r.openAIError(t); r.code != http.StatusServiceUnavailable || e["code"] != protocol.CodeBusUnavailable || !strings.Contains(e["message"].(string), "nothing was run") {
		t.Errorf("the bus away: %d %s", r.code, r.body)
	}
	if n := len(h.model.Requests()); n != 0 {
		t.Errorf("the model was asked %d times", n)
	}
}

// watchedKV tells of each read of key.
type watchedKV struct {
	KV
	key   string
	reads chan<- struct{}
}

func (w *watchedKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	e, err := w.KV.Get(ctx, key)
	if key == w.key {
		select {
		case w.reads <- struct{}{}:
		default:
		}
	}
	return e, err
}
