// Package policy says what Hermes dares to run (seed 001 §5.3, ToolPolicy): which callers'
// roles may call a tool, how often, for how many recipients, and whether a person must confirm
// a call before it runs. A policy is written per tool — in the tool's contract (its policy
// block) or in a policy file (policies: {tool: …}) applied through /api/v1/policies — and the
// router's policy stage decides it for every call, whatever door the call came through.
//
// This package is the policies as written: their fields, their limits and how they are read
// from YAML or JSON. Everything it reads is bounded, and every refusal names the field and the
// reason (Error).
package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// Policy is one tool's policy. Zero fields are not set: a zero Policy allows every call.
type Policy struct {
	// AllowedRoles, when set, are the only callers' roles that may call the tool; every other
	// caller (one with no role too) is refused POLICY_DENIED, and never offered the tool.
	AllowedRoles []string `json:"allowed_roles,omitempty"`
	// RateLimit bounds the calls let through in any window of its length (a sliding window),
	// counted per Scope and shared by every router.
	RateLimit *Rate `json:"rate_limit,omitempty"`
	// Scope says whose calls RateLimit counts together: each caller's own (ScopeCaller, the
	// default) or the tool's, whoever calls (ScopeTool).
	Scope Scope `json:"scope,omitempty"`
	// OnLimit says what becomes of a call over RateLimit: refused RATE_LIMITED with the time
	// to try again (OnLimitRefuse, the default), or parked until the window lets it through
	// (OnLimitWait), for MaxWait at most.
	OnLimit OnLimit `json:"on_limit,omitempty"`
	// MaxWait bounds how long a call waits for the window with OnLimitWait, counted from when
	// its request was accepted (default DefaultMaxWait).
	MaxWait Duration `json:"max_wait,omitempty"`
	// MaxRecipients bounds how many recipients one call names, counted in the arguments the
	// tool's contract names as recipients; over it the call is refused POLICY_DENIED.
	MaxRecipients int `json:"max_recipients,omitempty"`
	// ConfirmRequired parks each call as an approval instead of running it: it runs once a
	// person approves it (the requester, or with Approvers one of those roles who is not the
	// requester), within ExpiresIn.
	ConfirmRequired bool `json:"confirm_required,omitempty"`
	// Approvers, when set, are the roles that may approve a call instead of the requester
	// (four eyes): the requester may not approve its own.
	Approvers []string `json:"approvers,omitempty"`
	// ExpiresIn is how long an approval waits for its decision (default DefaultExpiresIn).
	ExpiresIn Duration `json:"expires_in,omitempty"`
}

// Scope says whose calls a rate limit counts together.
type Scope string

// Scopes.
const (
	ScopeCaller Scope = "caller"
	ScopeTool   Scope = "tool"
)

// OnLimit says what becomes of a call over its rate limit.
type OnLimit string

// What becomes of a call over its rate limit.
const (
	OnLimitRefuse OnLimit = "refuse"
	OnLimitWait   OnLimit = "wait"
)

// Limits and defaults of a policy.
const (
	// MaxRoles bounds allowed_roles and approvers.
	MaxRoles = 16
	// MaxRoleLen bounds a role's name.
	MaxRoleLen = 64
	// MaxRateCount bounds the calls a rate limit lets through per window: the window keeps one
	// entry per call it let through.
	MaxRateCount = 10_000
	// MaxMaxRecipients bounds max_recipients.
	MaxMaxRecipients = 1_000_000
	// DefaultMaxWait is how long a call waits for the window with on_limit: wait.
	DefaultMaxWait = 30 * time.Second
	// MaxMaxWait bounds max_wait.
	MaxMaxWait = time.Hour
	// DefaultExpiresIn is how long an approval waits for its decision.
	DefaultExpiresIn = 15 * time.Minute
	// MaxExpiresIn bounds expires_in.
	MaxExpiresIn = 24 * time.Hour
)

