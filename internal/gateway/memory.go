package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/erasure"
	"github.com/hermesbus/hermes/internal/memory"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Memory over HTTP (/v1/memory): what Hermes remembers about a user, as fragments {type, key,
// value, lifespan, semantic_tag}. Each caller reads and writes its own memory; an application
// that acts for its users names one (?user= or "user" in the body, with act_for_users), and
// the memory is that user's with that application. A caller with memory:admin names any owner
// (?owner=, as GET /v1/memory answers it). Nobody reads another owner's fragments.
//
//	POST   /v1/memory              write (or replace) one fragment: 201 {fragment, replaced, evicted}
//	GET    /v1/memory              list: ?session_id= ?type= ?key= ?tag=
//	GET    /v1/memory/{key}        one: ?session_id= (a session fragment), else the owner's
//	DELETE /v1/memory/{key}        forget one: ?session_id= for a session fragment
//	DELETE /v1/memory              forget everything kept about the owner: its fragments at once,
//	                               and asks the eraser for the rest (its memory history on the
//	                               record; ?with_history=true: every session of the owner too):
//	                               200 {owner, forgotten, erasure}
//	GET    /v1/erasure             the owner's last erasure: asked, or done with what it erased

// memoryBody is POST /v1/memory's body.
type memoryBody struct {
	memory.Write
	User string `json:"user,omitempty"`
}

// maxMemoryBody bounds POST /v1/memory's body: a fragment at its bounds fits.
const maxMemoryBody = 32 << 10

func (g *Gateway) registerMemory() {
	if g.cfg.Bus == nil || g.cfg.Bus.Bucket(memory.Bucket) == nil {
		return
	}
	g.memory = &memory.Store{KV: g.cfg.Bus.Bucket(memory.Bucket), JS: g.cfg.Bus.JS, Cache: &memory.Cache{},
		History: &memory.Recorder{Pub: g.cfg.Bus.NewPublisher(protocol.Sender{Role: protocol.RoleGateway, Instance: g.cfg.Instance})}}
	g.mux.HandleFunc("POST /v1/memory", g.require(auth.PermSubmit, g.handleMemoryWrite))
	g.mux.HandleFunc("GET /v1/memory", g.require(auth.PermSubmit, g.handleMemoryList))
	g.mux.HandleFunc("GET /v1/memory/{key}", g.require(auth.PermSubmit, g.handleMemoryGet))
	g.mux.HandleFunc("DELETE /v1/memory/{key}", g.require(auth.PermSubmit, g.handleMemoryDelete))
	g.mux.HandleFunc("DELETE /v1/memory", g.require(auth.PermSubmit, g.handleMemoryForget))
	if kv := g.cfg.Bus.Bucket(erasure.Bucket); kv != nil {
		g.erasures = &erasure.Asks{KV: kv}
		g.mux.HandleFunc("GET /v1/erasure", g.require(auth.PermSubmit, g.handleErasure))
	}
}

// Memory is the store the memory API keeps fragments in; nil when the bus has no memory
// bucket. Its Decay may be set before the gateway serves.
func (g *Gateway) Memory() *memory.Store { return g.memory }

// memoryOwner is whose memory r is about: ?owner= for a caller with memory:admin, else the
// actor's own (its caller, and the user it names). It answers and returns false when r may
// not name it.
func memoryOwner(w http.ResponseWriter, r *http.Request, bodyUser string) (admission.Actor, string, bool) {
	a, ok := actorOf(w, r, bodyUser)
	if !ok {
		return a, "", false
	}
	if named := r.URL.Query().Get("owner"); named != "" {
		if a.Caller != nil && !a.Caller.Can(auth.PermMemoryAdmin) {
			writeError(w, http.StatusForbidden, protocol.CodeForbidden, "owner= names another owner's memory, which needs the permission "+string(auth.PermMemoryAdmin), nil)
			return a, "", false
		}
		if len(named) > protocol.MaxCallerIDLen+1+protocol.MaxUserLen || !protocol.Printable(named) {
			writeFieldError(w, "owner", "is not an owner id (as GET /v1/memory names it)")
			return a, "", false
		}
		return a, named, true
	}
	return a, memory.OwnerOf(a.Owner()), true
}

func writeFieldError(w http.ResponseWriter, field, reason string) {
	writeRefusal(w, &admission.Refusal{Status: http.StatusBadRequest, Code: protocol.CodeInvalidRequest, Message: field + ": " + reason, Field: field})
}

// writeMemoryError answers err of a memory operation.
func (g *Gateway) writeMemoryError(w http.ResponseWriter, err error) {
	var fe *protocol.FieldError
	switch {
	case errors.As(err, &fe):
		writeFieldError(w, fe.Field, fe.Reason)
	case errors.Is(err, memory.ErrNotFound):
		writeError(w, http.StatusNotFound, protocol.CodeNotFound, "no such fragment", nil)
	case errors.Is(err, memory.ErrFull):
		writeError(w, http.StatusInsufficientStorage, protocol.CodeMemoryFull, err.Error(), nil)
	default:
		g.log.Warn("memory", "err", err)
		writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "memory cannot be reached now; try again", nil)
	}
}

