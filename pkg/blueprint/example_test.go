package blueprint_test

import (
	"encoding/json"
	"fmt"

	"github.com/hermesbus/hermes/pkg/blueprint"
)

func Example() {
	b, err := blueprint.Parse([]byte(`
name: check_and_urge
steps:
  - tool: order_query
    input_mapping: {order_id: $.user_input.order_id}
    output_key: order_data
  - tool: logistics_urge
    input_mapping: {order_id: $.order_data.success.order_id, reason: 用户咨询发货进度}
    condition: $.order_data.success.status == 'created' || $.order_data.success.status == 'paid'
    output_key: urge_result
fallback: {message: 订单状态异常，已转人工客服, transfer_to: human_agent}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	known := map[string]bool{"order_query": true, "logistics_urge": true}
	if err := b.Compile(func(name string) bool { return known[name] }); err != nil {
		fmt.Println(err)
		return
	}
	var ctx map[string]any
	_ = json.Unmarshal([]byte(`{"user_input": {"order_id": "A-17"}, "order_data": {"success": {"order_id": "A-17", "status": "shipped"}}}`), &ctx)
	for _, n := range b.Nodes() {
		ev, err := n.Step.Allowed(ctx)
		if err != nil {
			fmt.Println(err)
			return
		}
		if !ev.Result {
			fmt.Printf("step %s skipped: %v\n", n.Step.ID(), ev.Values)
			continue
		}
		args, err := n.Step.Inputs(ctx)
		fmt.Printf("step %s calls %s with %s %v\n", n.Step.ID(), n.Step.Tool, args, err)
	}
	// Output:
	// step 0 calls order_query with {"order_id":"A-17"} <nil>
	// step 1 skipped: map[$.order_data.success.status:shipped]
}
