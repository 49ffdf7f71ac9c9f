package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// OIDCConfig says which bearer tokens name callers: JWTs an OpenID Connect issuer signed for
// an audience, with the caller's role in a claim.
type OIDCConfig struct {
	// Issuer is the issuer's URL, as tokens name it (discovery: Issuer +
	// /.well-known/openid-configuration).
	Issuer string
	// Audience is what a token's aud must hold (the client id Hermes is registered as).
	Audience string
	// RoleClaim names the claim holding the role: a string, or a list of strings of which the
	// most powerful built-in role counts (others are ignored). Default "roles". A token
	// without one names a caller who may do nothing (403).
	RoleClaim string
	// NameClaim names the claim shown as the caller's name. Default "preferred_username"; the
	// subject when the token has none.
	NameClaim string
	// ActForUsersClaim, when set, names a boolean claim that lets the caller name end users.
	ActForUsersClaim string
}

// OIDC names the callers of OIDC bearer tokens. The issuer is asked for its configuration on
// first use — one request at a time, the others waiting only as long as their own context
// lets them — and, after a failure, not again for retryDiscovery: a gateway starts while the
// issuer is away, and does not pile up requests behind it. It is safe for concurrent use.
type OIDC struct {
	cfg OIDCConfig
	now func() time.Time

	mu       sync.Mutex
	verifier *oidc.IDTokenVerifier
	asking   chan struct{} // closed when the discovery under way ends; nil when none is
	failed   error         // the last discovery's error, until failedAt+retryDiscovery
	failedAt time.Time
}

// NewOIDC returns the verifier of cfg's tokens; nothing is fetched until the first token.
func NewOIDC(cfg OIDCConfig) (*OIDC, error) {
	if cfg.Issuer == "" || cfg.Audience == "" {
		return nil, errors.New("auth: OIDC needs an issuer and an audience")
	}
	if cfg.RoleClaim == "" {
		cfg.RoleClaim = "roles"
	}
	if cfg.NameClaim == "" {
		cfg.NameClaim = "preferred_username"
	}
	return &OIDC{cfg: cfg, now: time.Now}, nil
}

var _ Verifier = (*OIDC)(nil)

const (
	// discoveryTimeout bounds asking the issuer for its configuration.
	discoveryTimeout = 10 * time.Second
	// retryDiscovery is how long a failed discovery is answered from memory.
	retryDiscovery = 5 * time.Second
)

func (o *OIDC) tokenVerifier(ctx context.Context) (*oidc.IDTokenVerifier, error) {
	for {
		o.mu.Lock()
		switch {
		case o.verifier != nil:
			v := o.verifier
			o.mu.Unlock()
			return v, nil
		case o.failed != nil && o.now().Sub(o.failedAt) < retryDiscovery:
			err := o.failed
			o.mu.Unlock()
			return nil, err
		case o.asking != nil:
			wait := o.asking
			o.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, fmt.Errorf("auth: OIDC issuer %s: %w", o.cfg.Issuer, ctx.Err())
			}
		}
		o.asking = make(chan struct{})
		o.mu.Unlock()
		break
	}
	// The discovery is not the request's: it goes on (within its own timeout) if the request
	// that started it ends.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), discoveryTimeout)
	defer cancel()
	p, err := oidc.NewProvider(dctx, o.cfg.Issuer)
	o.mu.Lock()
	defer o.mu.Unlock()
	close(o.asking)
	o.asking = nil
	if err != nil {
		o.failed, o.failedAt = fmt.Errorf("auth: OIDC issuer %s: %w", o.cfg.Issuer, err), o.now()
		return nil, o.failed
	}
	// Keys are fetched with a context of their own: a request that ends must not fail the
	// fetch another is waiting for.
	o.verifier = p.VerifierContext(context.WithoutCancel(ctx), &oidc.Config{ClientID: o.cfg.Audience, Now: o.now})
	o.failed = nil
	return o.verifier, nil
}

// Verify returns the caller a token names, or an error wrapping ErrUnauthenticated when it
// names none (not a JWT, signed by another key, for another audience or issuer, expired).
// Other errors mean the issuer could not be asked.
func (o *OIDC) Verify(ctx context.Context, token string) (*Caller, error) {
	if strings.Count(token, ".") != 2 || len(token) > 16<<10 {
		return nil, fmt.Errorf("%w: not a JWT", ErrUnauthenticated)
	}
	v, err := o.tokenVerifier(ctx)
	if err != nil {
		return nil, err
	}
	t, err := v.Verify(ctx, token)
	if err != nil {
		return nil, fmt.Errorf("%w: token: %v", ErrUnauthenticated, err)
	}
	var claims map[string]json.RawMessage
	if err := t.Claims(&claims); err != nil {
		return nil, fmt.Errorf("%w: token claims: %v", ErrUnauthenticated, err)
	}
	// The subject names the caller in owners and the record: it must be printable, and hold
	// no '#', which separates it from the end user in an owner.
	if t.Subject == "" || !protocol.Printable(t.Subject) || strings.Contains(t.Subject, "#") {
		return nil, fmt.Errorf("%w: the token's subject is empty, holds '#' or is not printable", ErrUnauthenticated)
	}
	c := &Caller{ID: "oidc:" + t.Issuer + "#" + t.Subject, Name: t.Subject, Expires: t.Expiry}
	if len(c.ID) > 512 {
		return nil, fmt.Errorf("%w: issuer and subject are longer than 512 bytes", ErrUnauthenticated)
	}
	var name string
	if json.Unmarshal(claims[o.cfg.NameClaim], &name) == nil && name != "" && protocol.Printable(name) {
		c.Name = name
	}
	c.Name = protocol.Shorten(c.Name, protocol.MaxCallerNameLen)
	c.Role = strongestRole(claims[o.cfg.RoleClaim])
	if o.cfg.ActForUsersClaim != "" {
		var act bool
		c.ActForUsers = json.Unmarshal(claims[o.cfg.ActForUsersClaim], &act) == nil && act
	}
	return c, nil
}

// strongestRole reads a role claim — a string or a list of strings — and returns the most
// powerful built-in role it names; "" when it names none.
func strongestRole(raw json.RawMessage) Role {
	var names []string
	var one string
	if json.Unmarshal(raw, &one) == nil {
		names = []string{one}
	} else if json.Unmarshal(raw, &names) != nil {
		return ""
	}
	for _, r := range roles { // most powerful first
		for _, n := range names {
			if n == string(r) {
				return r
			}
		}
	}
	return ""
}

// Chain names callers by API keys (hk_…) and, when set, OIDC tokens.
type Chain struct {
	Keys Verifier
	OIDC Verifier
}

// Verify asks the verifier the credential's shape points to.
func (c Chain) Verify(ctx context.Context, credential string) (*Caller, error) {
	switch {
	case strings.HasPrefix(credential, KeyPrefix) && c.Keys != nil:
		return c.Keys.Verify(ctx, credential)
	case c.OIDC != nil && strings.Count(credential, ".") == 2:
		return c.OIDC.Verify(ctx, credential)
	}
	return nil, fmt.Errorf("%w: neither an API key nor a token this gateway takes", ErrUnauthenticated)
}
