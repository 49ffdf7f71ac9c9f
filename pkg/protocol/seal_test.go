package protocol

import (
	"crypto/ed25519"
	"errors"
	"testing"
	"time"
)

// A sealed tool call verifies with its router's key until it expires; any change to its type,
// ids, payload or expiry, another key, no seal, or a seal copied onto another message is refused.
func TestSeal(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(nil)
	_, otherPriv, _ := ed25519.GenerateKey(nil)
	keys := map[string]ed25519.PublicKey{"r1": pub}
	now := time.Now()
	sealed := func() *Message {
		m, err := NewMessage(TypeToolCall, &Dispatch{Call: ToolCall{ToolCallID: "c1", Name: "echo"}, Route: "echo",
			Action: Action{Kind: ActionHTTP, HTTP: &HTTPAction{URL: "http://tool/x", Method: "POST"}}})
		if err != nil {
			t.Fatal(err)
		}
		m.MsgID, m.RequestID, m.SessionID = "tc-r1-c1", "r1", "s1"
		m.SealWith(priv, "r1", now.Add(time.Hour))
		return m
	}
	// Through the codec, as a worker receives it.
	data, err := Marshal(sealed())
	if err != nil {
		t.Fatal(err)
	}
	got, err := Unmarshal(data)
	if err != nil {
		t.Fatal(err)
	}
	if err := got.VerifySeal(keys, now); err != nil {
		t.Fatalf("a sealed message: %v", err)
	}
	forged, _ := NewMessage(TypeToolCall, &Dispatch{Call: ToolCall{ToolCallID: "c1", Name: "echo"}, Route: "echo",
		Action: Action{Kind: ActionHTTP, HTTP: &HTTPAction{URL: "http://169.254.169.254/latest/meta-data/", Method: "GET"}}})
	for name, change := range map[string]func(m *Message){
		"payload changed":  func(m *Message) { m.Payload = forged.Payload },
		"request changed":  func(m *Message) { m.RequestID = "r2" },
		"session changed":  func(m *Message) { m.SessionID = "s2" },
		"msg id changed":   func(m *Message) { m.MsgID = "tc-r1-c2" },
		"type changed":     func(m *Message) { m.Type = TypeToolResult },
		"expiry moved":     func(m *Message) { m.Seal.Expires = m.Seal.Expires.Add(time.Hour) },
		"key id changed":   func(m *Message) { m.Seal.KeyID = "r2" },
		"no seal":          func(m *Message) { m.Seal = nil },
		"short signature":  func(m *Message) { m.Seal.Sig = m.Seal.Sig[:10] },
		"another key":      func(m *Message) { m.SealWith(otherPriv, "r1", now.Add(time.Hour)) },
		"an untrusted key": func(m *Message) { m.SealWith(otherPriv, "evil", now.Add(time.Hour)) },
		"deadline moved":   func(m *Message) { m.Deadline = now.Add(time.Minute) },
	} {
		m := sealed()
		change(m)
		if err := m.VerifySeal(keys, now); !errors.Is(err, ErrUnsealed) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// Expired, but genuine: told apart, so that the call can be answered (not run).
	m := sealed()
	m.SealWith(priv, "r1", now.Add(-time.Second))
	if err := m.VerifySeal(keys, now); !errors.Is(err, ErrSealExpired) || errors.Is(err, ErrUnsealed) {
		t.Errorf("expired: %v", err)
	}
	// A trusted key of the wrong length is no key (and no panic).
	if err := sealed().VerifySeal(map[string]ed25519.PublicKey{"r1": {1, 2, 3}}, now); !errors.Is(err, ErrUnsealed) {
		t.Errorf("a short trusted key: %v", err)
	}
}

// BenchmarkSeal is what sealing costs a router, and verifying costs a worker, per call.
func BenchmarkSeal(b *testing.B) {
	pub, priv, _ := ed25519.GenerateKey(nil)
	keys := map[string]ed25519.PublicKey{"r1": pub}
	m, _ := NewMessage(TypeToolCall, &Dispatch{Call: ToolCall{ToolCallID: "c1", Name: "echo", Arguments: []byte(`{"city":"上海"}`)},
		Route: "echo", Action: Action{Kind: ActionHTTP, HTTP: &HTTPAction{URL: "http://tool/x", Method: "POST"}}})
	m.MsgID, m.RequestID, m.SessionID = "tc-r1-c1", "r1", "s1"
	exp := time.Now().Add(time.Hour)
	b.Run("sign", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m.SealWith(priv, "r1", exp)
		}
	})
	m.SealWith(priv, "r1", exp)
	now := time.Now()
	b.Run("verify", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := m.VerifySeal(keys, now); err != nil {
				b.Fatal(err)
			}
		}
	})
}
