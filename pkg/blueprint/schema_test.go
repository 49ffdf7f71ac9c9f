package blueprint

import (
	"encoding/json"
	"testing"
)

func TestInputSchema(t *testing.T) {
	args := func(tool, arg string) json.RawMessage {
		switch tool + "." + arg {
		case "order_query.order_id":
			return json.RawMessage(`{"type":"string","pattern":"^ORD[0-9]{12}$"}`)
		case "notify.text":
			return json.RawMessage(`"not an object"`)
		}
		return nil
	}
	for _, c := range []struct {
		name, src string
		arg       ArgSchema
		want      string
	}{
		{"the seed's: order_id required, typed by order_query", seedSrc, args,
			`{"type":"object","properties":{"order_id":{"type":"string","pattern":"^ORD[0-9]{12}$"}},"required":["order_id"]}`},
		{"without argument schemas: unconstrained", seedSrc, nil,
			`{"type":"object","properties":{"order_id":{}},"required":["order_id"]}`},
		{"keys of later steps, conditions, nested mappings and fallbacks: optional", `{"name":"b","steps":[
			{"tool":"order_query","input_mapping":{"order_id":"$.user_input.order_id","opts":{"lang":"$.user_input.lang"}},"output_key":"o"},
			{"tool":"notify","input_mapping":{"text":"$.user_input.text","to":"$.o.user"},"condition":"$.user_input.notify == true","output_key":"n",
			 "fallback":{"step":{"tool":"log","input_mapping":{"line":"$.user_input.why"}}}},
			{"parallel":[{"tool":"a","input_mapping":{"x":"$.user_input.items[0]"}},{"tool":"b","input_mapping":{"all":"$.user_input","any":"$.user_input[*]"}}]}],
			"fallback":{"step":{"tool":"log","input_mapping":{"line":"$.user_input['the reason']"}}}}`, args,
			`{"type":"object","properties":{"items":{},"lang":{},"notify":{},"order_id":{"type":"string","pattern":"^ORD[0-9]{12}$"},"text":{},"the reason":{},"why":{}},"required":["lang","order_id"]}`},
		{"a first step with a condition requires nothing", `{"name":"b","steps":[
			{"tool":"order_query","input_mapping":{"order_id":"$.user_input.order_id"},"condition":"$.user_input.go == true","output_key":"o"}]}`, args,
			`{"type":"object","properties":{"go":{},"order_id":{"type":"string","pattern":"^ORD[0-9]{12}$"}}}`},
		{"a first group requires nothing", `{"name":"b","steps":[{"parallel":[{"tool":"order_query","input_mapping":{"order_id":"$.user_input.id"}}]}]}`, args,
			`{"type":"object","properties":{"id":{"type":"string","pattern":"^ORD[0-9]{12}$"}}}`},
		{"no user_input read", `{"name":"b","steps":[{"tool":"ping"}]}`, args, `{"type":"object","properties":{}}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := compiled(t, c.src)
			if got := string(b.InputSchema(c.arg)); got != c.want {
				t.Errorf("\n got %s\nwant %s", got, c.want)
			}
		})
	}
	b, err := Parse([]byte(seedSrc))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(b.InputSchema(args)); got != `{"type":"object"}` {
		t.Errorf("before Compile: %s", got)
	}
}

const seedSrc = `{"name":"check_and_urge","steps":[
	{"tool":"order_query","input_mapping":{"order_id":"$.user_input.order_id"},"output_key":"order_data"},
	{"tool":"logistics_urge","input_mapping":{"order_id":"$.order_data.success.order_id","reason":"r"},
	 "condition":"$.order_data.success.status == 'paid'","output_key":"urge_result"}],
	"fallback":{"message":"m","transfer_to":"human_agent"}}`