// Rules name what a policy decides, in the order the policy stage decides them.
const (
	RuleAllowedRoles    = "allowed_roles"
	RuleMaxRecipients   = "max_recipients"
	RuleConfirmRequired = "confirm_required"
	RuleRateLimit       = "rate_limit"
)

// ScopeOrDefault is p's scope, ScopeCaller when not written.
func (p *Policy) ScopeOrDefault() Scope {
	if p.Scope == "" {
		return ScopeCaller
	}
	return p.Scope
}

// OnLimitOrDefault is what p does over its rate limit, OnLimitRefuse when not written.
func (p *Policy) OnLimitOrDefault() OnLimit {
	if p.OnLimit == "" {
		return OnLimitRefuse
	}
	return p.OnLimit
}

// MaxWaitOrDefault is how long a call waits for p's window.
func (p *Policy) MaxWaitOrDefault() time.Duration {
	if p.MaxWait == 0 {
		return DefaultMaxWait
	}
	return time.Duration(p.MaxWait)
}

// ExpiresInOrDefault is how long p's approvals wait for their decision.
func (p *Policy) ExpiresInOrDefault() time.Duration {
	if p.ExpiresIn == 0 {
		return DefaultExpiresIn
	}
	return time.Duration(p.ExpiresIn)
}

// Allows reports whether a caller of role may call a tool under p.
func (p *Policy) Allows(role string) bool {
	return p == nil || len(p.AllowedRoles) == 0 || slices.Contains(p.AllowedRoles, role)
}

// Empty reports whether p decides nothing.
func (p *Policy) Empty() bool {
	return p == nil || len(p.AllowedRoles) == 0 && p.RateLimit == nil && p.MaxRecipients == 0 && !p.ConfirmRequired
}

// Summary says what p decides, in a few words: "allowed_roles [admin], confirm_required".
func (p *Policy) Summary() string {
	var parts []string
	if len(p.AllowedRoles) > 0 {
		parts = append(parts, "allowed_roles ["+strings.Join(p.AllowedRoles, ", ")+"]")
	}
	if p.MaxRecipients > 0 {
		parts = append(parts, "max_recipients "+strconv.Itoa(p.MaxRecipients))
	}
	if p.ConfirmRequired {
		s := "confirm_required"
		if len(p.Approvers) > 0 {
			s += " by [" + strings.Join(p.Approvers, ", ") + "]"
		}
		parts = append(parts, s)
	}
	if p.RateLimit != nil {
		parts = append(parts, fmt.Sprintf("rate_limit %s per %s (%s)", p.RateLimit, p.ScopeOrDefault(), p.OnLimitOrDefault()))
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, ", ")
}

