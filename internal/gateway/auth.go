package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/pkg/protocol"
)

type callerKey struct{}

// CallerOf returns the caller the gateway authenticated for ctx's request; nil when the gateway
// asks for none.
func CallerOf(ctx context.Context) *auth.Caller {
	c, _ := ctx.Value(callerKey{}).(*auth.Caller)
	return c
}

// require wraps h: with a verifier configured, the request must carry a credential — a bearer
// credential (Authorization: Bearer …), or a browser's sign-in cookie — naming a caller with
// permission p ("" for any caller) and within its rate: 401 with WWW-Authenticate when it names
// none, 403 naming the permission when the caller lacks it, 429 when it is over its rate or its
// address has failed too many credentials, 503 when credentials cannot be checked. Without a
// verifier, h is served as it is.
func (g *Gateway) require(p auth.Permission, h http.HandlerFunc) http.HandlerFunc {
	if g.cfg.Callers == nil {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		c, recheck, ok := g.authenticate(w, r)
		if !ok {
			return
		}
		if p != "" && !c.Can(p) {
			writeError(w, http.StatusForbidden, protocol.CodeForbidden,
				fmt.Sprintf("this needs the permission %s, which role %s does not have", p, c.Role), nil)
			return
		}
		if !g.limits.allow(w, c) {
			return
		}
		ctx := context.WithValue(r.Context(), callerKey{}, c)
		h(w, r.WithContext(context.WithValue(ctx, recheckKey{}, recheck)))
	}
}

type recheckKey struct{}

// stillValid asks again whether the credential of ctx's request names a caller (answered
// from the verifier's memory within its TTL): an error wrapping auth.ErrUnauthenticated once
// it no longer does (revoked, expired, signed out). Nil when the gateway asks for no caller.
func stillValid(ctx context.Context) error {
	if f, ok := ctx.Value(recheckKey{}).(func(context.Context) error); ok {
		return f(ctx)
	}
	return nil
}

// authenticate names the caller of r, or answers and returns false. A credential from an
// address that failed too many lately is checked only when this gateway knows it already.
func (g *Gateway) authenticate(w http.ResponseWriter, r *http.Request) (*auth.Caller, func(context.Context) error, bool) {
	var v auth.Verifier = g.cfg.Callers
	cred := ""
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, rest, ok := strings.Cut(h, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(rest) == "" {
			g.refuse(w, r, fmt.Errorf("%w: the Authorization header is not a bearer credential", auth.ErrUnauthenticated), true)
			return nil, nil, false
		}
		cred = strings.TrimSpace(rest)
	} else if token := signinOf(r); token != "" && g.signins != nil {
		v, cred = g.signins, token
	} else {
		g.refuse(w, r, fmt.Errorf("%w: no credential", auth.ErrUnauthenticated), false)
		return nil, nil, false
	}
	recheck := func(ctx context.Context) error {
		_, err := v.Verify(ctx, cred)
		return err
	}
	remembered, _ := v.(interface {
		Known(string) (*auth.Caller, bool)
		WasValid(string) bool
	})
	if remembered != nil {
		if c, known := remembered.Known(cred); known && c != nil {
			return c, recheck, true
		}
	}
	// A credential this gateway has seen name a caller is checked again whatever its address
	// did: callers sharing an address with someone guessing keep working.
	succeeded := func() {}
	if remembered == nil || !remembered.WasValid(cred) {
		var ok bool
		if succeeded, ok = g.limits.attempt(w, r); !ok {
			return nil, nil, false
		}
	}
	c, err := v.Verify(r.Context(), cred)
	switch {
	case err == nil:
		succeeded()
	case !errors.Is(err, auth.ErrUnauthenticated):
		succeeded() // not the credential's fault
		g.refuse(w, r, err, true)
		return nil, nil, false
	default:
		g.refuse(w, r, err, true)
		return nil, nil, false
	}
	return c, recheck, true
}

// headerUser names the end user a request is made for, for clients that cannot put it in the
// body (and for the event stream, with ?user= for an EventSource, which cannot set headers).
const headerUser = "X-Hermes-User"

// actor is who a request is made by, and for.
type actor struct {
	caller *auth.Caller // nil when the gateway asks for no caller
	user   string
}

// owner names who a session this actor opens belongs to.
func (a actor) owner() string { return ownerOf(a.caller, a.user) }

// readsAll reports whether a may read every session; true when the gateway asks for no caller.
func (a actor) readsAll() bool { return a.caller == nil || a.caller.Can(auth.PermReadAll) }

// record is the actor as the record keeps it (nil without a caller).
func (a actor) record() *protocol.Caller {
	if a.caller == nil {
		return nil
	}
	return &protocol.Caller{ID: a.caller.ID, Name: a.caller.Name, Role: string(a.caller.Role), User: a.user}
}

// actorOf returns who r is made by and for: the caller the gateway authenticated, and the end
// user the request names (bodyUser, the X-Hermes-User header or ?user=; they must agree), which
// only a caller that may act for its users may name. When it returns false, it has answered.
func (g *Gateway) actorOf(w http.ResponseWriter, r *http.Request, bodyUser string) (actor, bool) {
	a := actor{caller: CallerOf(r.Context()), user: bodyUser}
	for _, v := range []struct{ field, user string }{{headerUser, r.Header.Get(headerUser)}, {"user", r.URL.Query().Get("user")}} {
		if v.user == "" {
			continue
		}
		if err := protocol.CheckUser(v.field, v.user); err != nil {
			writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, err.Error(), err)
			return a, false
		}
		if a.user != "" && a.user != v.user {
			err := &protocol.FieldError{Field: v.field, Reason: fmt.Sprintf("names another user than the request does (%q)", a.user)}
			writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, err.Error(), err)
			return a, false
		}
		a.user = v.user
	}
	if a.user != "" && a.caller != nil && !a.caller.Can(auth.PermActForUsers) {
		writeError(w, http.StatusForbidden, protocol.CodeForbidden,
			fmt.Sprintf("naming the end user needs the permission %s, which this caller does not have", auth.PermActForUsers), nil)
		return a, false
	}
	if a.caller == nil {
		a.user = "" // nobody to vouch for it
	}
	return a, true
}

// mayRead reports whether a may see session: its own, or any when a reads every session. A
// session nobody owns is seen only by those who read every session.
func (g *Gateway) mayRead(ctx context.Context, a actor, session string) (bool, error) {
	if a.readsAll() {
		return true, nil
	}
	owner, err := g.owners.of(ctx, session)
	return err == nil && owner == a.owner(), err
}

// writeNoSession answers 404 for a session that is not the caller's, in the words used for one
// that does not exist: whether someone else's exists is not the caller's to learn.
func writeNoSession(w http.ResponseWriter, session string) {
	writeError(w, http.StatusNotFound, protocol.CodeNotFound, fmt.Sprintf("no session %s of yours is known", session), nil)
}
