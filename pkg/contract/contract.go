// Package contract is what a tool promises: the arguments it takes (input_schema), the answers
// it gives (output_schema: {"success": …} or {"failure": …}, or a plain value), how it is run
// (execution_policy) and what calling it does (effects). Hermes checks every call's arguments
// before dispatch and every answer before anyone sees it.
//
// A contract is written in YAML or JSON (read by package registry), in the shape of seed 003
// §3.2; its schemas take two forms, the seed's short one (field → type, required, pattern, …) and full JSON Schema (a
// top-level type or $schema says which). Compile turns a contract into checks, built with
// santhosh-tekuri/jsonschema (draft 2020-12 unless the schema names another); no schema is ever
// fetched from anywhere.
//
// What a check costs is bounded: Compile refuses a schema whose checks could cost more than
// their value's size accounts for (branches that fan out past MaxSchemaExpansion, a recursion
// that checks the part below each level twice), and each check counts its steps before it runs,
// refusing a value that would take more than MaxCheckSteps (or go deeper than MaxCheckDepth)
// as arguments that break the contract. What a check says is bounded too: a few KiB, however
// many problems, a number shown by 32 characters at most.
package contract

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/hermesbus/hermes/pkg/policy"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Effects says what calling a tool does.
type Effects string

const (
	// EffectsNone: the call changes nothing (a lookup).
	EffectsNone Effects = "none"
	// EffectsIdempotent: the call may change something, and the same call again changes
	// nothing more (the default).
	EffectsIdempotent Effects = "idempotent"
	// EffectsSideEffects: each call may change something again (a payment, a message sent).
	EffectsSideEffects Effects = "side_effects"
)

// AllEffects lists the effects a contract may declare.
var AllEffects = []Effects{EffectsNone, EffectsIdempotent, EffectsSideEffects}

// ResourceLevels are the levels execution_policy.resource_level takes: light, medium, heavy.
var ResourceLevels = []string{"L", "M", "H"}

// Limits of a contract.
const (
	// MaxDescriptionBytes bounds a contract's description (it is shown to LLMs).
	MaxDescriptionBytes = 4096
	// MaxSourceBytes bounds a contract as written.
	MaxSourceBytes = 64 << 10
	// MaxRetries bounds execution_policy.max_retries.
	MaxRetries = 10
	// MaxInFlight bounds execution_policy.max_in_flight.
	MaxInFlight = 100_000
)

// Contract is one tool's contract as written (its schemas in the form given, as JSON).
type Contract struct {
	// Name is the tool's name (a tool call's name).
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// InputSchema checks a call's arguments; none means any arguments.
	InputSchema json.RawMessage `json:"input_schema,omitempty"`
	// OutputSchema checks the tool's answers; none means any answer.
	OutputSchema    json.RawMessage `json:"output_schema,omitempty"`
	ExecutionPolicy *Policy         `json:"execution_policy,omitempty"`
	// Effects is EffectsIdempotent when not written.
	Effects Effects `json:"effects,omitempty"`
	// Reach says how the tool is called when the contract names it itself (an action as in
	// a routes rule); nil: the routes file's rules for Name say.
	Reach *protocol.Action `json:"reach,omitempty"`
	// Sandbox is where the sandbox tries the tool, when not where real calls go: a test
	// double or a staging copy. Only against it (or with the registrar's leave) is a tool with
	// side effects tried.
	Sandbox *protocol.Action `json:"sandbox,omitempty"`
	// Recipients names the arguments that name a call's recipients (user_ids, attendees): a
	// policy's max_recipients counts them (an array counts its elements, any other value one).
	Recipients []string `json:"recipients,omitempty"`
	// Policy is the tool's policy (package policy) unless one applied through the policies'
	// API stands for it.
	Policy *policy.Policy `json:"policy,omitempty"`
	// ResourceKey names the resource a call changes: an argument's name, or a template of
	// arguments such as "order:{order_id}" (resource.go). Calls that change the same
	// resource run one at a time.
	ResourceKey string `json:"resource_key,omitempty"`
	// Changes names the resource's fields the tool changes.
	Changes []string `json:"changes,omitempty"`
	// Precedence orders the tool's changes of a resource against other tools' in one request.
	Precedence *Precedence `json:"precedence,omitempty"`
	// OnConflict is OnConflictRefuse (the default) or OnConflictOrder.
	OnConflict string `json:"on_conflict,omitempty"`
}

// MaxRecipientArgs bounds the arguments a contract names as recipients.
const MaxRecipientArgs = 16

// Policy is a contract's execution_policy. Zero fields are not set.
type Policy struct {
	// TimeoutMS bounds each try.
	TimeoutMS int `json:"timeout_ms,omitempty"`
	// MaxRetries is how many tries may follow a failed first one; nil: not set.
	MaxRetries *int `json:"max_retries,omitempty"`
	// ResourceLevel is one of ResourceLevels.
	ResourceLevel string `json:"resource_level,omitempty"`
	// MaxInFlight bounds the tool's calls in flight at once across every worker (its
	// consumer's MaxAckPending); 0: the bus's default.
	MaxInFlight int `json:"max_in_flight,omitempty"`
}

// EffectsOrDefault returns c's effects, EffectsIdempotent when not written.
func (c *Contract) EffectsOrDefault() Effects {
	if c.Effects == "" {
		return EffectsIdempotent
	}
	return c.Effects
}

