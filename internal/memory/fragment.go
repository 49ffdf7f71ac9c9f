// Package memory keeps what Hermes remembers about a user between conversations (seed 003
// §2.4, §3.4): reusable context fragments {type, key, value, lifespan, semantic_tag}, each
// scoped to its owner (the caller, or the end user an application acts for) and, with the
// lifespan "session", to one session.
//
// Guarantees:
//   - One owner's fragments never reach another owner: every operation names its owner, and an
//     owner's fragments live in an entry of their own in the hermes-memory bucket.
//   - Writing a key again replaces its value atomically (compare-and-set on the owner's entry);
//     every write, replacement, deletion, lapse and eviction is an event on the record
//     (memory.v1, on the owner's memory session), so the history stays readable there after
//     the bucket holds only the last value.
//   - Lifetimes are Hermes' to check, with the Store's clock (tests move it): a fragment past its
//     expiry is never returned, and is removed by the next write to its owner or by Sweep. The
//     bucket's per-entry TTL is a backstop only.
//   - Everything an owner can grow is bounded: bytes of a key, a type, a value, tags, fragments
//     per owner and bytes per owner. An owner at capacity loses the least relevant fragment that
//     is not forever; a forever fragment is never evicted for room, and a write that cannot fit
//     it is refused (ErrFull).
package memory

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// WriteTool is the built-in tool with which the chat loop's model remembers a fragment. It runs
// in the gateway, under the tool policies' allowed_roles and rate_limit.
const WriteTool = "memory_write"

// Lifespans, as a fragment names them: "session", a duration ("30d", "2h", "15m", "90s"), or
// "forever".
const (
	LifespanSession = "session"
	LifespanForever = "forever"
)

// Bounds of a fragment.
const (
	MaxKeyBytes   = protocol.MaxMemoryKeyBytes
	MaxTypeBytes  = 64
	MaxValueBytes = protocol.MaxMemoryValueBytes
	MaxTags       = protocol.MaxMemoryTags
	MaxTagBytes   = 64
	// MaxLifespan is the longest duration a lifespan may name (forever aside).
	MaxLifespan = 10 * 365 * 24 * time.Hour
	// MinLifespan is the shortest.
	MinLifespan = time.Second
)

// Lifespan is how long a fragment lives: Forever, for its session (Session), or For a duration
// from its last write.
type Lifespan struct {
	Forever bool
	Session bool
	For     time.Duration
}

// String is the lifespan as a fragment names it.
func (l Lifespan) String() string {
	switch {
	case l.Forever:
		return LifespanForever
	case l.Session:
		return LifespanSession
	case l.For%(24*time.Hour) == 0:
		return strconv.FormatInt(int64(l.For/(24*time.Hour)), 10) + "d"
	default:
		return l.For.String()
	}
}

var durationForm = regexp.MustCompile(`^([0-9]{1,6})(d|h|m|s)$`)

// ParseLifespan reads a lifespan: "session", "forever", or a whole number of days, hours,
// minutes or seconds ("30d", "2h", "15m", "90s"), or a Go duration ("1h30m"), between
// MinLifespan and MaxLifespan.
func ParseLifespan(s string) (Lifespan, error) {
	switch s {
	case LifespanSession:
		return Lifespan{Session: true}, nil
	case LifespanForever:
		return Lifespan{Forever: true}, nil
	case "":
		return Lifespan{}, errors.New("is required: session, forever, or a duration such as 30d, 2h or 15m")
	}
	var d time.Duration
	if m := durationForm.FindStringSubmatch(s); m != nil {
		n, _ := strconv.ParseInt(m[1], 10, 64)
		unit := map[string]time.Duration{"d": 24 * time.Hour, "h": time.Hour, "m": time.Minute, "s": time.Second}[m[2]]
		if n > int64(MaxLifespan/unit) {
			return Lifespan{}, fmt.Errorf("%q is longer than %s; say forever", s, Lifespan{For: MaxLifespan})
		}
		d = time.Duration(n) * unit
	} else {
		var err error
		if d, err = time.ParseDuration(s); err != nil || len(s) > 32 {
			return Lifespan{}, fmt.Errorf("%s is not a lifespan: say session, forever, or a duration such as 30d, 2h or 15m", quote(s))
		}
	}
	if d < MinLifespan || d > MaxLifespan {
		return Lifespan{}, fmt.Errorf("%q must be between %s and %s (or session, or forever)", s, MinLifespan, Lifespan{For: MaxLifespan})
	}
	return Lifespan{For: d}, nil
}

