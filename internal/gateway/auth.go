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