// Ref names the version of a contract a call runs under.
func (c *Compiled) Ref() *protocol.ContractRef {
	return &protocol.ContractRef{Name: c.Name, Version: c.Version, Revision: c.Revision,
		ResourceLevel: c.policy().ResourceLevel, Effects: string(c.EffectsOrDefault())}
}

func (c *Contract) policy() Policy {
	if c.ExecutionPolicy == nil {
		return Policy{}
	}
	return *c.ExecutionPolicy
}

// Apply returns a with the contract's execution policy applied, the stricter of the two winning:
// each try's timeout is the smaller of the action's and the contract's timeout_ms, and the tries
// are at most 1 + max_retries. What the contract does not set is the action's.
func (c *Contract) Apply(a protocol.Action) protocol.Action {
	p := c.policy()
	if p.TimeoutMS > 0 && (a.TimeoutMS <= 0 || p.TimeoutMS < a.TimeoutMS) {
		a.TimeoutMS = p.TimeoutMS
	}
	if p.MaxRetries != nil && 1+*p.MaxRetries < a.Retry.MaxAttempts {
		a.Retry.MaxAttempts = 1 + *p.MaxRetries
	}
	return a
}

// check validates what Parse or a program filled in, apart from the schemas.
func (c *Contract) check() error {
	if err := protocol.CheckToolName("name", c.Name); err != nil {
		return &Error{Field: "name", Reason: strings.TrimPrefix(err.Error(), "name: ")}
	}
	if len(c.Description) > MaxDescriptionBytes {
		return &Error{Field: "description", Reason: fmt.Sprintf("is %d bytes; at most %d", len(c.Description), MaxDescriptionBytes)}
	}
	if c.Reach != nil {
		if err := c.Reach.Check(); err != nil {
			return &Error{Field: "reach", Reason: err.Error()}
		}
	}
	if c.Sandbox != nil {
		if err := c.Sandbox.Check(); err != nil {
			return &Error{Field: "sandbox", Reason: err.Error()}
		}
	}
	if c.Effects != "" && !slices.Contains(AllEffects, c.Effects) {
		return &Error{Field: "effects", Reason: fmt.Sprintf("must be one of none, idempotent, side_effects; got %q", protocol.Shorten(string(c.Effects), 32))}
	}
	if err := c.checkPolicy(); err != nil {
		return err
	}
	if p := c.ExecutionPolicy; p != nil {
		switch {
		case p.TimeoutMS < 0 || p.TimeoutMS > protocol.MaxTimeoutMS:
			return &Error{Field: "execution_policy.timeout_ms", Reason: fmt.Sprintf("must be from 1 to %d", protocol.MaxTimeoutMS)}
		case p.MaxRetries != nil && (*p.MaxRetries < 0 || *p.MaxRetries > MaxRetries):
			return &Error{Field: "execution_policy.max_retries", Reason: fmt.Sprintf("must be from 0 to %d", MaxRetries)}
		case p.MaxInFlight < 0 || p.MaxInFlight > MaxInFlight:
			return &Error{Field: "execution_policy.max_in_flight", Reason: fmt.Sprintf("must be from 1 to %d", MaxInFlight)}
		case p.ResourceLevel != "" && !slices.Contains(ResourceLevels, p.ResourceLevel):
			return &Error{Field: "execution_policy.resource_level", Reason: fmt.Sprintf("must be one of L, M, H; got %q", protocol.Shorten(p.ResourceLevel, 16))}
		}
	}
	return nil
}

// checkPolicy checks the contract's recipients and policy block.
func (c *Contract) checkPolicy() error {
	if len(c.Recipients) > MaxRecipientArgs {
		return &Error{Field: "recipients", Reason: fmt.Sprintf("names %d arguments; at most %d", len(c.Recipients), MaxRecipientArgs)}
	}
	for i, r := range c.Recipients {
		if r == "" || len(r) > 128 || !protocol.Printable(r) {
			return &Error{Field: fmt.Sprintf("recipients[%d]", i), Reason: "an argument's name is 1 to 128 printable characters"}
		}
		if slices.Index(c.Recipients, r) < i {
			return &Error{Field: fmt.Sprintf("recipients[%d]", i), Reason: fmt.Sprintf("%q is named twice", r)}
		}
	}
	p := c.Policy
	if p == nil {
		return nil
	}
	if err := p.Check("policy"); err != nil {
		var e *policy.Error
		if errors.As(err, &e) {
			return &Error{Line: e.Line, Field: e.Field, Reason: e.Reason}
		}
		return err
	}
	if p.MaxRecipients > 0 && len(c.Recipients) == 0 {
		return &Error{Field: "policy.max_recipients", Reason: "counts the arguments the contract names in recipients, and it names none; add recipients: [the arguments that name them]"}
	}
	return nil
}

// ErrUnavailable is wrapped by the errors of whoever gives contracts by version (the registry)
// when that version cannot be had: no longer kept, or damaged.
var ErrUnavailable = errors.New("contract: that version of the contract is not available")

// Error says why a contract was refused: the line (of YAML; 0 when unknown), the field's path
// (input_schema.order_id.pattern) and the reason. It never quotes a header value. Its text is
// bounded: a field of more than 256 bytes, or a reason of more than 1 KiB, is cut.
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
		b.WriteString(brief(e.Field, 256))
		b.WriteString(": ")
	}
	b.WriteString(brief(e.Reason, 1<<10))
	return b.String()
}