// Check refuses a policy whose fields are out of their bounds or make no sense together; the
// Error names the field (under prefix, e.g. "policies.notify_send") and the reason.
func (p *Policy) Check(prefix string) error {
	field := func(f string) string {
		if prefix == "" {
			return f
		}
		return prefix + "." + f
	}
	if err := checkRoles(field("allowed_roles"), p.AllowedRoles); err != nil {
		return err
	}
	if err := checkRoles(field("approvers"), p.Approvers); err != nil {
		return err
	}
	if r := p.RateLimit; r != nil {
		if err := r.check(); err != nil {
			return &Error{Field: field("rate_limit"), Reason: err.Error()}
		}
	}
	switch {
	case p.Scope != "" && p.Scope != ScopeCaller && p.Scope != ScopeTool:
		return &Error{Field: field("scope"), Reason: fmt.Sprintf("must be caller or tool; got %q", protocol.Shorten(string(p.Scope), 32))}
	case p.OnLimit != "" && p.OnLimit != OnLimitRefuse && p.OnLimit != OnLimitWait:
		return &Error{Field: field("on_limit"), Reason: fmt.Sprintf("must be refuse or wait; got %q", protocol.Shorten(string(p.OnLimit), 32))}
	case p.RateLimit == nil && (p.Scope != "" || p.OnLimit != ""):
		return &Error{Field: field(map[bool]string{true: "scope", false: "on_limit"}[p.Scope != ""]), Reason: "applies to a rate_limit, and the policy has none"}
	case p.MaxWait != 0 && p.OnLimitOrDefault() != OnLimitWait:
		return &Error{Field: field("max_wait"), Reason: "bounds the wait of on_limit: wait, and the policy does not wait"}
	case p.MaxWait < 0 || time.Duration(p.MaxWait) > MaxMaxWait:
		return &Error{Field: field("max_wait"), Reason: fmt.Sprintf("must be from 1s to %s", MaxMaxWait)}
	case p.MaxRecipients < 0 || p.MaxRecipients > MaxMaxRecipients:
		return &Error{Field: field("max_recipients"), Reason: fmt.Sprintf("must be from 1 to %d", MaxMaxRecipients)}
	case !p.ConfirmRequired && len(p.Approvers) > 0:
		return &Error{Field: field("approvers"), Reason: "say who approves a confirm_required call, and the policy does not ask for confirmation"}
	case !p.ConfirmRequired && p.ExpiresIn != 0:
		return &Error{Field: field("expires_in"), Reason: "bounds an approval's wait, and the policy does not ask for confirmation"}
	case p.ExpiresIn < 0 || time.Duration(p.ExpiresIn) > MaxExpiresIn:
		return &Error{Field: field("expires_in"), Reason: fmt.Sprintf("must be from 1s to %s", MaxExpiresIn)}
	}
	if p.MaxWait != 0 && time.Duration(p.MaxWait) < time.Second {
		return &Error{Field: field("max_wait"), Reason: fmt.Sprintf("must be from 1s to %s", MaxMaxWait)}
	}
	if p.ExpiresIn != 0 && time.Duration(p.ExpiresIn) < time.Second {
		return &Error{Field: field("expires_in"), Reason: fmt.Sprintf("must be from 1s to %s", MaxExpiresIn)}
	}
	return nil
}

// CheckRoles refuses a policy naming a role not among known (the roles callers can have).
func (p *Policy) CheckRoles(prefix string, known []string) error {
	for _, f := range []struct {
		name  string
		roles []string
	}{{"allowed_roles", p.AllowedRoles}, {"approvers", p.Approvers}} {
		for i, r := range f.roles {
			if !slices.Contains(known, r) {
				return &Error{Field: fmt.Sprintf("%s.%s[%d]", prefix, f.name, i), Reason: fmt.Sprintf("%q is no role; the roles are %s", r, strings.Join(known, ", "))}
			}
		}
	}
	return nil
}

func checkRoles(field string, roles []string) error {
	if roles == nil {
		return nil
	}
	if len(roles) == 0 {
		return &Error{Field: field, Reason: "is empty; leave it out rather than name no role"}
	}
	if len(roles) > MaxRoles {
		return &Error{Field: field, Reason: fmt.Sprintf("names %d roles; at most %d", len(roles), MaxRoles)}
	}
	for i, r := range roles {
		if r == "" || len(r) > MaxRoleLen || !protocol.Printable(r) || strings.TrimSpace(r) != r {
			return &Error{Field: fmt.Sprintf("%s[%d]", field, i), Reason: fmt.Sprintf("a role is 1 to %d printable characters, without spaces around", MaxRoleLen)}
		}
		if slices.Index(roles, r) < i {
			return &Error{Field: fmt.Sprintf("%s[%d]", field, i), Reason: fmt.Sprintf("%q is named twice", r)}
		}
	}
	return nil
}

// Rate is a rate limit: at most Count calls in any window of length Per.
type Rate struct {
	Count int
	Per   time.Duration
}

// The windows a rate may have.
var windows = []struct {
	names []string
	d     time.Duration
}{
	{[]string{"s", "sec", "second"}, time.Second},
	{[]string{"min", "m", "minute"}, time.Minute},
	{[]string{"h", "hour"}, time.Hour},
}