// fragmentView is a fragment as the API shows it, with its owner.
type fragmentView struct {
	Owner string `json:"owner"`
	memory.Fragment
}

func views(owner string, fs []memory.Fragment) []fragmentView {
	out := make([]fragmentView, len(fs))
	for i, f := range fs {
		out[i] = fragmentView{Owner: owner, Fragment: f}
	}
	return out
}

func (g *Gateway) handleMemoryWrite(w http.ResponseWriter, r *http.Request) {
	var body memoryBody
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxMemoryBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, protocol.CodeInvalidRequest, "the body is over "+strconv.Itoa(maxMemoryBody)+" bytes", nil)
			return
		}
		writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, "the body is not a fragment: "+err.Error(), nil)
		return
	}
	if body.User != "" {
		if err := protocol.CheckUser("user", body.User); err != nil {
			g.writeMemoryError(w, err)
			return
		}
	}
	a, owner, ok := memoryOwner(w, r, body.User)
	if !ok {
		return
	}
	body.Write.Source = "api"
	ctx := memory.WithChange(r.Context(), memory.APIRequest, a.Record())
	out, err := g.memory.Put(ctx, owner, body.Write)
	if err != nil {
		g.writeMemoryError(w, err)
		return
	}
	resp := map[string]any{"fragment": fragmentView{Owner: owner, Fragment: out.Fragment}, "evicted": views(owner, out.Evicted)}
	if out.Replaced != nil {
		resp["replaced"] = fragmentView{Owner: owner, Fragment: *out.Replaced}
	}
	status := http.StatusCreated
	if out.Replaced != nil {
		status = http.StatusOK
	}
	writeJSON(w, status, resp)
}

func (g *Gateway) handleMemoryList(w http.ResponseWriter, r *http.Request) {
	_, owner, ok := memoryOwner(w, r, "")
	if !ok {
		return
	}
	q := r.URL.Query()
	query := memory.Query{Session: q.Get("session_id"), Type: q.Get("type"), Key: q.Get("key"), Tag: q.Get("tag")}
	if query.Session != "" {
		if err := protocol.CheckID("session_id", query.Session); err != nil {
			g.writeMemoryError(w, err)
			return
		}
	}
	fs, err := g.memory.List(r.Context(), owner, query)
	if err != nil {
		g.writeMemoryError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"owner": owner, "fragments": views(owner, fs), "count": len(fs)})
}

