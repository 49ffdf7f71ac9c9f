package audit

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestDigestKeepsTheShapeNotTheValues(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want Digest
	}{
		{`{"policy_no":"P-123","status":"active","effective_date":"2021-01-01"}`, Digest{Kind: "object", Count: 3, Fields: []string{"effective_date", "policy_no", "status"}}},
		{`[{"id":1,"name":"a"},{"id":2,"email":"x@y"}]`, Digest{Kind: "array", Count: 2, Fields: []string{"email", "id", "name"}}},
		{`{"alice@example.com":{"pin":"1234"},"ok":true}`, Digest{Kind: "object", Count: 2, Fields: []string{"ok"}, Unnamed: 1}},
		{`"a secret string"`, Digest{Kind: "string"}},
		{`42`, Digest{Kind: "number"}},
		{`true`, Digest{Kind: "bool"}},
		{`null`, Digest{Kind: "null"}},
		{`[1,[2,3],{"a":{"b":1}}]`, Digest{Kind: "array", Count: 3, Fields: []string{"a"}}},
		{`{"a":1} {"b":2}`, Digest{Kind: "invalid"}},
		{`{"a":`, Digest{Kind: "invalid"}},
		{``, Digest{Kind: "invalid"}},
	} {
		c.want.Size = len(c.in)
		got := DigestOf([]byte(c.in))
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("DigestOf(%s) = %+v, want %+v", c.in, got, c.want)
		}
	}
	many := map[string]int{}
	for i := range MaxFields + 5 {
		many[fmt.Sprintf("f%02d", i)] = i
	}
	data, _ := json.Marshal(many)
	if d := DigestOf(data); len(d.Fields) != MaxFields || d.Unnamed != 5 || d.Count != MaxFields+5 {
		t.Errorf("%d fields: %d named, %d unnamed, count %d", MaxFields+5, len(d.Fields), d.Unnamed, d.Count)
	}
}

// FuzzDigest: no input makes it fail, and no string value of the input (other than a key, or
// what a key holds) is in what it keeps.
func FuzzDigest(f *testing.F) {
	for _, s := range []string{`{"a":"secret-1"}`, `[{"k":"v"}]`, `"x"`, `{"a":{"b":["c"]}}`, `[`, `{"\u0000":1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		d := DigestOf(data)
		out, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if len(d.Fields) > MaxFields || d.Size != len(data) {
			t.Fatalf("digest %+v of %d bytes", d, len(data))
		}
		for _, name := range d.Fields {
			if !isName(name) {
				t.Fatalf("field %q kept, which is no name", name)
			}
		}
		var v any
		if json.Unmarshal(data, &v) != nil {
			return
		}
		keys := map[string]bool{}
		var values []string
		var walk func(any)
		walk = func(x any) {
			switch x := x.(type) {
			case map[string]any:
				for k, e := range x {
					keys[k] = true
					walk(e)
				}
			case []any:
				for _, e := range x {
					walk(e)
				}
			case string:
				values = append(values, x)
			}
		}
		walk(v)
		for _, s := range values {
			if len(s) >= 4 && !keys[s] && !slices.ContainsFunc(d.Fields, func(f string) bool { return strings.Contains(f, s) }) &&
				!strings.Contains(`"kind""size""count""fields""unnamed""object""array""string""number""bool""null""invalid"`, s) && strings.Contains(string(out), s) {
				t.Fatalf("value %q of %s is in its digest %s", s, data, out)
			}
		}
	})
}
