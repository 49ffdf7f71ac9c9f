package approvals

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/bus/bustest"
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
