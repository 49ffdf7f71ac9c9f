package memory

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// seedFile reads a file of ../shared/seed-examples beside the repository, else its
// byte-for-byte copy in test/integration/testdata.
func seedFile(t *testing.T, name string) []byte {
	t.Helper()
	_, here, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(here), "..", "..")
	for _, p := range []string{filepath.Join(root, "..", "shared", "seed-examples", name), filepath.Join(root, "test", "integration", "testdata", "seed-examples", name)} {
		if b, err := os.ReadFile(p); err == nil {
			return b
		}
	}
	t.Fatalf("no %s", name)
	return nil
}

// The seed's two files load unchanged, alone and together, and their filters judge the seed's
// sentences as the seed says.
func TestTheSeedsFilesLoadAndFilter(t *testing.T) {
	mem, intent := seedFile(t, "memory-config.yaml"), seedFile(t, "intent-decay.yaml")
	for _, data := range [][]byte{mem, intent, append(append(append([]byte{}, mem...), '\n'), intent...)} {
		if _, err := LoadConfig(data); err != nil {
			t.Fatal(err)
		}
	}
	c, err := LoadConfig(append(append(append([]byte{}, mem...), '\n'), intent...))
	if err != nil {
		t.Fatal(err)
	}
	if c.Intent.Threshold() != 0.65 || time.Duration(c.Intent.Decay["transaction"]) != 2*time.Hour ||
		time.Duration(c.Intent.Decay["consultation"]) != 15*time.Minute || time.Duration(c.Intent.Decay["chitchat"]) != 5*time.Minute {
		t.Fatalf("intent %+v", c.Intent)
	}
	pref := func(key, value, lifespan string) *Write {
		return &Write{Type: "user_preference", Key: key, Value: json.RawMessage(value), Lifespan: lifespan}
	}
	for _, tc := range []struct {
		sentence string
		w        *Write
		kept     bool
	}{
		{"以后都发顺丰", pref("default_shipping", `"SF-Express"`, "forever"), true},
		{"发票开个人", pref("invoice_type", `"personal"`, "30d"), true},
		{"帮我查北京朝阳区三里屯店的库存", &Write{Session: "s", Type: "location_context", Key: "location_context",
			Value: json.RawMessage(`{"city":"北京","district":"朝阳区","store":"三里屯店"}`), Lifespan: "session", Tags: []string{"inventory_query"}}, true},
		{"好的谢谢", pref("thanks", `"好的谢谢"`, "forever"), false},
		{"谢谢你", pref("thanks", `"x"`, "forever"), false},
		{"以后都发顺丰吗？", pref("default_shipping", `"SF-Express"`, "forever"), false},
		{"以后都发顺丰", &Write{Type: "small_talk", Key: "mood", Value: json.RawMessage(`"good"`), Lifespan: "30d"}, false},
		{"", &Write{Type: "x", Key: "k", Value: json.RawMessage(`"x"`), Lifespan: "30d", Tags: []string{"contact_info"}}, true},
		{"", pref("note", `"好的，明天见"`, "30d"), false},       // no sentence: a string value is judged
		{"以后都发顺丰", pref("note", `"谢谢你的惠顾"`, "30d"), false}, // a sentence, and a value that is a pleasantry
	} {
		err := c.Memory.Admit(tc.w, tc.sentence)
		var r *Refusal
		if kept := err == nil; kept != tc.kept || !kept && !errors.As(err, &r) {
			t.Errorf("%q %s: %v, want kept %v", tc.sentence, tc.w.Key, err, tc.kept)
		}
	}
}

