package policies

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hermesbus/hermes/internal/router"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Replay decides as the stage does: the same calls, at the same times, under the same rules,
// get the same decisions from both — roles, recipients, confirmation, and rate windows that
// fill, refuse, make calls wait and slide.
func TestReplayDecidesAsTheStage(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	rs := rules{
		"meeting_book": {Tool: "meeting_book", Policy: mustPolicy(t, `{"allowed_roles":["admin"],"rate_limit":"3/min"}`), Source: SourcePolicy, Version: 2},
		"notify_send":  {Tool: "notify_send", Policy: mustPolicy(t, `{"max_recipients":2}`), Source: SourceContract, Version: 1},
		"pay":          {Tool: "pay", Policy: mustPolicy(t, `{"confirm_required":true}`), Source: SourcePolicy, Version: 1},
		"slow":         {Tool: "slow", Policy: mustPolicy(t, `{"rate_limit":"1/s","on_limit":"wait","scope":"tool"}`), Source: SourcePolicy, Version: 1},
	}
	st := &Stage{Rules: rs, Windows: &Windows{KV: bustest.NewMemKV(), Now: func() time.Time { return now }}, Approvals: parkAll{}}
	rep := NewReplay()
	k := compiled(t, `{"name":"notify_send","recipients":["user_ids"]}`)
	steps := []struct {
		after      time.Duration
		role, tool string
		args       string
		want       string
	}{
		{0, "user", "meeting_book", `{}`, "denied allowed_roles"},
		{0, "admin", "meeting_book", `{}`, "allowed "},
		{time.Second, "admin", "meeting_book", `{}`, "allowed "},
		{time.Second, "admin", "meeting_book", `{}`, "allowed "},
		{time.Second, "admin", "meeting_book", `{}`, "limited rate_limit"},
		{time.Minute, "admin", "meeting_book", `{}`, "allowed "},
		{0, "user", "notify_send", `{"user_ids":["a","b","c"]}`, "denied max_recipients"},
		{0, "user", "notify_send", `{"user_ids":["a","b"]}`, "allowed "},
		{0, "user", "pay", `{}`, "parked confirm_required"},
		{0, "user", "slow", `{}`, "allowed "},
		{0, "user", "slow", `{}`, "waited rate_limit"},
	}
	for i, s := range steps {
		now = now.Add(s.after)
		j := stageJob(t, fmt.Sprint("r", i), s.role, s.tool, s.args)
		j.Msg.CreatedAt = now
		var kk *contract.Compiled
		if s.tool == "notify_send" {
			kk = k
		}
		j.Calls[0].Contract = kk
		if _, err := st.Process(t.Context(), j); err != nil {
			t.Fatal(err)
		}
		stage := stageDecision(j.Calls[0])
		d := rep.Decide(now, j.Msg, j.Calls[0].Call, kk, rs[s.tool])
		replayed := d.Decision + " " + d.Rule
		if stage != s.want || replayed != s.want {
			t.Errorf("step %d (%s by %s): the stage decided %q, the replay %q; want %q", i, s.tool, s.role, stage, replayed, s.want)
		}
		if d.Source != rs[s.tool].Source || d.Version != rs[s.tool].Version {
			t.Errorf("step %d: decided under %s v%d", i, d.Source, d.Version)
		}
		if s.want == "waited rate_limit" && !d.RetryAt.Equal(j.Calls[0].Hold.At) {
			t.Errorf("step %d: the replay waits until %v, the stage until %v", i, d.RetryAt, j.Calls[0].Hold.At)
		}
	}
	if d := rep.Decide(now, stageJob(t, "x", "", "none", `{}`).Msg, &protocol.ToolCall{Name: "none"}, nil, nil); d != nil {
		t.Fatalf("a tool with no policy: %+v", d)
	}
}

// stageDecision is what the stage decided about c: "decision rule".
func stageDecision(c *router.Call) string {
	switch {
	case c.Hold != nil:
		return protocol.PolicyWaited + " rate_limit"
	case c.Result != nil && c.Result.Policy != nil:
		return c.Result.Policy.Decision + " " + c.Result.Policy.Rule
	case c.Policy != nil:
		return c.Policy.Decision + " " + c.Policy.Rule
	}
	return "?"
}

// parkAll parks every call to confirm, as approvals not yet decided do.
type parkAll struct{}

func (parkAll) Release(context.Context, *router.Job, *router.Call, *protocol.PolicyDecision) error {
	return nil
}

func (parkAll) Gate(_ context.Context, _ *router.Job, _ *router.Call, r *Rule) (*protocol.ToolResult, *protocol.PolicyDecision, error) {
	res := protocol.ErrorResult(protocol.CodeApprovalRequired, protocol.OriginHermes, "ask", "approval required")
	res.Policy = r.decision(protocol.PolicyParked, "confirm_required", "")
	return &res, nil, nil
}
