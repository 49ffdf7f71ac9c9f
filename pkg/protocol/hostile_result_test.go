package protocol_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Arguments cannot make the refusal Hermes records large: what the door lets through and a
// contract refuses gets a BAD_ARGUMENTS result (text and hint), built as the router builds it,
// within a few KiB, however much of the arguments the contract's message quotes. Before numbers
// were bounded at the door, {"delay_ms":1e999999} made a result of a megabyte.
func TestRefusalOfHostileArgumentsIsSmall(t *testing.T) {
	var c contract.Contract
	schema := `{"name":"sleep","input_schema":{
		"delay_ms":{"type":"number","required":true,"minimum":1,"maximum":100},
		"label":{"type":"string","max_length":8},
		"slots":{"type":"array","items":{"type":"number","maximum":1}}}}`
	if err := json.Unmarshal([]byte(schema), &c); err != nil {
		t.Fatal(err)
	}
	k, err := contract.Compile(&c, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	slots := strings.TrimSuffix(strings.Repeat(strings.Repeat("9", 64)+"e260,", 3000), ",")
	for _, args := range []string{
		`{"delay_ms":1e999999}`,
		`{"delay_ms":` + strings.Repeat("9", 64) + `e260}`,
		`{"delay_ms":1e324,"slots":[-1e-324,1e324,1e324,1e324,1e324,1e324,1e324,1e324,1e324,1e324,1e324,1e324]}`,
		`{"delay_ms":5,"label":"` + strings.Repeat("x", 200<<10) + `"}`,
		`{"delay_ms":-1e-300,"slots":[` + slots + `]}`,
	} {
		lim := protocol.Limits{}
		if err := protocol.CheckArguments("arguments", []byte(args), lim); err != nil {
			continue // refused at the door: no contract reads it, nothing is recorded
		}
		err := k.CheckInput(json.RawMessage(args))
		if err == nil {
			t.Fatalf("%.40s…: the contract took it", args)
		}
		hint := "call sleep again with arguments that follow its input_schema"
		var ae *contract.ArgumentsError
		if errors.As(err, &ae) {
			hint = ae.Hint
		}
		r := protocol.ErrorResult(protocol.CodeBadArguments, protocol.OriginHermes, hint, err.Error())
		r.ToolCallID, r.Name = "c", "sleep"
		m, _ := protocol.NewMessage(protocol.TypeToolResult, &r)
		b, _ := protocol.Marshal(m)
		if len(r.Content)+len(r.RecoveryHint) > 6<<10 || len(b) > 8<<10 {
			t.Errorf("%.40s…: a refusal of %d bytes of text and hint, %d on the bus (the contract said %d bytes)",
				args, len(r.Content)+len(r.RecoveryHint), len(b), len(err.Error()))
		}
	}
}
