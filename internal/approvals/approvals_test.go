package approvals

import (
	"encoding/json"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/hermesbus/hermes/internal/policies"
	"github.com/hermesbus/hermes/internal/router"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/policy"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// An approval is decided once, by whom its policy names, and runs one call once: the same
// tool, arguments and caller; a redelivery of that call runs again, any other is refused.
func TestApprovalIsDecidedOnceAndUsedOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := &Store{KV: bustest.NewMemKV()}
	ann := &protocol.Caller{ID: "key:ann", Role: "user"}
	bob := &protocol.Caller{ID: "key:bob", Role: "admin"}
	now := time.Unix(1_000_000, 0)
	args := json.RawMessage(`{"n":1}`)
	a := &Approval{ID: ID("r1", "c1"), RequestID: "r1", SessionID: "s", ToolCallID: "c1", Tool: "pay", Arguments: args,
		Hash: Hash("pay", args, ann), Requester: ann, State: Pending, CreatedAt: now, ExpiresAt: now.Add(time.Minute)}
	if _, created, err := s.Create(ctx, a); err != nil || !created {
		t.Fatal(created, err)
	}
	if _, created, _ := s.Create(ctx, a); created {
		t.Fatal("created twice")
	}
	if _, err := s.Use(ctx, a.ID, a.Hash, "x/c1", now); !errors.Is(err, ErrPending) {
		t.Fatalf("used while pending: %v", err)
	}
	if _, err := s.Decide(ctx, a.ID, Decider{Caller: bob}, true, "", now); !errors.Is(err, ErrForbidden) {
		t.Fatalf("another caller decided the requester's approval: %v", err)
	}
	if _, err := s.Decide(ctx, a.ID, Decider{Caller: ann}, true, "", now); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Decide(ctx, a.ID, Decider{Caller: ann}, false, "", now); !errors.Is(err, ErrDecided) {
		t.Fatalf("decided twice: %v", err)
	}
	if _, err := s.Use(ctx, a.ID, Hash("pay", json.RawMessage(`{"n":2}`), ann), "x/c1", now); !errors.Is(err, ErrForbidden) {
		t.Fatalf("used with other arguments: %v", err)
	}
	if _, err := s.Use(ctx, a.ID, Hash("pay", args, bob), "x/c1", now); !errors.Is(err, ErrForbidden) {
		t.Fatalf("used by another caller: %v", err)
	}
	if _, err := s.Use(ctx, a.ID, a.Hash, "x/c1", now); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Use(ctx, a.ID, a.Hash, "x/c1", now); err != nil {
		t.Fatalf("a redelivery of the call that used it: %v", err)
	}
	if _, err := s.Use(ctx, a.ID, a.Hash, "y/c1", now); !errors.Is(err, ErrDecided) {
		t.Fatalf("used by a second call: %v", err)
	}
}

// Undecided past its expiry, an approval expires (once) and cannot be approved; with
// approvers, only another caller of their roles decides.
func TestApprovalExpiresAndFourEyes(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := &Store{KV: bustest.NewMemKV()}
	ann := &protocol.Caller{ID: "key:ann", Role: "admin"}
	now := time.Unix(1_000_000, 0)
	a := &Approval{ID: ID("r1", "c1"), RequestID: "r1", SessionID: "s", ToolCallID: "c1", Tool: "pay", Arguments: json.RawMessage(`{}`),
		Hash: "h", Requester: ann, Approvers: []string{"admin"}, State: Pending, CreatedAt: now, ExpiresAt: now.Add(time.Minute)}
	if _, _, err := s.Create(ctx, a); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Decide(ctx, a.ID, Decider{Caller: ann, Approver: true}, true, "", now); !errors.Is(err, ErrForbidden) {
		t.Fatalf("the requester approved its own call: %v", err)
	}
	if _, err := s.Decide(ctx, a.ID, Decider{Caller: &protocol.Caller{ID: "key:op", Role: "operator"}}, true, "", now); !errors.Is(err, ErrForbidden) {
		t.Fatalf("a role not among the approvers approved: %v", err)
	}
	if _, expired, err := s.Expire(ctx, a.ID, now.Add(30*time.Second)); expired || err != nil {
		t.Fatalf("expired early: %v %v", expired, err)
	}
	if _, err := s.Decide(ctx, a.ID, Decider{Caller: &protocol.Caller{ID: "key:boss", Role: "admin"}}, true, "", now.Add(2*time.Minute)); !errors.Is(err, ErrExpired) {
		t.Fatalf("approved after its expiry: %v", err)
	}
	if got, _, _ := s.Get(ctx, a.ID); got.State != Expired {
		t.Fatalf("state %s", got.State)
	}
}

