package chat

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzDecodeChatRequest: whatever the body, decoding does not panic, and what it refuses is a
// *chatError naming why; what it takes has a model and messages within the bounds.
func FuzzDecodeChatRequest(f *testing.F) {
	f.Add(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	f.Add(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]},{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"t","arguments":"{"}}]},{"role":"tool","tool_call_id":"c","content":"r"}],"tools":[{"type":"function","function":{"name":"t","parameters":{"type":"object"}}}],"stream":true,"stream_options":{"include_usage":true},"metadata":{"hermes_session_id":"s"},"max_turns":3,"stop":["x"],"tool_choice":"none"}`)
	f.Add(`{"model":1}`)
	f.Add(`{"model":"m","messages":[null]}`)
	f.Add(`[]`)
	f.Add(`{"model":"m","messages":[{"role":"tool"}]}`)
	f.Fuzz(func(t *testing.T, body string) {
		req, err := decodeChatRequest([]byte(body))
		if err != nil {
			ce, ok := err.(*chatError)
			if !ok || ce.Status != 400 || ce.Message == "" {
				t.Fatalf("%T %v", err, err)
			}
			return
		}
		if req.Model == "" || len(req.Messages) == 0 || len(req.Messages) > maxChatMessages || len(req.Tools) > maxChatTools {
			t.Fatalf("%+v", req)
		}
		for _, m := range req.Messages {
			_ = m.param()
			_ = m.digest()
		}
	})
}

func TestChatRequestErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct{ body, param string }{
		{`{"model":"m","messages":[{"role":"user"}]}`, "messages[0].content"},
		{`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"t"}}]}]}`, "messages[0].tool_calls[0].id"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"required"}`, "tool_choice"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"a"}},{"type":"function","function":{"name":"a"}}]}`, "tools[1].function.name"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"stop":[1]}`, "stop"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":0}`, "max_tokens"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}]} {}`, ""},
		{`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"t"}}]},{"role":"user","content":"x"}]}`, "messages[1]"},
		{`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"t"}},{"id":"b","type":"function","function":{"name":"t"}}]},{"role":"tool","tool_call_id":"a","content":"r"}]}`, "messages[1]"},
		{`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"t"}},{"id":"a","type":"function","function":{"name":"t"}}]}]}`, "messages[0].tool_calls[1].id"},
	} {
		_, err := decodeChatRequest([]byte(tc.body))
		ce, ok := err.(*chatError)
		if !ok || ce.Param != tc.param || (tc.param != "" && !strings.HasPrefix(ce.Message, tc.param+":")) {
			t.Errorf("%s: %v", tc.body, err)
		}
	}
}

