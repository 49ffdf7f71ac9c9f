package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/auth"
)

// CallerOf returns the caller the gateway authenticated for ctx's request; nil when the gateway
// asks for none.
func CallerOf(ctx context.Context) *auth.Caller { return admission.CallerOf(ctx) }

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
		if refused := admission.Permit(c, p); refused != nil {
			writeRefusal(w, refused)
			return
		}
		if refused := g.limits.TakeRate(c); refused != nil {
			writeRefusal(w, refused)
			return
		}
		ctx := admission.WithCaller(r.Context(), c)
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
		var refused *admission.Refusal
		if succeeded, refused = g.limits.Attempt(clientAddr(r)); refused != nil {
			writeRefusal(w, refused)
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

// actorOf returns who r is made by and for (admission.ActorOf); when it returns false, it has
// answered.
func actorOf(w http.ResponseWriter, r *http.Request, bodyUser string) (admission.Actor, bool) {
	a, refused := admission.ActorOf(r, bodyUser)
	if refused != nil {
		writeRefusal(w, refused)
		return a, false
	}
	return a, true
}

// clientAddr is the address r came from, without its port; IPv6 addresses by their /64, which
// one client holds whole.
func clientAddr(r *http.Request) string {
	h, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		h = r.RemoteAddr
	}
	if ip := net.ParseIP(h); ip != nil && ip.To4() == nil {
		return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
	}
	return h
}
