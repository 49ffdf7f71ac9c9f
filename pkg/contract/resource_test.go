package contract

import (
	"encoding/json"
	"testing"
)

func TestOneNumberNamesOneResource(t *testing.T) {
	c := &Compiled{Contract: &Contract{Name: "t", ResourceKey: "acct:{id}"}}
	want := "acct:123"
	for _, v := range []string{`123`, `123.0`, `1.23e2`, `123e0`, `"123"`} {
		got, err := c.Resource(json.RawMessage(`{"id":` + v + `}`))
		if err != nil || got != want {
			t.Errorf("%s: %q %v", v, got, err)
		}
	}
	if got, _ := c.Resource(json.RawMessage(`{"id":1.5}`)); got != "acct:1.5" {
		t.Errorf("1.5: %q", got)
	}
	if got, _ := c.Resource(json.RawMessage(`{"id":9007199254740991}`)); got != "acct:9007199254740991" {
		t.Errorf("2^53-1: %q", got)
	}
	// Past 2^53, numbers a tool reading float64 takes for one are one resource.
	a, _ := c.Resource(json.RawMessage(`{"id":9007199254740993}`))
	b, _ := c.Resource(json.RawMessage(`{"id":9007199254740992}`))
	if a != b || a == "" {
		t.Errorf("2^53+1 %q and 2^53 %q", a, b)
	}
	a, _ = c.Resource(json.RawMessage(`{"id":1e23}`))
	b, _ = c.Resource(json.RawMessage(`{"id":99999999999999991611392}`))
	if a != b || a == "" {
		t.Errorf("1e23 %q and 99999999999999991611392 %q", a, b)
	}
	for _, bad := range []string{`{}`, `{"id":""}`, `{"id":" "}`, `{"id":null}`, `{"id":[1]}`, `[]`, `not json`} {
		if got, err := c.Resource(json.RawMessage(bad)); err == nil {
			t.Errorf("%s: named %q", bad, got)
		}
	}
}

func FuzzResource(f *testing.F) {
	f.Add("acct:{id}", `{"id":"x"}`)
	f.Add("{a}-{b}", `{"a":1,"b":2.5e3}`)
	f.Add("{", `{}`)
	f.Fuzz(func(t *testing.T, key, args string) {
		c := &Compiled{Contract: &Contract{Name: "t", ResourceKey: key}}
		if got, err := c.Resource(json.RawMessage(args)); err == nil && (got == "" || len(got) > 256) {
			t.Fatalf("%q %q → %q", key, args, got)
		}
	})
}

func TestAHugeNumberIsNotWrittenOut(t *testing.T) {
	c := &Compiled{Contract: &Contract{Name: "t", ResourceKey: "{id}"}}
	if got, err := c.Resource(json.RawMessage(`{"id":1e100000000}`)); err != nil || len(got) > 32 {
		t.Fatalf("%d bytes, %v", len(got), err)
	}
}
