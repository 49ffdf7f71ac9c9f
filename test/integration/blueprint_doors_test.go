package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/blueprints"
	"github.com/hermesbus/hermes/internal/scriptedllm"
)

// mcpTool finds the tool name in an MCP tools/list, nil when it is not listed.
func mcpTool(t *testing.T, cs *mcp.ClientSession, name string) *mcp.Tool {
	t.Helper()
	list, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tl := range list.Tools {
		if tl.Name == name {
			return tl
		}
	}
	return nil
}

// The seed's blueprint through MCP: tools/list shows it with its description and a schema
// requiring order_id; tools/call of a paid order urges it (urge_result, its ticket URG-…), the
// run kept as any run is (GET /v1/runs/{id}); an unknown order is an error result naming the
// fallback's hand-off; a role its policy does not allow is not offered it.
func TestABlueprintIsAnMCPTool(t *testing.T) {
	t.Parallel()
	s := start(t, options{routesFile: "../../examples/routes.yaml", callers: true, workers: 1})
	keys := callerKeys(t, s, map[string]auth.Role{"ann": auth.RoleUser, "root": auth.RoleAdmin})
	if code, body := s.call(http.MethodPost, "/api/v1/blueprints", keys["root"], seedBlueprint(t), "Content-Type", "application/json"); code != http.StatusCreated {
		t.Fatalf("register: %d %s", code, body)
	}
	cs := mcpClient(t, &keyed{key: keys["ann"], bases: []string{s.base}})
	tool := mcpTool(t, cs, "check_and_urge")
	if tool == nil {
		t.Fatal("tools/list does not list check_and_urge")
	}
	schema, _ := json.Marshal(tool.InputSchema)
	if tool.Description != "先查订单状态，若未发货则触发物流催促" || !strings.Contains(string(schema), `"order_id"`) || !strings.Contains(string(schema), `"required":["order_id"]`) {
		t.Errorf("check_and_urge: %q %s", tool.Description, schema)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	paid := s.demoOrder(0, "paid", "created")
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "check_and_urge", Arguments: map[string]any{"order_id": paid}})
	if err != nil || res.IsError {
		t.Fatalf("a paid order: %v %s", err, text(res))
	}
	var o blueprints.Outcome
	raw, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(raw, &o); err != nil || o.Status != blueprints.Succeeded || !strings.Contains(string(o.Outputs["urge_result"]), "URG-") ||
		!strings.Contains(string(o.Outputs["order_data"]), paid) {
		t.Fatalf("a paid order: %v %s", err, raw)
	}
	if run := s.runOf(keys["ann"], o.RunID); run.Status != blueprints.Succeeded || run.Blueprint != "check_and_urge" {
		t.Errorf("the run: %+v", run)
	}

	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "check_and_urge", Arguments: map[string]any{"order_id": "ORD209901010001"}})
	if err != nil || !res.IsError || !strings.Contains(text(res), "BLUEPRINT_TRANSFERRED") || !strings.Contains(text(res), "human_agent") ||
		!strings.Contains(text(res), "订单状态异常，已转人工客服") || !strings.Contains(text(res), "0 (order_query)") {
		t.Errorf("an unknown order: %v %s", err, text(res))
	}

	// Its policy allows admins only: ann is no longer offered it; root is.
	s.applyPolicy("check_and_urge", `{"allowed_roles":["admin"]}`)
	waitFor(t, "check_and_urge left out of ann's tools", func() bool { return mcpTool(t, cs, "check_and_urge") == nil })
	root := mcpClient(t, &keyed{key: keys["root"], bases: []string{s.base}})
	if mcpTool(t, root, "check_and_urge") == nil {
		t.Error("an admin is not offered check_and_urge")
	}
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "check_and_urge", Arguments: map[string]any{"order_id": paid}})
	if err != nil || !res.IsError {
		t.Errorf("ann calls it anyway: %v %s", err, text(res))
	}
	t.Logf("ann calls it anyway: %s", text(res))
}

// The seed's blueprint in the chat loop: the model is offered check_and_urge, calls it for an
// order not yet shipped, and reads the run's outputs — the urge's ticket — as that call's tool
// result, as the record's decision shows; the run is kept as any run is (GET /v1/runs/{id}).
func TestTheChatLoopRunsABlueprint(t *testing.T) {
	t.Parallel()
	// An order placed today is created or paid (the demo orders' first day): urged.
	order := "ORD" + time.Now().In(time.FixedZone("CST", 8*3600)).Format("20060102") + "0001"
	script := &scriptedllm.Script{Conversations: []scriptedllm.Conversation{{Name: "urge", Turns: []scriptedllm.Turn{
		{ToolCalls: []scriptedllm.ToolCall{{ID: "call_urge", Name: "check_and_urge", Arguments: map[string]any{"order_id": order}}}},
		{Content: "已为您催促发货"},
	}}}}
	cs := startChat(t, "chat-blueprint", script, nil)
	key := cs.sys.Key.Key
	waitFor(t, "check_and_urge registered", func() bool {
		code, _ := cs.call(t, http.MethodPost, "/api/v1/blueprints", key, seedBlueprint(t))
		return code == http.StatusCreated || code == http.StatusOK
	})
	resp, err := cs.client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "scripted",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("帮我催一下订单 " + order + " 的发货")}},
		option.WithHeader("X-Hermes-Session-ID", "sess_chat_blueprint"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Choices[0].Message.Content != "已为您催促发货" {
		t.Fatalf("%+v", resp)
	}
	reqs := cs.model.Requests()
	var offered bool
	for _, tl := range reqs[0].Tools {
		offered = offered || tl.Function.Name == "check_and_urge" && strings.Contains(string(tl.Function.Parameters), `"required":["order_id"]`)
	}
	if !offered {
		t.Errorf("check_and_urge was not offered: %+v", reqs[0].Tools)
	}
	var read string
	for _, m := range reqs[1].Messages {
		if m.Role == "tool" && m.ToolCallID == "call_urge" {
			read = m.Text()
		}
	}
	var result struct {
		Tool    string             `json:"tool"`
		Status  string             `json:"status"`
		Content blueprints.Outcome `json:"content"`
	}
	if err := json.Unmarshal([]byte(read), &result); err != nil || result.Status != "ok" || result.Content.Status != blueprints.Succeeded ||
		!strings.Contains(string(result.Content.Outputs["urge_result"]), "URG-") {
		t.Fatalf("the model read %s (%v)", read, err)
	}
	_, entries := cs.transcript(t, "sess_chat_blueprint")
	ds := decisionsOf(entries)
	if len(ds) != 2 || len(ds[0].Chosen) != 1 || ds[0].Chosen[0].Name != "check_and_urge" {
		t.Fatalf("decisions %+v", ds)
	}
	var recorded bool
	for _, m := range ds[1].Messages {
		recorded = recorded || m.Role == "tool" && m.ToolCallID == "call_urge" && strings.Contains(m.Content, "URG-")
	}
	if !recorded {
		t.Errorf("the second decision does not record the urge: %+v", ds[1].Messages)
	}
	code, body := cs.call(t, http.MethodGet, "/v1/runs/"+result.Content.RunID, key, "")
	var run blueprints.Run
	if code != http.StatusOK || json.Unmarshal([]byte(body), &run) != nil || run.Status != blueprints.Succeeded || run.Blueprint != "check_and_urge" ||
		!strings.Contains(string(run.UserInput), order) {
		t.Errorf("the run: %d %s", code, body)
	}
}
