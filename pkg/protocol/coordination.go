package protocol

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// State coordination: calls that change the same resource (a contract's resource_key) run one
// at a time, in the order their proposals were accepted, each under a transaction id and a
// fencing token the tool is given.
const (
	// HeaderTx carries a call's transaction id to an HTTP tool (gRPC: metadata x-hermes-tx;
	// MCP: _meta "hermes/tx").
	HeaderTx = "X-Hermes-Tx"
	// HeaderFence carries a call's fencing token to an HTTP tool (gRPC: metadata
	// x-hermes-fence; MCP: _meta "hermes/fence"). A tool that changes the resource refuses a
	// token lower than the highest it has seen for that resource.
	HeaderFence = "X-Hermes-Fence"
	// HeaderResource carries the resource key a call's grant is for.
	HeaderResource = "X-Hermes-Resource"
	// TxPrefix starts every transaction id.
	TxPrefix = "mcp-tx-"
	// MaxResourceKeyLen bounds a resource key, in bytes.
	MaxResourceKeyLen = 256
	// MaxChanges bounds the fields a contract says its tool changes.
	MaxChanges = 16
)

// Coordination event operations (CoordinationEvent.Op).
const (
	CoordProposed = "proposed"
	CoordWaiting  = "waiting"
	CoordGranted  = "granted"
	CoordReleased = "released"
	CoordExpired  = "expired"
	CoordConflict = "conflict"
)

// Grant is a call's turn on the resource it changes: the transaction its request's changes of
// the resource run under, and the fencing token of this turn — strictly greater than every
// earlier turn's on the same resource.
type Grant struct {
	// Tx is the transaction id (TxPrefix and 12 hex digits): one per request and resource.
	Tx string `msgpack:"tx" json:"tx"`
	// Fence is the turn's fencing token.
	Fence uint64 `msgpack:"fence" json:"fence"`
	// Resource is the resource key (the contract's resource_key, filled in from the call).
	Resource string `msgpack:"resource" json:"resource"`
	// Changes are the fields the tool's contract says it changes.
	Changes []string `msgpack:"changes,omitempty" json:"changes,omitempty"`
}

// Check validates a grant read from the bus.
func (g *Grant) Check() error {
	if !ValidTx(g.Tx) {
		return fieldErr("grant.tx", "must be "+TxPrefix+" and 12 hex digits")
	}
	if g.Fence == 0 {
		return fieldErr("grant.fence", "must be positive")
	}
	if err := CheckResourceKey("grant.resource", g.Resource); err != nil {
		return err
	}
	if len(g.Changes) > MaxChanges {
		return fieldErr("grant.changes", fmt.Sprintf("at most %d fields", MaxChanges))
	}
	for _, c := range g.Changes {
		if c == "" || len(c) > 128 || !Printable(c) {
			return fieldErr("grant.changes", "a field's name is 1 to 128 printable characters")
		}
	}
	return nil
}

// CheckResourceKey says what is wrong with a resource key, if anything: 1 to
// MaxResourceKeyLen printable bytes.
func CheckResourceKey(field, key string) error {
	if key == "" || len(key) > MaxResourceKeyLen || !Printable(key) {
		return fieldErr(field, fmt.Sprintf("a resource key is 1 to %d printable bytes", MaxResourceKeyLen))
	}
	return nil
}

// TxID is the transaction id of a request's changes of resource: the same for every call of
// the request that changes it, and on every delivery.
func TxID(requestID, resource string) string {
	h := sha256.Sum256([]byte(requestID + "\x00" + resource))
	return TxPrefix + hex.EncodeToString(h[:6])
}

// ValidTx reports whether s is a transaction id as TxID makes them.
func ValidTx(s string) bool {
	hexPart, ok := strings.CutPrefix(s, TxPrefix)
	if !ok || len(hexPart) != 12 {
		return false
	}
	_, err := hex.DecodeString(hexPart)
	return err == nil && strings.ToLower(hexPart) == hexPart
}

