package chat

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"time"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/blueprints"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Blueprints as the model's tools: each blueprint the run's caller may run (Env.Blueprints) is
// offered as a function, its description and its user_input's schema (blueprint.InputSchema,
// typed by the registered tools' arguments), prefiltered with the registered tools. A call of
// one runs it (Env.RunBlueprint) beside the turn's request, under a run id that follows from
// the caller, the turn's request id and the call's id — a run repeated is the same run — and
// waits for it as a turn waits for its results. The model reads the run as an MCP client does
// (blueprints.Outcome): its outputs by output_key; the fallback taken, as a failed result; or,
// while it goes on, where to follow it.

// blueprintOffers are the blueprints a caller of role may run, as offers: each but those named
// as a registered tool (of all, registered).
func (s *Server) blueprintOffers(ctx context.Context, role string, registered []*contract.Compiled) ([]offer, error) {
	if s.env.Blueprints == nil {
		return nil, nil
	}
	bps, err := s.env.Blueprints(ctx, role)
	if err != nil || len(bps) == 0 {
		return nil, err
	}
	taken := make(map[string]bool, len(registered))
	for _, k := range registered {
		taken[k.Name] = true
	}
	args := contract.ArgumentSchemas(registered)
	var out []offer
	for _, b := range bps {
		if taken[b.Name] {
			continue
		}
		raw := b.InputSchema(args)
		var schema map[string]any
		if json.Unmarshal(raw, &schema) != nil {
			continue
		}
		out = append(out, offer{name: b.Name, description: b.Description, schema: schema, bp: b,
			sig: "blueprint\x00" + b.Name + "\x00" + b.Description + "\x00" + string(raw)})
	}
	return out, nil
}

// checkBounds is what the model's calls of a blueprint are checked with before they run: the
// bounds every request's arguments keep. The run checks the rest (its first step's arguments).
func (c *chatRun) checkBounds(args json.RawMessage) error {
	return protocol.CheckArguments("arguments", args, c.s.env.Limits)
}

// runBlueprint runs the model's call of a blueprint (an agent.Tool's Local) and returns the run
// as the model reads it; what refused or cut it short is a failed result.
func (c *chatRun) runBlueprint(ctx context.Context, requestID string, call protocol.ToolCall) protocol.ToolResult {
	s := c.s
	sum := sha256.Sum256([]byte("blueprint\x00" + c.a.Owner() + "\x00" + requestID + "\x00" + call.ToolCallID))
	runID := "chat-" + hex.EncodeToString(sum[:20])
	// A call waits for its run at most MaxWait, and never past the chat run's deadline.
	wait := s.env.MaxWait
	if d, ok := ctx.Deadline(); ok && time.Until(d) < wait {
		wait = time.Until(d)
	}
	c.dispatched.Store(true)
	started := time.Now()
	run, _, err := s.env.RunBlueprint(ctx, c.a, blueprints.Ask{Name: call.Name, RunID: runID, UserInput: call.Arguments, Trace: c.trace, Wait: max(wait, time.Millisecond)})
	res := blueprintResult(ctx, run, err)
	if err != nil && admission.AsRefusal(err) == nil && !errors.As(err, new(*blueprints.Refusal)) && ctx.Err() == nil {
		s.log.Warn("run a blueprint", "blueprint", call.Name, "run_id", runID, "session_id", c.session, "err", err)
	}
	c.noteLocal(requestID, call, res, started, map[string]any{"run_id": runID})
	return res
}

// blueprintResult is a run (or why there is none) as the model reads it: the run's outcome as
// the content; a fallback that ended it is a failed result, its summary the recovery hint.
func blueprintResult(ctx context.Context, run *blueprints.Run, err error) protocol.ToolResult {
	failed := func(code, hint string) protocol.ToolResult {
		return protocol.ToolResult{Status: protocol.ResultError, ErrorCode: code, ErrorOrigin: protocol.OriginHermes, RecoveryHint: hint}
	}
	var refused *blueprints.Refusal
	switch {
	case errors.As(err, &refused):
		code := refused.Code
		if code == protocol.CodeInvalidRequest {
			code = protocol.CodeBadArguments // the model's to correct
		}
		return failed(code, refused.Message)
	case admission.AsRefusal(err) != nil:
		r := admission.AsRefusal(err)
		return failed(r.Code, r.Message)
	case err != nil && ctx.Err() != nil:
		return failed(protocol.CodeCancelled, "the run ended before the blueprint's run could be begun")
	case err != nil:
		return failed(protocol.CodeBusUnavailable, "the blueprint's run could not be begun; nothing of it ran")
	}
	o := run.Outcome()
	res := protocol.ToolResult{Status: protocol.ResultOK, Content: o.JSON()}
	if o.Status == blueprints.Failed || o.Status == blueprints.Transferred {
		res.Status, res.ErrorCode, res.ErrorOrigin, res.RecoveryHint = protocol.ResultError, o.Code(), protocol.OriginHermes, o.Summary()
	}
	return res
}

// noteLocal notes what a call of a Local tool (a blueprint, memory_write) came to, begun at
// started, with extra fields, among the run's calls, and tells a stream of it.
func (c *chatRun) noteLocal(requestID string, call protocol.ToolCall, res protocol.ToolResult, started time.Time, extra map[string]any) {
	done := map[string]any{"request_id": requestID, "tool_call_id": call.ToolCallID, "name": call.Name, "status": res.Status,
		"execution_time_ms": time.Since(started).Milliseconds()}
	for k, v := range extra {
		done[k] = v
	}
	if res.ErrorCode != "" {
		done["error_code"] = res.ErrorCode
	}
	c.mu.Lock()
	c.calls = append(c.calls, done)
	c.mu.Unlock()
	if c.progress != nil {
		c.progress(map[string]any{"event": "results", "request_id": requestID, "results": []map[string]any{done}})
	}
}
