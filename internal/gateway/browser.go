package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// SigninCookie is the cookie a signed-in browser holds: HttpOnly (no script reads it),
// SameSite=Strict (no other site's page sends it). Over HTTPS it is SecureSigninCookie
// instead: Secure, and with the __Host- prefix, so that no other host of the site can set one
// for the gateway's.
const (
	SigninCookie       = "hermes_signin"
	SecureSigninCookie = "__Host-hermes_signin"
)

// signinCookie is the name of the sign-in cookie for r.
func signinCookie(r *http.Request) string {
	if overHTTPS(r) {
		return SecureSigninCookie
	}
	return SigninCookie
}

// signinOf returns the sign-in token r carries, if any: the secure cookie over HTTPS only.
func signinOf(r *http.Request) string {
	ck, err := r.Cookie(signinCookie(r))
	if err != nil {
		return ""
	}
	return ck.Value
}

// Signins keeps browsers' sign-ins (auth.Signins).
type Signins interface {
	auth.Verifier
	Create(ctx context.Context, c *auth.Caller, until time.Time) (string, time.Time, error)
	Delete(ctx context.Context, token string) error
}

var _ Signins = (*auth.Signins)(nil)

// registerBrowser adds sign-in, sign-out and who-am-I to g's mux.
func (g *Gateway) registerBrowser() {
	g.mux.HandleFunc("POST /v1/signin", g.handleSignin)
	g.mux.HandleFunc("POST /v1/signout", g.handleSignout)
	g.mux.HandleFunc("GET /v1/whoami", g.require("", g.handleWhoami))
}

// callerJSON is a caller as the API shows it.
type callerJSON struct {
	ID          string `json:"id"`
	Name        string `json:"name,omitempty"`
	Role        string `json:"role"`
	ActForUsers bool   `json:"act_for_users,omitempty"`
}

func callerView(c *auth.Caller) *callerJSON {
	if c == nil {
		return nil
	}
	return &callerJSON{ID: c.ID, Name: c.Name, Role: string(c.Role), ActForUsers: c.ActForUsers}
}

// handleWhoami answers who the credential of the request names ({"caller": null} when the
// gateway asks for no caller).
func (g *Gateway) handleWhoami(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"caller": callerView(CallerOf(r.Context()))})
}

// handleSignin is POST /v1/signin {"credential": "hk_…" or a bearer token}: the credential is
// checked as on any endpoint and, when it names a caller, the browser gets a sign-in cookie
// standing for that caller (12 hours at most, less when the credential expires sooner).
func (g *Gateway) handleSignin(w http.ResponseWriter, r *http.Request) {
	if g.cfg.Callers == nil || g.cfg.Signins == nil {
		writeError(w, http.StatusNotFound, protocol.CodeNotFound, "this gateway asks for no caller; there is nothing to sign in to", nil)
		return
	}
	var in struct {
		Credential string `json:"credential"`
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 16<<10))
	if err == nil {
		err = json.Unmarshal(body, &in)
	}
	if err != nil || in.Credential == "" {
		ferr := &protocol.FieldError{Field: "credential", Reason: "is required: a JSON object {\"credential\": \"hk_…\"}"}
		writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, ferr.Error(), ferr)
		return
	}
	succeeded, refused := g.limits.Attempt(clientAddr(r))
	if refused != nil {
		writeRefusal(w, refused)
		return
	}
	c, err := g.cfg.Callers.Verify(r.Context(), strings.TrimSpace(in.Credential))
	if err == nil || !errors.Is(err, auth.ErrUnauthenticated) {
		succeeded()
	}
	if err != nil {
		g.refuse(w, r, err, true)
		return
	}
	if refused := g.limits.TakeSignin(c); refused != nil {
		writeRefusal(w, refused)
		return
	}
	if _, err := auth.ParseRole(string(c.Role)); err != nil {
		writeError(w, http.StatusForbidden, protocol.CodeForbidden, "this caller has no role in Hermes; there is nothing it could do signed in", nil)
		return
	}
	token, until, err := g.cfg.Signins.Create(r.Context(), c, c.Expires)
	if err != nil {
		g.log.Warn("sign in", "err", err)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the sign-in could not be kept; retry", nil)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: signinCookie(r), Value: token, Path: "/", Expires: until, MaxAge: int(time.Until(until).Seconds()),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: overHTTPS(r)})
	g.log.Info("signed in", "caller", c.ID, "name", c.Name, "until", until)
	writeJSON(w, http.StatusOK, map[string]any{"caller": callerView(c), "until": until.UTC()})
}