// ResourceToken is the subject-safe token that names resource in the coordination bucket and
// in wake keys: 32 lowercase hex digits of its SHA-256.
func ResourceToken(resource string) string {
	h := sha256.Sum256([]byte(resource))
	return hex.EncodeToString(h[:16])
}

// WakeOnTurn is the wake key of a call waiting for its turn on a resource.
func WakeOnTurn(requestID, callID string) string { return "turn." + requestID + "." + callID }

// MsgIDCoordination is the message id of a coordination event: the same event is recorded
// once.
func MsgIDCoordination(op, requestID, callID string, fence uint64) string {
	return "coord:" + op + ":" + requestID + ":" + callID + ":" + strconv.FormatUint(fence, 10)
}

// CoordinationEvent is the payload of a coordination message: what state coordination did
// about one call of the request the envelope names.
type CoordinationEvent struct {
	// Op is one of the Coord* operations.
	Op         string `msgpack:"op" json:"op"`
	ToolCallID string `msgpack:"tool_call_id" json:"tool_call_id"`
	Tool       string `msgpack:"tool" json:"tool"`
	Resource   string `msgpack:"resource" json:"resource"`
	Tx         string `msgpack:"tx" json:"tx"`
	// Fence is the turn's fencing token (granted, released, expired).
	Fence uint64 `msgpack:"fence,omitempty" json:"fence,omitempty"`
	// HeldBy, on a wait, is the call that holds the resource ("request_id/tool_call_id").
	HeldBy string `msgpack:"held_by,omitempty" json:"held_by,omitempty"`
	// Position, on a wait, is the call's place in the resource's queue (1: next).
	Position int      `msgpack:"position,omitempty" json:"position,omitempty"`
	Changes  []string `msgpack:"changes,omitempty" json:"changes,omitempty"`
	// SuggestedOrder, on a conflict, is the order the contracts' precedence puts the tools in.
	SuggestedOrder []string `msgpack:"suggested_order,omitempty" json:"suggested_order,omitempty"`
	// Reason says why, in words (a release's result status, a conflict's tools).
	Reason string    `msgpack:"reason,omitempty" json:"reason,omitempty"`
	At     time.Time `msgpack:"at" json:"at"`
}

// MaxCoordinationTextBytes bounds a coordination event's words.
const MaxCoordinationTextBytes = 1024

// DecodeCoordination reads the coordination payload of m.
func (m *Message) DecodeCoordination() (*CoordinationEvent, error) {
	var e CoordinationEvent
	if err := m.decodePayload(TypeCoordination, &e); err != nil {
		return nil, err
	}
	switch e.Op {
	case CoordProposed, CoordWaiting, CoordGranted, CoordReleased, CoordExpired, CoordConflict:
	default:
		return nil, fieldErr("op", "is not a coordination operation")
	}
	if err := CheckID("tool_call_id", e.ToolCallID); err != nil {
		return nil, err
	}
	if err := CheckToolName("tool", e.Tool); err != nil {
		return nil, err
	}
	if err := CheckResourceKey("resource", e.Resource); err != nil {
		return nil, err
	}
	if !ValidTx(e.Tx) {
		return nil, fieldErr("tx", "must be "+TxPrefix+" and 12 hex digits")
	}
	if e.Position < 0 || len(e.Changes) > MaxChanges || len(e.SuggestedOrder) > 1024 {
		return nil, fieldErr("position", "out of bounds")
	}
	for _, s := range append(append([]string{e.HeldBy, e.Reason}, e.Changes...), e.SuggestedOrder...) {
		if len(s) > MaxCoordinationTextBytes || !Printable(s) {
			return nil, fieldErr("reason", fmt.Sprintf("must be at most %d printable bytes", MaxCoordinationTextBytes))
		}
	}
	return &e, nil
}
