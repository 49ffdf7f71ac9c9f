package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/approvals"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/submit"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Approvals over HTTP (/v1/approvals): the calls a policy parked for confirmation, listed,
// shown, approved and denied. A caller sees an approval when it requested the call, may
// decide it, or may read its session; anyone else is answered as for an unknown one (404).
// Approving a call Hermes runs itself (one that came through /v1/route or the bus) makes the
// request that runs it, request_id the approval's id, whose result goes to the session as a
// late result does, and every gateway starts the runs its decider did not (approvals.Starter);
// approving one of a recalling door (MCP, the chat loop) lets the
// requester's next identical call run.

// approvalsAPI is what the gateway keeps for the approvals' endpoints.
type approvalsAPI struct {
	store     *approvals.Store
	decisions *approvals.Decisions
	// starter starts the runs of approved calls whose decider stopped before starting them.
	starter *approvals.Starter
}

func (g *Gateway) registerApprovals() {
	if g.cfg.Bus == nil || g.cfg.Bus.Bucket(approvals.Bucket) == nil {
		return
	}
	kv := g.cfg.Bus.Bucket(approvals.Bucket)
	store := &approvals.Store{KV: kv}
	g.approvals = approvalsAPI{store: store, decisions: &approvals.Decisions{Store: store,
		Events: &approvals.Events{Pub: g.cfg.Bus.NewPublisher(protocol.Sender{Role: protocol.RoleGateway, Instance: g.cfg.Instance})}}}
	g.approvals.starter = &approvals.Starter{KV: kv, Start: g.run, Log: g.log.With("part", "approvals")}
	g.mux.HandleFunc("GET /v1/approvals", g.require(auth.PermSubmit, g.handleListApprovals))
	g.mux.HandleFunc("GET /v1/approvals/{id}", g.require(auth.PermSubmit, g.handleGetApproval))
	g.mux.HandleFunc("POST /v1/approvals/{id}/approve", g.require(auth.PermSubmit, g.handleDecide(true)))
	g.mux.HandleFunc("POST /v1/approvals/{id}/deny", g.require(auth.PermSubmit, g.handleDecide(false)))
}

// ApprovalView is an approval as the API shows it.
type ApprovalView struct {
	approvals.Approval
	// CanDecide: the caller may approve or deny it now.
	CanDecide bool `json:"can_decide"`
	// RunRequestID names the request Hermes runs the approved call in ("" for a recalling
	// door's approval, which the requester's next identical call uses).
	RunRequestID string `json:"run_request_id,omitempty"`
}

// decider is the actor as an approval's decider.
func (g *Gateway) decider(a admission.Actor) approvals.Decider {
	return approvals.Decider{Caller: a.Record(), Approver: g.cfg.Callers == nil || a.Caller != nil && a.Caller.Can(auth.PermApprove)}
}

func (g *Gateway) viewOf(a admission.Actor, ap *approvals.Approval) ApprovalView {
	v := ApprovalView{Approval: *ap, CanDecide: ap.Open() && time.Now().Before(ap.ExpiresAt) && approvals.MayDecide(ap, g.decider(a)) == nil}
	if !ap.Recall && (ap.State == approvals.Approved || ap.State == approvals.Used) {
		v.RunRequestID = ap.ID
	}
	return v
}

// maySee reports whether actor a may see approval ap.
func (g *Gateway) maySee(ctx context.Context, a admission.Actor, ap *approvals.Approval) (bool, error) {
	rec := a.Record()
	switch {
	case a.ReadsAll(), approvals.Identity(rec) == approvals.Identity(ap.Requester),
		approvals.MayDecide(ap, g.decider(a)) == nil,
		rec != nil && slices.Contains(ap.Approvers, rec.Role):
		return true, nil
	}
	return g.admit.MayRead(ctx, a, ap.SessionID)
}

// approval reads approval id for the actor of r, answering 404 for one it may not see.
func (g *Gateway) approval(w http.ResponseWriter, r *http.Request) (admission.Actor, *approvals.Approval, bool) {
	a, ok := actorOf(w, r, "")
	if !ok {
		return a, nil, false
	}
	id := r.PathValue("id")
	ap, _, err := g.approvals.store.Get(r.Context(), id)
	if err == nil {
		var see bool
		if see, err = g.maySee(r.Context(), a, ap); err == nil && !see {
			err = approvals.ErrNotFound
		}
	}
	switch {
	case errors.Is(err, approvals.ErrNotFound):
		writeError(w, http.StatusNotFound, protocol.CodeNotFound, fmt.Sprintf("no approval %s is known (or it is older than approvals are kept)", id), nil)
		return a, nil, false
	case err != nil:
		g.log.Warn("read an approval", "approval_id", id, "err", err)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the approvals cannot be read now", nil)
		return a, nil, false
	}
	return a, ap, true
}

func (g *Gateway) handleGetApproval(w http.ResponseWriter, r *http.Request) {
	a, ap, ok := g.approval(w, r)
	if ok {
		writeJSON(w, http.StatusOK, g.viewOf(a, ap))
	}
}

// approvalStates are the states a listing may be filtered by.
var approvalStates = []approvals.State{approvals.Pending, approvals.Approved, approvals.Denied, approvals.Expired, approvals.Used}