// A history is matched to the record by the messages the client has seen; a run that waits
// for the client's results goes on with the model's whole message and Hermes' results.
func TestChatConversationMatchesTheRecord(t *testing.T) {
	req, err := decodeChatRequest([]byte(`{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	st := chatState{Seen: []string{req.Messages[0].digest(), req.Messages[1].digest()}}
	msgs, recorded, warning := st.conversation(req.Messages, nil)
	if len(msgs) != 3 || recorded != 2 || warning != nil {
		t.Fatalf("%d %d %v", len(msgs), recorded, warning)
	}
	st.Seen[0] = "other"
	if _, recorded, warning = st.conversation(req.Messages, nil); recorded != 0 || warning == nil {
		t.Fatalf("a differing history: %d %v", recorded, warning)
	}
	// A run that returned the client's call c2 (and ran h1 itself).
	req, _ = decodeChatRequest([]byte(`{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","tool_calls":[{"id":"c2","type":"function","function":{"name":"mine","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c2","content":"done"}]}`))
	whole, _ := json.Marshal(map[string]any{"role": "assistant", "tool_calls": []any{
		map[string]any{"id": "h1", "type": "function", "function": map[string]any{"name": "echo", "arguments": "{}"}},
		map[string]any{"id": "c2", "type": "function", "function": map[string]any{"name": "mine", "arguments": "{}"}}}})
	result, _ := json.Marshal(map[string]any{"role": "tool", "tool_call_id": "h1", "content": "echoed"})
	// An earlier turn of the run, which the record holds, then the model's last message.
	earlier, _ := json.Marshal(map[string]any{"role": "assistant", "tool_calls": []any{
		map[string]any{"id": "h0", "type": "function", "function": map[string]any{"name": "echo", "arguments": "{}"}}}})
	earlierResult, _ := json.Marshal(map[string]any{"role": "tool", "tool_call_id": "h0", "content": "first"})
	st = chatState{Seen: []string{req.Messages[0].digest(), req.Messages[1].digest()}}
	msgs, recorded, _ = st.conversation(req.Messages, &chatPending{Messages: []json.RawMessage{earlier, earlierResult, whole, result}, Recorded: 2})
	b, _ := json.Marshal(msgs)
	if len(msgs) != 6 || recorded != 3 || !strings.Contains(string(b), `"h0"`) || !strings.Contains(string(b), `"h1"`) || !strings.Contains(string(b), `"echoed"`) {
		t.Fatalf("%d %d %s", len(msgs), recorded, b)
	}
}

// FuzzDecodeOllamaRequest: an Ollama body never panics the decoder; what it refuses is a
// *chatError; what it takes has every tool message answering a call.
func FuzzDecodeOllamaRequest(f *testing.F) {
	f.Add(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	f.Add(`{"model":"m","stream":false,"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"","tool_calls":[{"function":{"name":"t","arguments":{"x":1}}}]},{"role":"tool","tool_name":"t","content":"r"}],"options":{"temperature":0.2,"num_predict":5}}`)
	f.Add(`{"model":"m","messages":[{"role":"tool","content":"r"}]}`)
	f.Add(`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"function":{"name":"t","arguments":"{\"a\":1}"}}]}]}`)
	f.Fuzz(func(t *testing.T, body string) {
		req, err := ollamaWire{}.decode([]byte(body))
		if err != nil {
			if _, ok := err.(*chatError); !ok {
				t.Fatalf("%T %v", err, err)
			}
			return
		}
		if req.Model == "" || len(req.Messages) == 0 {
			t.Fatalf("%+v", req)
		}
		if err := checkToolReplies(req.Messages); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzDecodeHermesChat: /v1/chat's body never panics the decoder; what it takes is one user
// message of a session.
func FuzzDecodeHermesChat(f *testing.F) {
	f.Add(`{"session_id":"s","message":"hi"}`)
	f.Add(`{"session_id":"s","message":"hi","max_turns":2}`)
	f.Add(`{"session_id":1}`)
	f.Add(`{"session_id":"s","message":"\xff"}`)
	f.Fuzz(func(t *testing.T, body string) {
		req, err := hermesWire{}.decode([]byte(body))
		if err != nil {
			if _, ok := err.(*chatError); !ok {
				t.Fatalf("%T %v", err, err)
			}
			return
		}
		if req.Session == "" || len(req.Messages) != 1 || req.Messages[0].Role != "user" || !req.fromRecord {
			t.Fatalf("%+v", req)
		}
	})
}

// Ollama's and /v1/chat's bodies are one JSON value, as the OpenAI front door's are.
func TestOneJSONValue(t *testing.T) {
	for name, w := range map[string]wire{"ollama": ollamaWire{}, "hermes": hermesWire{}} {
		body := `{"model":"m","session_id":"s","message":"x","messages":[{"role":"user","content":"x"}]} {"garbage":1}`
		if name == "hermes" {
			body = `{"session_id":"s","message":"x"} {"garbage":1}`
		}
		if _, err := w.decode([]byte(body)); err == nil || !strings.Contains(err.Error(), "more than one JSON value") {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := (ollamaWire{}).decode([]byte(`{"model":"m","messages":[{"role":"user","content":"x"}],"options":{"stop":"x"}}`)); err == nil {
		t.Error("options.stop not a list")
	}
}

// A value an error quotes is cut on a character boundary: the error stays valid UTF-8.
func TestErrorsQuoteWholeCharacters(t *testing.T) {
	_, err := decodeChatRequest([]byte(`{"model":"m","messages":[{"role":"` + strings.Repeat("角", 40) + `","content":"x"}]}`))
	if err == nil || !utf8.ValidString(err.Error()) || !strings.Contains(err.Error(), "…") {
		t.Errorf("%q", err)
	}
}
