package admission

import (
	"context"
	"fmt"
	"net/http"

	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Actor is who a request is made by, and for: the caller a door authenticated (an HTTP
// caller, or an external NATS client named by the subject it published on) and the end user
// it names. The zero Actor is a request at a door that asks nobody who they are.
type Actor struct {
	Caller *auth.Caller // the HTTP caller; nil for none
	User   string       // the end user named (only by a caller that may act for its users)
	// Client is the NATS user of an external client's request (the bus ingress); "" else.
	Client string
}

// The caller an external NATS client's requests are recorded under: its NATS user, with a role
// of its own.
const (
	ClientCallerPrefix = "nats:"
	ClientRole         = "nats-client"
)

// ClientActor is the actor of an external NATS client's request: its NATS user, named by the
// subject it published on (which its permissions allow it alone), whatever the message claims.
func ClientActor(user string) Actor { return Actor{Client: user} }

// identified reports whether a door named the actor (a caller or a NATS client).
func (a Actor) identified() bool { return a.Caller != nil || a.Client != "" }

// Owner names who a session this actor opens belongs to: the caller's id, and "#" and the user
// when there is one; a NATS client's caller id.
func (a Actor) Owner() string {
	switch {
	case a.Client != "":
		return ClientCallerPrefix + a.Client
	case a.Caller == nil:
		return ""
	case a.User == "":
		return a.Caller.ID
	}
	return a.Caller.ID + "#" + a.User
}

// ReadsAll reports whether a may read every session; true when the door asks for no caller.
func (a Actor) ReadsAll() bool {
	if a.Client != "" {
		return false
	}
	return a.Caller == nil || a.Caller.Can(auth.PermReadAll)
}

// Role is the actor's role as tools' policies name it: the caller's, ClientRole for a NATS
// client, "" at a door that asks nobody who they are.
func (a Actor) Role() string {
	if c := a.Record(); c != nil {
		return c.Role
	}
	return ""
}

// Record is the actor as the record keeps it (nil without a caller).
func (a Actor) Record() *protocol.Caller {
	switch {
	case a.Client != "":
		return &protocol.Caller{ID: ClientCallerPrefix + a.Client, Name: a.Client, Role: ClientRole}
	case a.Caller == nil:
		return nil
	}
	return &protocol.Caller{ID: a.Caller.ID, Name: a.Caller.Name, Role: string(a.Caller.Role), User: a.User}
}

// check refuses an actor without the permission need (an HTTP caller; NATS clients' permissions
// are the server's).
func (a Actor) check(need auth.Permission) *Refusal {
	if a.Caller == nil {
		return nil
	}
	return Permit(a.Caller, need)
}

// Permit refuses c (403, naming the permission) unless it has p ("" any caller has).
func Permit(c *auth.Caller, p auth.Permission) *Refusal {
	if p == "" || c.Can(p) {
		return nil
	}
	return &Refusal{Status: http.StatusForbidden, Code: protocol.CodeForbidden,
		Message: fmt.Sprintf("this needs the permission %s, which role %s does not have", p, c.Role)}
}

type callerKey struct{}

// WithCaller is ctx carrying the caller the HTTP edge authenticated.
func WithCaller(ctx context.Context, c *auth.Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerOf returns the caller the HTTP edge authenticated for ctx's request; nil when it asks
// for none.
func CallerOf(ctx context.Context) *auth.Caller {
	c, _ := ctx.Value(callerKey{}).(*auth.Caller)
	return c
}

// HeaderUser names the end user a request is made for, for clients that cannot put it in the
// body (and for the event stream, with ?user= for an EventSource, which cannot set headers).
const HeaderUser = "X-Hermes-User"

// ActorOf returns who r is made by and for: the caller the HTTP edge authenticated, and the end
// user the request names (bodyUser, the X-Hermes-User header or ?user=; they must agree), which
// only a caller that may act for its users may name (403 otherwise; 400 for a malformed or
// disagreeing user).
func ActorOf(r *http.Request, bodyUser string) (Actor, *Refusal) {
	a := Actor{Caller: CallerOf(r.Context()), User: bodyUser}
	for _, v := range []struct{ field, user string }{{HeaderUser, r.Header.Get(HeaderUser)}, {"user", r.URL.Query().Get("user")}} {
		if v.user == "" {
			continue
		}
		if err := protocol.CheckUser(v.field, v.user); err != nil {
			return a, invalid(err)
		}
		if a.User != "" && a.User != v.user {
			return a, invalid(&protocol.FieldError{Field: v.field, Reason: fmt.Sprintf("names another user than the request does (%q)", a.User)})
		}
		a.User = v.user
	}
	if a.User != "" && a.Caller != nil && !a.Caller.Can(auth.PermActForUsers) {
		return a, &Refusal{Status: http.StatusForbidden, Code: protocol.CodeForbidden,
			Message: fmt.Sprintf("naming the end user needs the permission %s, which this caller does not have", auth.PermActForUsers)}
	}
	if a.Caller == nil {
		a.User = "" // nobody to vouch for it
	}
	return a, nil
}

// invalid is the refusal of a malformed field.
func invalid(err error) *Refusal {
	r := &Refusal{Status: http.StatusBadRequest, Code: protocol.CodeInvalidRequest, Message: err.Error()}
	if fe, ok := err.(*protocol.FieldError); ok {
		r.Field = fe.Field
	}
	return r
}
