package contract_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/pkg/contract"
)

// What a check says is bounded, whatever the value: twelve bytes of number do not make a
// megabyte of message, and many problems do not make a long one.
func TestMessagesAreBounded(t *testing.T) {
	k, err := compileJSON(t, `{"name":"t","input_schema":{"type":"object","properties":{
		"delay_ms":{"type":"number","minimum":0,"maximum":1000},
		"tiny":{"type":"number","exclusiveMinimum":1},
		"big":{"type":"integer","maximum":12345678901234567890123456789012345678901234567890}}}}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ args, want string }{
		{`{"delay_ms":1e999999}`, "delay_ms: is 1e+999999; at most 1000"},
		{`{"delay_ms":-1e999999}`, "delay_ms: is -1e+999999; at least 0"},
		{`{"tiny":1e-999999}`, "tiny: is 1e-999999; must be more than 1"},
		{`{"big":1e60}`, "big: is 1e+60; at most 1.23456789012e+49"},
		{`{"delay_ms":1001}`, "delay_ms: is 1001; at most 1000"},
		{`{"delay_ms":-0.5}`, "delay_ms: is -0.5; at least 0"},
	} {
		err := k.CheckInput([]byte(tc.args))
		if err == nil || err.Error() != tc.want {
			msg := fmt.Sprint(err)
			t.Errorf("%s: %d bytes %q, want %q", tc.args, len(msg), shortened(msg), tc.want)
		}
	}
	// Many problems, each long: the whole message stays within a few KiB.
	var props, args []string
	for i := range 40 {
		name := fmt.Sprintf("f%d_%s", i, strings.Repeat("n", 60))
		props = append(props, fmt.Sprintf(`%q:{"type":"string","description":%q,"enum":[%s]}`, name, strings.Repeat("d", 3000), enum(200)))
		args = append(args, fmt.Sprintf(`%q:"x"`, name))
	}
	k, err = compileJSON(t, `{"name":"t","input_schema":{"type":"object","properties":{`+strings.Join(props, ",")+`}}}`)
	if err != nil {
		t.Fatal(err)
	}
	err = k.CheckInput([]byte(`{` + strings.Join(args, ",") + `}`))
	if err == nil || len(err.Error()) > 4<<10 {
		t.Errorf("forty problems: %d bytes", len(fmt.Sprint(err)))
	}
	var ae *contract.ArgumentsError
	if !errors.As(err, &ae) || len(ae.Hint) > 4<<10 {
		t.Errorf("forty problems' hint: %d bytes", len(fmt.Sprint(ae)))
	}
}

func enum(n int) string {
	vals := make([]string, n)
	for i := range vals {
		vals[i] = fmt.Sprintf(`"value-%d-%s"`, i, strings.Repeat("v", 50))
	}
	return strings.Join(vals, ",")
}

func shortened(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}