func (g *Gateway) handleMemoryGet(w http.ResponseWriter, r *http.Request) {
	_, owner, ok := memoryOwner(w, r, "")
	if !ok {
		return
	}
	session := r.URL.Query().Get("session_id")
	if session != "" {
		if err := protocol.CheckID("session_id", session); err != nil {
			g.writeMemoryError(w, err)
			return
		}
	}
	f, err := g.memory.Get(r.Context(), owner, session, r.PathValue("key"))
	if err != nil {
		g.writeMemoryError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, fragmentView{Owner: owner, Fragment: f})
}

func (g *Gateway) handleMemoryDelete(w http.ResponseWriter, r *http.Request) {
	a, owner, ok := memoryOwner(w, r, "")
	if !ok {
		return
	}
	session := r.URL.Query().Get("session_id")
	if session != "" {
		if err := protocol.CheckID("session_id", session); err != nil {
			g.writeMemoryError(w, err)
			return
		}
	}
	ctx := memory.WithChange(r.Context(), memory.APIRequest, a.Record())
	f, err := g.memory.Delete(ctx, owner, session, r.PathValue("key"))
	if err != nil {
		g.writeMemoryError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"deleted": fragmentView{Owner: owner, Fragment: f}})
}

// handleMemoryForget forgets the owner's fragments, then asks the eraser to erase what the
// record keeps about it. Asking again is harmless: a waiting ask takes the new one in.
func (g *Gateway) handleMemoryForget(w http.ResponseWriter, r *http.Request) {
	a, owner, ok := memoryOwner(w, r, "")
	if !ok {
		return
	}
	withHistory := false
	if v := r.URL.Query().Get("with_history"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			writeFieldError(w, "with_history", "is true or false")
			return
		}
		withHistory = b
	}
	switch {
	case a.Caller == nil && owner != memory.Anonymous:
		// No caller is identified here, so none holds memory:admin: an open gateway erases
		// no named owner's memory (its NATS clients' are theirs).
		writeError(w, http.StatusForbidden, protocol.CodeForbidden, "owner=: this gateway identifies no callers, so it erases no named owner's memory", nil)
		return
	case withHistory && owner == memory.Anonymous:
		writeFieldError(w, "with_history", "the anonymous owner's sessions are every anonymous caller's: they cannot be told apart")
		return
	case withHistory && g.erasures == nil:
		writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "this bus keeps no erasures: sessions cannot be erased through the gateway; nothing was forgotten", nil)
		return
	}
	// Once begun, the erasure is asked whether or not the client waits for the answer.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 30*time.Second)
	defer cancel()
	n, err := g.memory.Forget(ctx, owner)
	if err != nil {
		g.writeMemoryError(w, err)
		return
	}
	out := map[string]any{"owner": owner, "forgotten": n}
	if g.erasures == nil {
		writeJSON(w, http.StatusOK, out)
		return
	}
	ask, err := g.erasures.Ask(ctx, owner, withHistory, actorID(a))
	if err != nil {
		g.log.Warn("erasure", "err", err)
		writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the fragments are forgotten, but the erasure of the history could not be asked; ask again", nil)
		return
	}
	out["erasure"] = ask
	writeJSON(w, http.StatusOK, out)
}

// actorID names a for the record of what it asked: its caller's id, or its NATS user's.
func actorID(a admission.Actor) string {
	if rec := a.Record(); rec != nil {
		return rec.ID
	}
	return ""
}

// handleErasure answers the owner's last erasure.
func (g *Gateway) handleErasure(w http.ResponseWriter, r *http.Request) {
	_, owner, ok := memoryOwner(w, r, "")
	if !ok {
		return
	}
	ask, err := g.erasures.Get(r.Context(), owner)
	switch {
	case errors.Is(err, erasure.ErrNotFound):
		writeError(w, http.StatusNotFound, protocol.CodeNotFound, "no erasure was asked for "+owner, nil)
	case err != nil:
		g.log.Warn("erasure", "err", err)
		writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the erasures cannot be reached now; try again", nil)
	default:
		writeJSON(w, http.StatusOK, ask)
	}
}