// Fragment is one thing remembered about its owner.
type Fragment struct {
	// Session is the session a fragment of lifespan "session" belongs to; empty otherwise.
	Session string `json:"session_id,omitempty"`
	Type    string `json:"type"`
	Key     string `json:"key"`
	// Value is any JSON value.
	Value    json.RawMessage `json:"value"`
	Lifespan string          `json:"lifespan"`
	Tags     []string        `json:"semantic_tag,omitempty"`
	// Source says who wrote it: "api", "model" (the chat loop's memory_write) or "rule".
	Source string `json:"source,omitempty"`
	// Domain is the business domain of the intent a session fragment was written in: with a
	// decay configured for it (Store.Decay), the fragment lives that long from its last write
	// or use instead of SessionIdle, and is archived when it lapses.
	Domain string `json:"domain,omitempty"`
	// Version counts the writes of its key since it was first written (1: the first).
	Version   int       `json:"version"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// ExpiresAt is when it lapses; zero for forever. A session fragment lapses SessionIdle
	// after its last write or use.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// UsedAt is when it was last given to a model; Uses how many times.
	UsedAt time.Time `json:"used_at,omitzero"`
	Uses   int       `json:"uses,omitempty"`
}

// Forever reports whether f never lapses.
func (f *Fragment) Forever() bool { return f.Lifespan == LifespanForever }

// Live reports whether f has not lapsed at now.
func (f *Fragment) Live(now time.Time) bool { return f.ExpiresAt.IsZero() || now.Before(f.ExpiresAt) }

// id names f among its owner's fragments: its key, in its session for a session fragment.
func (f *Fragment) id() string { return f.Session + "\x00" + f.Key }

// HasTag reports whether f carries tag.
func (f *Fragment) HasTag(tag string) bool {
	for _, t := range f.Tags {
		if t == tag {
			return true
		}
	}
	return false
}

// DecayPerDay is how much of a fragment's relevance is left after a day unused (the seed's
// ×0.95 a day).
const DecayPerDay = 0.95

// Relevance is how much f is worth keeping at now: 0.95 to the power of the days since it was
// last written or used, times 1 + ln(1 + uses) — what was used often and lately ranks first.
func (f *Fragment) Relevance(now time.Time) float64 {
	last := f.UpdatedAt
	if f.UsedAt.After(last) {
		last = f.UsedAt
	}
	days := now.Sub(last).Hours() / 24
	if days < 0 {
		days = 0
	}
	return math.Pow(DecayPerDay, days) * (1 + math.Log1p(float64(f.Uses)))
}

// Write is what a caller asks to remember.
type Write struct {
	// Session is required with the lifespan "session", and names the session the fragment
	// belongs to; with another lifespan it must be empty (the fragment is the owner's).
	Session  string          `json:"session_id,omitempty"`
	Type     string          `json:"type"`
	Key      string          `json:"key"`
	Value    json.RawMessage `json:"value"`
	Lifespan string          `json:"lifespan"`
	Tags     []string        `json:"semantic_tag,omitempty"`
	Source   string          `json:"-"`
	// Domain is the intent's domain a session fragment is written in (Fragment.Domain).
	Domain string `json:"-"`
}

// FieldError is a write's field that is wrong, and why.
type FieldError = protocol.FieldError

func fieldErr(field, reason string) error { return &protocol.FieldError{Field: field, Reason: reason} }

// Check says what is wrong with w, naming the field, and returns its lifespan.
func (w *Write) Check() (Lifespan, error) {
	if err := checkText("key", w.Key, MaxKeyBytes); err != nil {
		return Lifespan{}, err
	}
	if err := checkText("type", w.Type, MaxTypeBytes); err != nil {
		return Lifespan{}, err
	}
	if len(w.Value) == 0 {
		return Lifespan{}, fieldErr("value", "is required (any JSON value)")
	}
	if len(w.Value) > MaxValueBytes {
		return Lifespan{}, fieldErr("value", fmt.Sprintf("is %d bytes long; the limit is %d", len(w.Value), MaxValueBytes))
	}
	if !json.Valid(w.Value) {
		return Lifespan{}, fieldErr("value", "is not JSON")
	}
	if len(w.Tags) > MaxTags {
		return Lifespan{}, fieldErr("semantic_tag", fmt.Sprintf("has %d tags; the limit is %d", len(w.Tags), MaxTags))
	}
	for i, t := range w.Tags {
		if err := checkText(fmt.Sprintf("semantic_tag[%d]", i), t, MaxTagBytes); err != nil {
			return Lifespan{}, err
		}
	}
	l, err := ParseLifespan(w.Lifespan)
	if err != nil {
		return Lifespan{}, fieldErr("lifespan", err.Error())
	}
	switch {
	case l.Session && w.Session == "":
		return Lifespan{}, fieldErr("session_id", "is required with the lifespan session")
	case !l.Session && w.Session != "":
		return Lifespan{}, fieldErr("session_id", fmt.Sprintf("names a session, but the lifespan is %s: only a session fragment belongs to one", l))
	case w.Session != "":
		if err := protocol.CheckID("session_id", w.Session); err != nil {
			return Lifespan{}, err
		}
	}
	return l, nil
}

// checkText says what is wrong with s as field: empty, longer than max bytes, not UTF-8, or
// holding control characters.
func checkText(field, s string, max int) error {
	switch {
	case s == "":
		return fieldErr(field, "is required")
	case len(s) > max:
		return fieldErr(field, fmt.Sprintf("is %d bytes long; the limit is %d", len(s), max))
	case !utf8.ValidString(s) || !protocol.Printable(s):
		return fieldErr(field, "must be printable UTF-8 text")
	}
	return nil
}

func quote(s string) string {
	if len(s) > 40 {
		s = s[:40] + "…"
	}
	return strconv.Quote(strings.ToValidUTF8(s, "?"))
}
