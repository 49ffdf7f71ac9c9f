package protocol_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/pkg/protocol"
)

func resultMsg(t *testing.T, call, name string) (*protocol.Message, *protocol.ToolResult) {
	t.Helper()
	res := &protocol.ToolResult{ToolCallID: call, Name: name, Status: protocol.ResultOK, Content: []byte(`{"ok":true}`)}
	m, err := protocol.NewMessage(protocol.TypeToolResult, res)
	if err != nil {
		t.Fatal(err)
	}
	m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDToolResult("r1", call), "r1", "s1"
	return m, res
}

func newKey(t *testing.T) (ed25519.PublicKey, ed25519.PrivateKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return pub, priv
}

// TestVerifyResult: a result counts only when a key trusted for its call's tool sealed it, over
// the result as it is.
func TestVerifyResult(t *testing.T) {
	routerPub, routerKey := newKey(t)
	crmPub, crmKey := newKey(t)
	_, strangerKey := newKey(t)
	keys := protocol.ResultKeys{"router": {Key: routerPub}, "crm": {Key: crmPub, Tools: []string{"crm_lookup"}}}

	cases := []struct {
		name     string
		tool     string // the call's tool
		result   string // the tool the result names
		key      ed25519.PrivateKey
		keyID    string
		tamper   bool
		replay   func(*protocol.Message) // changes what a replay of a genuine result would
		wantFail string
	}{
		{name: "replayed with fewer call ids", tool: "echo", result: "echo", key: routerKey, keyID: "router", wantFail: "does not match",
			replay: func(m *protocol.Message) { m.Correlation = &protocol.Correlation{CallIDs: []string{"c1"}} }},
		{name: "replayed as serial", tool: "echo", result: "echo", key: routerKey, keyID: "router", wantFail: "does not match",
			replay: func(m *protocol.Message) { m.Correlation.Serial = true }},
		{name: "replayed as the dead-letter processor's", tool: "echo", result: "echo", key: routerKey, keyID: "router", wantFail: "does not match",
			replay: func(m *protocol.Message) { m.Sender.Role = protocol.RoleDeadLetter }},
		{name: "a router's key, any tool", tool: "echo", result: "echo", key: routerKey, keyID: "router"},
		{name: "a worker's key, its tool", tool: "crm_lookup", result: "crm_lookup", key: crmKey, keyID: "crm"},
		{name: "a worker's key, another tool's call", tool: "echo", result: "echo", key: crmKey, keyID: "crm", wantFail: "may seal results of crm_lookup only"},
		{name: "a worker's key, another tool's call under its own tool's name", tool: "echo", result: "crm_lookup", key: crmKey, keyID: "crm", wantFail: `names tool "crm_lookup", but the call is of "echo"`},
		{name: "unsealed", tool: "echo", result: "echo", wantFail: "has no seal"},
		{name: "an unknown key", tool: "echo", result: "echo", key: strangerKey, keyID: "stranger", wantFail: "not trusted for results"},
		{name: "a key under another's id", tool: "echo", result: "echo", key: strangerKey, keyID: "router", wantFail: "does not match"},
		{name: "changed after sealing", tool: "echo", result: "echo", key: routerKey, keyID: "router", tamper: true, wantFail: "does not match"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, res := resultMsg(t, "c1", c.result)
			m.Correlation = &protocol.Correlation{CallIDs: []string{"c1", "c2"}}
			m.Sender = protocol.Sender{Role: protocol.RoleToolWorker, Instance: "w1"}
			if c.key != nil {
				m.SealResult(c.key, c.keyID)
			}
			if c.replay != nil {
				c.replay(m)
			}
			if c.tamper {
				m.Payload = append([]byte(nil), m.Payload...)
				m.Payload[len(m.Payload)-2] ^= 1
			}
			err := keys.VerifyResult(m, res, c.tool)
			switch {
			case c.wantFail == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.wantFail != "" && err == nil:
				t.Fatal("accepted")
			case c.wantFail != "" && (!errors.Is(err, protocol.ErrResultUnsealed) || !strings.Contains(err.Error(), c.wantFail)):
				t.Fatalf("error %q, want one saying %q", err, c.wantFail)
			}
		})
	}
}

// BenchmarkResultSeal is what authenticating results costs: sealing on the worker, verifying on
// the router, per call.
func BenchmarkResultSeal(b *testing.B) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	keys := protocol.ResultKeys{"w": {Key: pub, Tools: []string{"echo"}}}
	res := &protocol.ToolResult{ToolCallID: "call_1", Name: "echo", Status: protocol.ResultOK, Content: []byte(`{"policy_number":"PN-2021-7802382","holder":"张三"}`)}
	m, _ := protocol.NewMessage(protocol.TypeToolResult, res)
	m.MsgID, m.RequestID, m.SessionID = "r1.call_1.result", "r1", "s1"
	b.Run("seal", func(b *testing.B) {
		for b.Loop() {
			m.SealResult(priv, "w")
		}
	})
	m.SealResult(priv, "w")
	b.Run("verify", func(b *testing.B) {
		for b.Loop() {
			if err := keys.VerifyResult(m, res, "echo"); err != nil {
				b.Fatal(err)
			}
		}
	})
}
