package mcpserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/blueprints"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// blueprintTools are the blueprints a caller of role may run, as tools: each but those named
// as a registered tool, its input schema typed by the registered tools' arguments.
func (m *Server) blueprintTools(ctx context.Context, role string, tools []*contract.Compiled, registered map[string]bool) ([]*mcp.Tool, error) {
	if m.env.Blueprints == nil {
		return nil, nil
	}
	bps, err := m.env.Blueprints(ctx, role)
	if err != nil {
		return nil, err
	}
	args := contract.ArgumentSchemas(tools)
	var out []*mcp.Tool
	for _, b := range bps {
		if registered[b.Name] {
			continue // the tool is what the name calls
		}
		out = append(out, &mcp.Tool{Name: b.Name, Description: b.Description, InputSchema: b.InputSchema(args)})
	}
	return out, nil
}

// isBlueprint reports whether a tools/call of name runs a blueprint: one c's caller may run,
// no registered tool named so.
func (m *Server) isBlueprint(ctx context.Context, c *mcpCall, name string) (bool, error) {
	if m.env.Blueprints == nil {
		return false, nil
	}
	tools, err := m.env.Contracts.Tools(ctx)
	if err != nil {
		return false, err
	}
	for _, k := range tools {
		if k.Name == name {
			return false, nil
		}
	}
	bps, err := m.env.Blueprints(ctx, c.actor.Role())
	if err != nil {
		return false, err
	}
	for _, b := range bps {
		if b.Name == name {
			return true, nil
		}
	}
	return false, nil
}

// runBlueprint is tools/call of a blueprint: its run, begun (or found, the call sent again) and
// waited for up to MaxWait.
func (m *Server) runBlueprint(ctx context.Context, c *mcpCall, name string, args json.RawMessage) (mcp.Result, error) {
	runID := ""
	if c.session != "" {
		// The session's call with this JSON-RPC id is one run, whoever sends it again.
		sum := sha256.Sum256([]byte("blueprint\x00" + c.actor.Owner() + "\x00" + c.session + "\x00" + c.rpcID))
		runID = "mcp-" + hex.EncodeToString(sum[:20])
	}
	run, _, err := m.env.RunBlueprint(ctx, c.actor, blueprints.Ask{Name: name, RunID: runID, UserInput: args, Trace: c.trace, Wait: m.env.MaxWait})
	var refused *blueprints.Refusal
	switch {
	case errors.As(err, &refused):
		switch refused.Code {
		case protocol.CodeRunIDConflict:
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: "this JSON-RPC id was used in this session for another call"}
		case protocol.CodeInvalidRequest:
			return mcpError(protocol.CodeBadArguments, refused.Message, "send the arguments as the tool's input schema says"), nil
		}
		hint := ""
		switch refused.Status {
		case http.StatusTooManyRequests:
			hint = "call again later"
		case http.StatusNotFound:
			hint = "call one of the tools tools/list names"
		}
		return mcpError(refused.Code, refused.Message, hint), nil
	case admission.AsRefusal(err) != nil:
		r := admission.AsRefusal(err)
		if r.Status == http.StatusTooManyRequests {
			return mcpError(r.Code, r.Message, "call again later"), nil
		}
		return nil, rpcError(r)
	case ctx.Err() != nil:
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the client went away; a run begun goes on: send the call again with the same id to receive its result"}
	case err != nil:
		m.log.Warn("run a blueprint", "blueprint", name, "run_id", runID, "err", err)
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the run could not be begun; send the call again with the same id"}
	}
	return blueprintResult(run.Outcome()), nil
}

// blueprintResult is a run as an MCP client reads it: the outcome as JSON text and as
// structured content; an error result, led by its code and summary, when a fallback ended it.
func blueprintResult(o blueprints.Outcome) *mcp.CallToolResult {
	data := o.JSON()
	res := &mcp.CallToolResult{StructuredContent: data, Content: []mcp.Content{&mcp.TextContent{Text: string(data)}}}
	if o.Status != blueprints.Succeeded {
		// Ended by a fallback (an error result), or going on.
		res.IsError = o.Status.Final()
		res.Content = append([]mcp.Content{&mcp.TextContent{Text: o.Code() + ": " + o.Summary()}}, res.Content...)
	}
	return res
}
