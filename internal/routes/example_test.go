package routes_test

import (
	"fmt"

	"github.com/hermesbus/hermes/internal/routes"
)

func ExampleTable_Match() {
	table, err := routes.Parse("routes.yaml", []byte(`
version: 1.0
rules:
  - name: get_policy_status_by_name
    match:
      tool_name: get_policy_status
      intent_regex: "^(?:查询|查看).*?(?P<holder>[\\u4e00-\\u9fa5]{2,4})的.*?保单"
    action:
      http:
        url: http://policy-service:8000/v1/policy/status
        method: get
        retry: {max_attempts: 3}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	rule, params, ok := table.Match("get_policy_status", "查询王五的保单状态")
	fmt.Println(ok, rule.Name, params["holder"])
	fmt.Println(rule.Action.HTTP.Method, rule.Action.TimeoutMS, rule.Action.Retry.MaxAttempts)

	_, _, ok = table.Match("get_policy_status", "保单状态查询")
	fmt.Println(ok)
	// Output:
	// true get_policy_status_by_name 王五
	// GET 10000 3
	// false
}

func ExampleLoadError() {
	_, err := routes.Parse("routes.yaml", []byte(`
version: 1.0
rules:
  - name: search
    match:
      tool_nam: search_knowledge_base
    action:
      http: {url: "http://knowledge-service:8000/v1/search"}
`))
	fmt.Println(err)
	// Output:
	// routes.yaml:6: rules[0].match.tool_nam: unknown field (did you mean tool_name?)
}
