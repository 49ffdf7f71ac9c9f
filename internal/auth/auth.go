// Package auth says who calls Hermes and what they may do. A caller is named by an API key
// (kept on the bus as a hash, never as the key); it has one role, and each role a fixed set of
// permissions. Bearer tokens of an OpenID Connect issuer (OIDC) name callers too, their role in
// a claim; browsers hold sign-ins (Signins) made with either.
package auth

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Role is a caller's role. The names are the ones policies use (allowed_roles: [admin]).
type Role string

// The built-in roles.
const (
	// RoleAdmin may do everything, keys included.
	RoleAdmin Role = "admin"
	// RoleOperator runs Hermes: dead letters, replay, metrics, every session.
	RoleOperator Role = "operator"
	// RoleUser submits requests and chats, and reads its own sessions.
	RoleUser Role = "user"
)

// roles lists the built-in roles, most powerful first.
var roles = []Role{RoleAdmin, RoleOperator, RoleUser}

// Roles lists the built-in roles, most powerful first.
func Roles() []Role { return slices.Clone(roles) }

// Permission is one thing a caller may do.
type Permission string

// The permissions endpoints check.
const (
	// PermSubmit: post requests and chat; read what one submitted.
	PermSubmit Permission = "submit"
	// PermReadAll: read every session and request, not only one's own.
	PermReadAll Permission = "sessions:read_all"
	// PermDeadLetters: list and re-drive dead letters.
	PermDeadLetters Permission = "dead_letters"
	// PermReplay: replay sessions and run what-if replays.
	PermReplay Permission = "replay"
	// PermMetrics: read /metrics.
	PermMetrics Permission = "metrics"
	// PermKeys: create, list and revoke API keys.
	PermKeys Permission = "keys"
	// PermApprove: approve or reject held calls.
	PermApprove Permission = "approve"
	// PermToolsAdmin: register and change tools.
	PermToolsAdmin Permission = "tools:admin"
	// PermActForUsers: name the end user a request is made for (an application acting for
	// its users). Given to a key when it is created, or by the admin role.
	PermActForUsers Permission = "act_for_users"
	// PermMemoryAdmin: read, change and erase what Hermes remembers about any user (the
	// memory API's owner=).
	PermMemoryAdmin Permission = "memory:admin"
)

// permissions lists every permission.
var permissions = []Permission{PermSubmit, PermReadAll, PermDeadLetters, PermReplay, PermMetrics, PermKeys,
	PermApprove, PermToolsAdmin, PermActForUsers, PermMemoryAdmin}

// Permissions lists every permission.
func Permissions() []Permission { return slices.Clone(permissions) }

var rolePermissions = map[Role][]Permission{
	RoleAdmin:    slices.Clone(permissions),
	RoleOperator: {PermSubmit, PermReadAll, PermDeadLetters, PermReplay, PermMetrics},
	RoleUser:     {PermSubmit},
}

// ParseRole returns the role named exactly s, or an error listing the roles there are.
func ParseRole(s string) (Role, error) {
	r := Role(s)
	if _, ok := rolePermissions[r]; !ok {
		return "", fmt.Errorf("auth: unknown role %q: the roles are %s", s, joinRoles())
	}
	return r, nil
}

func joinRoles() string {
	names := make([]string, len(roles))
	for i, r := range roles {
		names[i] = string(r)
	}
	return strings.Join(names, ", ")
}

// Has reports whether role r grants p.
func (r Role) Has(p Permission) bool { return slices.Contains(rolePermissions[r], p) }

// Caller is who made a request: set by the gateway from a credential, never by the client.
type Caller struct {
	// ID names the caller for ownership and the record: "key:<key id>" or
	// "oidc:<issuer>#<subject>".
	ID string `json:"id"`
	// Name is a label for people: the key's name, the token's preferred name or subject.
	Name string `json:"name,omitempty"`
	Role Role   `json:"role"`
	// ActForUsers is set on a key created to act for its end users.
	ActForUsers bool `json:"act_for_users,omitempty"`
	// Expires, when set, is when the credential that named the caller stops naming it (a
	// token's expiry).
	Expires time.Time `json:"-"`
}

// Can reports whether c may do p.
func (c *Caller) Can(p Permission) bool {
	if c == nil {
		return false
	}
	if p == PermActForUsers && c.ActForUsers {
		return true
	}
	return c.Role.Has(p)
}

// ErrUnauthenticated is wrapped by every error that says a credential does not name a caller:
// malformed, unknown, wrong, revoked, or its record damaged. Its text is for logs; a client is told only
// that it is not authenticated.
var ErrUnauthenticated = errors.New("auth: not authenticated")
