package protocol

import (
	"math"
	"testing"
)

// A decision's intent and memory are bounded: a confidence that is no number, or out of
// [0, 1], and unprintable names are refused.
func TestADecisionsIntentIsChecked(t *testing.T) {
	for _, tc := range []struct {
		name string
		d    LLMDecision
		ok   bool
	}{
		{"fine", LLMDecision{Run: "r", Turn: 1, Intent: &LLMIntent{Domain: "transaction", Confidence: 0.9}, Memory: []LLMMemory{{Type: "t", Key: "k"}}}, true},
		{"NaN", LLMDecision{Run: "r", Turn: 1, Intent: &LLMIntent{Domain: "x", Confidence: math.NaN()}}, false},
		{"over 1", LLMDecision{Run: "r", Turn: 1, Intent: &LLMIntent{Domain: "x", Confidence: 1.5}}, false},
		{"control", LLMDecision{Run: "r", Turn: 1, Intent: &LLMIntent{Domain: "x\x1b[31m", Confidence: 0.5}}, false},
		{"memory key", LLMDecision{Run: "r", Turn: 1, Memory: []LLMMemory{{Type: "t", Key: "k\x00"}}}, false},
	} {
		m, err := NewMessage(TypeLLMDecision, &tc.d)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.DecodeLLMDecision(); (err == nil) != tc.ok {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}