func TestBadConfigsNameTheField(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"memory:\n  filterz: []\n", "field filterz not found"},
		{"memory:\n  filters:\n    - exclude_patterns: [\"(\"]\n", "memory.filters[0].exclude_patterns[0]"},
		{"memory:\n  filters:\n    - type: lexical\n", "memory.filters[0].type"},
		{"intent:\n  confidence_threshold: 1.5\n", "intent.confidence_threshold"},
		{"intent:\n  decay:\n    chitchat: soon\n", `"soon" is not a duration`},
		{"intent:\n  decay:\n    chitchat: forever\n", `"forever" is not a duration`},
	} {
		if _, err := LoadConfig([]byte(tc.file)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.file, err, tc.want)
		}
	}
	if c, err := LoadConfig(nil); err != nil || c.Intent.Threshold() != DefaultConfidenceThreshold {
		t.Fatalf("an empty file: %v", err)
	}
}

func FuzzLoadConfig(f *testing.F) {
	f.Add([]byte("memory:\n  filters:\n    - type: semantic\n      include_tags: [a]\n      exclude_patterns: [\"^x\"]\nintent:\n  confidence_threshold: 0.7\n  decay:\n    chitchat: 5m\n"))
	f.Add([]byte("intent: {decay: {a: 30d}}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := LoadConfig(data)
		if err != nil {
			return
		}
		if th := c.Intent.Threshold(); th < 0 || th > 1 || len(c.Memory.Filters) > MaxFilters {
			t.Fatalf("accepted %+v", c)
		}
		_ = c.Memory.Admit(&Write{Type: "t", Key: "k", Value: json.RawMessage(`"v"`), Lifespan: "1h"}, "x")
	})
}

func FuzzParseLifespan(f *testing.F) {
	for _, s := range []string{"30d", "2h", "session", "forever", "1h30m", "-1s", "999999d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := ParseLifespan(s)
		if err != nil {
			return
		}
		if !l.Forever && !l.Session && (l.For < MinLifespan || l.For > MaxLifespan) {
			t.Fatalf("%q: %+v", s, l)
		}
		if back, err := ParseLifespan(l.String()); err != nil || back != l {
			t.Fatalf("%q → %s → %+v %v", s, l, back, err)
		}
	})
}

// Rules draw fragments from messages without the model; a bad rule is refused naming it.
func TestRulesDrawFragments(t *testing.T) {
	c, err := LoadConfig([]byte(`
memory:
  rules:
    - pattern: "以后都发(顺丰|圆通|中通)"
      type: user_preference
      key: default_shipping
      value: "$1"
      values: {顺丰: SF-Express, 圆通: YTO}
      lifespan: forever
    - pattern: "发票开(个人|公司)"
      type: user_preference
      key: invoice_type
      value: "$1"
      values: {个人: personal, 公司: company}
      lifespan: 30d
`))
	if err != nil {
		t.Fatal(err)
	}
	ws := c.Memory.Extract("以后都发顺丰，发票开个人", "s1")
	if len(ws) != 2 || string(ws[0].Value) != `"SF-Express"` || ws[0].Key != "default_shipping" || string(ws[1].Value) != `"personal"` || ws[1].Source != "rule" {
		t.Fatalf("%+v", ws)
	}
	if ws := c.Memory.Extract("以后都发中通", "s1"); len(ws) != 1 || string(ws[0].Value) != `"中通"` {
		t.Fatalf("an unmapped group: %+v", ws)
	}
	if ws := c.Memory.Extract("好的谢谢", "s1"); len(ws) != 0 {
		t.Fatalf("%+v", ws)
	}
	for _, bad := range []struct{ file, want string }{
		{"memory:\n  rules:\n    - {pattern: \"(\", type: t, key: k, value: v, lifespan: 1h}\n", "memory.rules[0].pattern"},
		{"memory:\n  rules:\n    - {pattern: x, type: t, key: k, value: v, lifespan: soon}\n", "lifespan"},
		{"memory:\n  rules:\n    - {pattern: x, type: t, value: v, lifespan: 1h}\n", "key"},
		{"memory:\n  rules:\n    - {pattern: x, type: t, key: k, lifespan: 1h}\n", "memory.rules[0].value"},
	} {
		if _, err := LoadConfig([]byte(bad.file)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: %v, want %q", bad.file, err, bad.want)
		}
	}
}
