package protocol

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzUnmarshal feeds arbitrary bytes to the bus decoders: they must never panic, and any
// message they accept must re-encode and decode to the same envelope.
func FuzzUnmarshal(f *testing.F) {
	m, _ := NewMessage(TypeRequest, &Request{RequestID: "r", Intent: "x", ToolCalls: []ToolCall{{ToolCallID: "c", Name: "t", Arguments: json.RawMessage(`{"a":1}`)}}})
	m.MsgID, m.RequestID, m.SessionID = "request:r", "r", "r"
	good, _ := Marshal(m)
	f.Add(good)
	d, _ := NewMessage(TypeLLMDecision, &LLMDecision{Run: "chat-1", Turn: 1, Messages: []LLMMessage{{Role: "user", Content: "x"}},
		Chosen: []LLMCall{{ID: "c", Name: "t", Arguments: "{"}}, Warnings: []LLMWarning{{Kind: WarnNotJSON, Message: "m"}}})
	d.MsgID, d.RequestID, d.SessionID = "llm:chat-1:1", "chat-1-1", "s"
	decision, _ := Marshal(d)
	f.Add(decision)
	sm, _ := NewMessage(TypeLLMSummary, &LLMSummary{Through: 9, Since: 3, Tail: 7, Messages: 20, New: 10, Text: "张伟和李娜的会议已订好", Model: "m"})
	sm.MsgID, sm.RequestID, sm.SessionID = "summary:s:9", "chat-1-1", "s"
	summary, _ := Marshal(sm)
	f.Add(summary)
	bs, _ := NewMessage(TypeBlueprintStep, &BlueprintStep{RunID: "r1", Blueprint: "check_and_urge", Version: 1, Step: "1", Tool: "logistics_urge", Status: "skipped",
		Condition: &StepCondition{Expr: "$.a == 'paid'", Values: json.RawMessage(`{"$.a":"shipped"}`)}})
	bs.MsgID, bs.RequestID, bs.SessionID = "blueprint:r1:1:skipped", "bpr-r1-s1", "bpr-r1"
	step, _ := Marshal(bs)
	f.Add(step)
	ce, _ := NewMessage(TypeCoordination, &CoordinationEvent{Op: CoordWaiting, ToolCallID: "c", Tool: "refund_apply", Resource: "order_123",
		Tx: TxID("r", "order_123"), HeldBy: "r0/c0", Position: 1, Changes: []string{"payment_status"}})
	ce.MsgID, ce.RequestID, ce.SessionID = "coord:waiting:r:c:0", "r", "s"
	coord, _ := Marshal(ce)
	f.Add(coord)
	f.Add([]byte{0xc6, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0xdf, 0x7f, 0xff, 0xff, 0xff, 0xa1, 'a'})
	f.Add(good[:len(good)/2])
	f.Add(bytes.Repeat([]byte{0x91}, 1000))
	for _, data := range hostileInputs() {
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		msg, err := Unmarshal(data)
		if err != nil {
			return
		}
		_, _ = msg.DecodeRequest(Limits{})
		_, _ = msg.DecodeDispatch()
		_, _ = msg.DecodeToolResult()
		_, _ = msg.DecodeToolStarted()
		_, _ = msg.DecodeResponse()
		_, _ = msg.DecodeCancel()
		_, _ = msg.DecodeLLMDecision()
		if e, err := msg.DecodeCoordination(); err == nil && (!ValidTx(e.Tx) || len(e.Resource) > MaxResourceKeyLen || len(e.Changes) > MaxChanges) {
			t.Errorf("accepted %+v", e)
		}
		if e, err := msg.DecodeMemory(); err == nil && (len(e.Value) > MaxMemoryValueBytes || len(e.Key) > MaxMemoryKeyBytes || len(e.Tags) > MaxMemoryTags) {
			t.Errorf("accepted %+v", e)
		}
		if e, err := msg.DecodeBlueprintStep(); err == nil && (len(e.Error) > MaxBlueprintTextBytes || e.Condition != nil && len(e.Condition.Values) > 0 && !json.Valid(e.Condition.Values)) {
			t.Errorf("accepted %+v", e)
		}
		if s, err := msg.DecodeLLMSummary(); err == nil && (s.Since >= s.Through || s.Tail > s.Through || s.New > s.Messages || len(s.Text) > MaxSummaryBytes) {
			t.Errorf("accepted %+v", s)
		}
		b, err := Marshal(msg)
		if err != nil {
			t.Fatalf("accepted message does not re-encode: %v", err)
		}
		if _, err := Unmarshal(b); err != nil {
			t.Fatalf("re-encoded message does not decode: %v", err)
		}
	})
}

// FuzzDecodeRequestJSON checks the HTTP edge decoder never panics, and that an accepted
// request survives JSON → msgpack → JSON unchanged.
func FuzzDecodeRequestJSON(f *testing.F) {
	f.Add([]byte(`{"request_id":"req_abc123","intent":"我的保单号是多少","tool_calls":[{"name":"get_policy_number","arguments":{},"tool_call_id":"call_def456"}]}`))
	f.Add([]byte(`{"request_id":"r","tool_calls":[{"tool_call_id":"a","name":"t","arguments":{"n":18446744073709551615}}]}`))
	f.Add([]byte(`{"request_id":"*","tool_calls":null}`))
	f.Add([]byte(`[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := DecodeRequestJSON(data, Limits{})
		if err != nil {
			return
		}
		m, err := NewMessage(TypeRequest, r)
		if err != nil {
			t.Fatal(err)
		}
		m.MsgID, m.RequestID, m.SessionID = MsgIDRequest(r.RequestID), r.RequestID, r.Session()
		b, err := Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		m2, err := Unmarshal(b)
		if err != nil {
			t.Fatalf("accepted request does not decode from msgpack: %v", err)
		}
		r2, err := m2.DecodeRequest(Limits{})
		if err != nil {
			t.Fatalf("accepted request fails validation after msgpack: %v", err)
		}
		j1, _ := json.Marshal(r)
		j2, _ := json.Marshal(r2)
		if !bytes.Equal(j1, j2) {
			t.Fatalf("JSON and msgpack disagree:\n%s\n%s", j1, j2)
		}
	})
}