// handleSignout ends the browser's sign-in (everywhere: the record goes) and clears its
// cookie. Signing out when not signed in is no error.
// Both cookie names are ended, so that one set before the gateway was reached over HTTPS does
// not outlive the sign-out.
func (g *Gateway) handleSignout(w http.ResponseWriter, r *http.Request) {
	for _, name := range []string{SecureSigninCookie, SigninCookie} {
		ck, err := r.Cookie(name)
		if err != nil || ck.Value == "" || g.cfg.Signins == nil {
			continue
		}
		if err := g.cfg.Signins.Delete(r.Context(), ck.Value); err != nil {
			g.log.Warn("sign out", "err", err)
			w.Header().Set("Retry-After", "1")
			writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the sign-in could not be ended; retry", nil)
			return
		}
		if f, ok := g.signins.(interface{ Forget(string) }); ok {
			f.Forget(ck.Value)
		}
		http.SetCookie(w, &http.Cookie{Name: name, Value: "", Path: "/", MaxAge: -1,
			HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: name == SecureSigninCookie || overHTTPS(r)})
	}
	w.WriteHeader(http.StatusNoContent)
}

// overHTTPS reports whether the client reached the gateway over HTTPS (directly, or through a
// proxy that says so).
func overHTTPS(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

// guard refuses, before any endpoint sees them, what a browser could be made to send against
// the gateway: a Host the gateway does not serve (DNS rebinding: a hostile name resolving to
// this address would make the attacker's page same-origin), a state-changing request from a
// page of another origin (Sec-Fetch-Site and Origin, by http.CrossOriginProtection), and a
// state-changing request sent as text or a form, which any page can send without asking
// first. The probes answer whatever the Host, as orchestrators call them by address.
func (g *Gateway) guard(next http.Handler) http.Handler {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusForbidden, protocol.CodeCrossOrigin,
			"requests that change something are not taken from pages of other origins", nil)
	}))
	checked := cop.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !safeMethod(r.Method) {
			if mt, ok := simpleContentType(r); ok {
				writeError(w, http.StatusUnsupportedMediaType, protocol.CodeUnsupportedMediaType,
					fmt.Sprintf("%s requests are taken as JSON (Content-Type: application/json), not %s", r.Method, mt), nil)
				return
			}
		}
		next.ServeHTTP(w, r)
	}))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if r.URL.Path != "/healthz" && r.URL.Path != "/readyz" && !g.servesHost(r.Host) {
			writeError(w, http.StatusMisdirectedRequest, protocol.CodeHostNotServed,
				"this gateway does not serve that host name (start it with --public-host NAME to serve it)", nil)
			return
		}
		checked.ServeHTTP(w, r)
	})
}

func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// simpleContentType returns the media type of r when a page could send it without a CORS
// preflight (text/plain, a form) or, with a body, when it names none.
func simpleContentType(r *http.Request) (string, bool) {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		if r.ContentLength != 0 {
			return "a body without a Content-Type", true
		}
		return "", false
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return "an unreadable Content-Type", true
	}
	switch mt {
	case "text/plain", "application/x-www-form-urlencoded", "multipart/form-data":
		return mt, true
	}
	return mt, false
}

// servesHost reports whether host (a Host header) is one the gateway answers for: an IP
// address (no DNS name can be rebound to it), localhost, or a name given with --public-host.
func (g *Gateway) servesHost(host string) bool {
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	}
	name = strings.TrimSuffix(strings.ToLower(strings.Trim(name, "[]")), ".")
	if name == "" {
		return false
	}
	if net.ParseIP(name) != nil || name == "localhost" {
		return true
	}
	for _, h := range g.cfg.PublicHosts {
		if strings.EqualFold(strings.TrimSuffix(h, "."), name) {
			return true
		}
	}
	return false
}

// refuse answers a request whose credential names no caller (401, with a challenge and nothing
// that says why; the why is logged at debug, bounded) or could not be checked (503).
func (g *Gateway) refuse(w http.ResponseWriter, r *http.Request, err error, gave bool) {
	if !errors.Is(err, auth.ErrUnauthenticated) {
		g.log.Warn("credentials could not be checked", "err", err)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "credentials cannot be checked now; retry", nil)
		return
	}
	g.log.Debug("unauthenticated request", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "why", err)
	challenge := `Bearer realm="hermes"`
	if gave {
		challenge += `, error="invalid_token"`
	}
	w.Header().Set("WWW-Authenticate", challenge)
	writeError(w, http.StatusUnauthorized, protocol.CodeUnauthenticated,
		"a valid API key or token is required: Authorization: Bearer …, or sign in", nil)
}