// What the bucket holds is read as an approval only when it is one of its key.
func FuzzDecode(f *testing.F) {
	good, _ := json.Marshal(&Approval{ID: "apr-0123456789abcdef01234567", Hash: "h", State: Pending})
	f.Add(good)
	f.Add([]byte(`{"id":"apr-0123456789abcdef01234567","hash":"h","state":"bogus"}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := decode("apr-0123456789abcdef01234567", data)
		if err == nil && (a.ID != "apr-0123456789abcdef01234567" || a.Hash == "") {
			t.Fatalf("decoded %+v", a)
		}
	})
}

// Four eyes are two callers: the requester acting for another user is still the requester.
func TestFourEyesAreTwoCallers(t *testing.T) {
	t.Parallel()
	a := &Approval{Tool: "pay", Requester: &protocol.Caller{ID: "key:k", Role: "admin"}, Approvers: []string{"admin"}}
	if err := MayDecide(a, Decider{Caller: &protocol.Caller{ID: "key:k", Role: "admin", User: "someone"}}); !errors.Is(err, ErrForbidden) {
		t.Fatalf("the requester, naming a user, approved its own call: %v", err)
	}
}

// A call approved and then kept from running by a later rule (its rate window full) leaves its
// approval approved, for the call's next try — not used up.
func TestAFullWindowDoesNotUseTheApproval(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	store := &Store{KV: bustest.NewMemKV()}
	var p policy.Policy
	if err := json.Unmarshal([]byte(`{"confirm_required":true,"rate_limit":"1/h","scope":"tool"}`), &p); err != nil {
		t.Fatal(err)
	}
	windows := &policies.Windows{KV: bustest.NewMemKV()}
	if ok, _, err := windows.Take(ctx, policies.WindowKey("pay", policy.ScopeTool, ""), *p.RateLimit, policies.CallID("other", "c1")); !ok || err != nil {
		t.Fatal(ok, err) // the window is full
	}
	st := &policies.Stage{Rules: fixedRule{&policies.Rule{Tool: "pay", Policy: &p, Source: policies.SourcePolicy, Version: 1}},
		Windows: windows, Approvals: &Gate{Store: store}}
	caller := &protocol.Caller{ID: "key:ann", Role: "user"}
	job := func(id, approval string) *router.Job {
		req := &protocol.Request{RequestID: id, SessionID: "s", ToolCalls: []protocol.ToolCall{{ToolCallID: "c1", Name: "pay", Arguments: json.RawMessage(`{}`)}}, Approval: approval}
		m, _ := protocol.NewMessage(protocol.TypeRequest, req)
		m.RequestID, m.SessionID, m.Caller = id, "s", caller
		return router.NewJob(m, req, nil, "", slog.New(slog.DiscardHandler))
	}
	j := job("r1", "")
	if _, err := st.Process(ctx, j); err != nil || j.Calls[0].Result.ErrorCode != protocol.CodeApprovalRequired {
		t.Fatalf("parked: %+v %v", j.Calls[0].Result, err)
	}
	id := j.Calls[0].Result.Policy.ApprovalID
	if _, err := store.Decide(ctx, id, Decider{Caller: caller}, true, "", time.Now()); err != nil {
		t.Fatal(err)
	}
	j = job(id, id)
	if _, err := st.Process(ctx, j); err != nil || j.Calls[0].Result == nil || j.Calls[0].Result.ErrorCode != protocol.CodeRateLimited {
		t.Fatalf("the full window: %+v %v", j.Calls[0].Result, err)
	}
	if a, _, _ := store.Get(ctx, id); a.State != Approved || a.UsedBy != "" {
		t.Fatalf("the approval after the refusal: %+v", a)
	}
}

type fixedRule struct{ r *policies.Rule }

func (f fixedRule) Rule(string, *contract.Compiled) (*policies.Rule, error) { return f.r, nil }
