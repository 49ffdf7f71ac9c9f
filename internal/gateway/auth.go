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

// require wraps h: with a verifier configured, the request must carry a credential
// (Authorization: Bearer …) naming a caller with permission p — 401 with WWW-Authenticate when
// it names none, 403 naming the permission when the caller lacks it, 503 when the credentials
// cannot be checked. Without a verifier, h is served as it is.
func (g *Gateway) require(p auth.Permission, h http.HandlerFunc) http.HandlerFunc {
	if g.cfg.Callers == nil {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		c, err := g.authenticate(r)
		switch {
		case errors.Is(err, auth.ErrUnauthenticated):
			g.log.Info("unauthenticated request", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "why", err)
			challenge := `Bearer realm="hermes"`
			if r.Header.Get("Authorization") != "" {
				challenge += `, error="invalid_token"`
			}
			w.Header().Set("WWW-Authenticate", challenge)
			writeError(w, http.StatusUnauthorized, protocol.CodeUnauthenticated,
				"a valid API key is required: Authorization: Bearer hk_…", nil)
			return
		case err != nil:
			g.log.Warn("credentials could not be checked", "err", err)
			w.Header().Set("Retry-After", "1")
			writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "credentials cannot be checked now; retry", nil)
			return
		case !c.Can(p):
			writeError(w, http.StatusForbidden, protocol.CodeForbidden,
				fmt.Sprintf("this needs the permission %s, which role %s does not have", p, c.Role), nil)
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, c)))
	}
}

// authenticate reads the bearer credential of r and asks the verifier whose it is.
func (g *Gateway) authenticate(r *http.Request) (*auth.Caller, error) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return nil, fmt.Errorf("%w: no Authorization header", auth.ErrUnauthenticated)
	}
	scheme, cred, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(cred) == "" {
		return nil, fmt.Errorf("%w: the Authorization header is not a bearer credential", auth.ErrUnauthenticated)
	}
	return g.cfg.Callers.Verify(r.Context(), strings.TrimSpace(cred))
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