// ParseRate reads a rate: "10" (calls per minute, the seed's bare number), "10/s", "10/min",
// "100/h" (also "10/sec", "10/second", "10/m", "10/minute", "10/hour").
func ParseRate(s string) (*Rate, error) {
	count, per, found := strings.Cut(strings.TrimSpace(s), "/")
	n, err := strconv.Atoi(strings.TrimSpace(count))
	if err != nil {
		return nil, fmt.Errorf("%q is no rate: write a number of calls per minute (10), or per second, minute or hour (10/s, 10/min, 100/h)", protocol.Shorten(s, 32))
	}
	r := &Rate{Count: n, Per: time.Minute}
	if found {
		r.Per = 0
		unit := strings.TrimSpace(per)
		for _, w := range windows {
			if slices.Contains(w.names, unit) {
				r.Per = w.d
			}
		}
		if r.Per == 0 {
			return nil, fmt.Errorf("%q is no window: a rate is per s, min or h", protocol.Shorten(unit, 16))
		}
	}
	return r, r.check()
}

func (r *Rate) check() error {
	if r.Count < 1 || r.Count > MaxRateCount {
		return fmt.Errorf("lets %d calls through per window; a rate lets 1 to %d through", r.Count, MaxRateCount)
	}
	if r.Per != time.Second && r.Per != time.Minute && r.Per != time.Hour {
		return fmt.Errorf("a rate's window is a second, a minute or an hour")
	}
	return nil
}

// String writes r as ParseRate reads it: "10/min".
func (r Rate) String() string {
	unit := "min"
	switch r.Per {
	case time.Second:
		unit = "s"
	case time.Hour:
		unit = "h"
	}
	return strconv.Itoa(r.Count) + "/" + unit
}

// MarshalJSON writes r as its String.
func (r Rate) MarshalJSON() ([]byte, error) { return json.Marshal(r.String()) }

// UnmarshalJSON reads a rate as ParseRate does, or a bare number of calls per minute.
func (r *Rate) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var n json.Number
		if json.Unmarshal(b, &n) != nil {
			return errors.New("a rate is a number of calls per minute or a string such as 10/s")
		}
		s = n.String()
	}
	p, err := ParseRate(s)
	if err != nil {
		return err
	}
	*r = *p
	return nil
}

// Duration is a length of time written as Go writes one ("15m", "90s", "1h30m").
type Duration time.Duration

// String writes d as time.Duration does.
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON writes d as its String.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON reads "15m" and the like.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return errors.New("a duration is a string such as 15m or 90s")
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q is no duration: write one such as 15m or 90s", protocol.Shorten(s, 32))
	}
	*d = Duration(v)
	return nil
}

// Error says why a policy was refused: the line (of YAML; 0 when unknown), the field's path
// (policies.notify_send.rate_limit) and the reason. Its text is bounded.
type Error struct {
	Line   int
	Field  string
	Reason string
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Field != "" {
		b.WriteString(protocol.Shorten(e.Field, 256))
		b.WriteString(": ")
	}
	b.WriteString(protocol.Shorten(e.Reason, 1<<10))
	return b.String()
}

// CountRecipients counts the recipients a call's arguments (a JSON object) name in the
// arguments called names: an array counts its elements, null or a missing argument none, any
// other value one.
func CountRecipients(args json.RawMessage, names []string) (int, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(args, &obj); err != nil {
		return 0, errors.New("the arguments are not a JSON object")
	}
	n := 0
	for _, name := range names {
		v, ok := obj[name]
		if !ok || string(v) == "null" {
			continue
		}
		var list []json.RawMessage
		if len(v) > 0 && v[0] == '[' {
			if err := json.Unmarshal(v, &list); err != nil {
				return 0, fmt.Errorf("argument %s is not a JSON array", protocol.Shorten(name, 64))
			}
			n += len(list)
			continue
		}
		n++
	}
	return n, nil
}