func (g *Gateway) handleListApprovals(w http.ResponseWriter, r *http.Request) {
	a, ok := actorOf(w, r, "")
	if !ok {
		return
	}
	q := r.URL.Query()
	state, session := approvals.State(q.Get("state")), q.Get("session_id")
	if state != "" && !slices.Contains(approvalStates, state) {
		writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, fmt.Sprintf("state: %q is not one of %v", state, approvalStates), nil)
		return
	}
	limit := 100
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1000 {
			writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, "limit: must be a whole number from 1 to 1000", nil)
			return
		}
		limit = n
	}
	all, err := g.approvals.store.List(r.Context())
	if err != nil {
		g.log.Warn("list approvals", "err", err)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the approvals cannot be read now", nil)
		return
	}
	out := []ApprovalView{}
	for _, ap := range all {
		if len(out) == limit {
			break
		}
		if state != "" && ap.State != state || session != "" && ap.SessionID != session {
			continue
		}
		see, err := g.maySee(r.Context(), a, ap)
		if err != nil {
			w.Header().Set("Retry-After", "1")
			writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the sessions' owners cannot be read now", nil)
			return
		}
		if see {
			out = append(out, g.viewOf(a, ap))
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"approvals": out})
}

// maxReasonBytes bounds a decision's reason.
const maxReasonBytes = 1000

// handleDecide approves (approve true) or denies an approval.
func (g *Gateway) handleDecide(approve bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Reason string `json:"reason"`
		}
		if r.ContentLength != 0 {
			dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 8<<10))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&body); err != nil {
				writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, "the body is a JSON object with an optional reason: "+err.Error(), nil)
				return
			}
		}
		if !approve && strings.TrimSpace(body.Reason) == "" {
			writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, "reason: a denial says why ({\"reason\": \"…\"})", nil)
			return
		}
		if len(body.Reason) > maxReasonBytes {
			writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, fmt.Sprintf("reason: is %d bytes long; at most %d", len(body.Reason), maxReasonBytes), nil)
			return
		}
		a, ap, ok := g.approval(w, r)
		if !ok {
			return
		}
		ctx := r.Context()
		got, err := g.approvals.decisions.Decide(ctx, ap.ID, g.decider(a), approve, body.Reason)
		if errors.Is(err, approvals.ErrUnrecorded) {
			g.log.Error("an approval's decision stands and is not on the record", "approval_id", ap.ID, "err", err)
			err = nil
		}
		switch {
		case errors.Is(err, approvals.ErrForbidden):
			writeError(w, http.StatusForbidden, protocol.CodeForbidden, err.Error(), nil)
			return
		case errors.Is(err, approvals.ErrExpired):
			writeError(w, http.StatusConflict, protocol.CodeApprovalExpired, err.Error(), nil)
			return
		case errors.Is(err, approvals.ErrDecided):
			if approve && got != nil && got.State == approvals.Approved && !got.Recall {
				// Approved before, its run perhaps not made (the gateway stopped between the
				// two): made again, which changes nothing if it was.
				g.run(ctx, got)
			}
			writeError(w, http.StatusConflict, protocol.CodeAlreadyDecided, err.Error(), nil)
			return
		case errors.Is(err, approvals.ErrNotFound):
			writeError(w, http.StatusNotFound, protocol.CodeNotFound, err.Error(), nil)
			return
		case err != nil:
			g.log.Warn("decide an approval", "approval_id", ap.ID, "err", err)
			w.Header().Set("Retry-After", "1")
			writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the approval could not be decided now; nothing was decided", nil)
			return
		}
		g.log.Info("approval decided", "approval_id", got.ID, "state", got.State, "by", got.DecidedBy, "tool", got.Tool)
		if got.State == approvals.Approved && !got.Recall {
			if err := g.run(ctx, got); err != nil {
				w.Header().Set("Retry-After", "1")
				writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable,
					"the call is approved, and its run could not be started now; approve it again to start it", nil)
				return
			}
		}
		writeJSON(w, http.StatusOK, g.viewOf(a, got))
	}
}

// run makes the request that runs approved call ap: request_id the approval's id, so that it
// is made once however often this runs.
func (g *Gateway) run(ctx context.Context, ap *approvals.Approval) error {
	req := &protocol.Request{RequestID: ap.ID, SessionID: ap.SessionID, Intent: "the call approved as " + ap.ID,
		ToolCalls: []protocol.ToolCall{{ToolCallID: ap.ToolCallID, Name: ap.Tool, Arguments: ap.Arguments}}, Approval: ap.ID}
	owner := ""
	if c := ap.Requester; c != nil {
		owner = c.ID
		if c.User != "" {
			owner += "#" + c.User
		}
	}
	_, err := g.submit.Submit(context.WithoutCancel(ctx), submit.Submission{Request: req, Trace: ap.Trace, Caller: ap.Requester, Owner: owner, NoWait: true})
	if err != nil {
		g.log.Error("run an approved call", "approval_id", ap.ID, "err", err)
		return err
	}
	return nil
}

// Decisions decides the gateway's approvals and records each decision (for the chat doors'
// confirmation round); nil without the approvals' bucket.
func (g *Gateway) Decisions() *approvals.Decisions { return g.approvals.decisions }
