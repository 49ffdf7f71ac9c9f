// Package admission decides, in one place, whether a request may come in at any of Hermes'
// doors — POST /v1/route, the chat dialects (OpenAI-compatible, Ollama, /v1/chat), /mcp, the
// session event streams and the bus ingress for external NATS clients: who asks (an Actor),
// whether it may (its permission, and the end user it names), whether it is within its limits
// (requests waiting, streams open, its rate), whether the session is its own (claimed for it on
// first use, 404 otherwise), and whether the record has room (store pressure). Every door asks
// Admit and renders its Refusal in its own dialect; no door decides any of it itself.
//
// Guarantees: a refusal takes nothing (no hold is kept, no session claimed, nothing counted
// against the store); a ticket holds what it took until it is closed. A session belongs to the
// first actor that sends into it, for as long as the record holds its requests; one whose
// requests are on the record without an owner is nobody's to claim. Checks run in one order —
// permission, end user, limits, store, session — so that a request wrong in several ways gets
// the same answer at every door.
package admission

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Refusal is why a request was not admitted, as every dialect renders it: an HTTP status, a
// Hermes error code (protocol.Code*), a message for the caller, the field at fault, and how
// long to wait before trying again (0: no point waiting).
type Refusal struct {
	Status     int
	Code       string
	Message    string
	Field      string
	RetryAfter time.Duration
	// Never: the request could never be admitted, however long it waited (larger than the
	// record could ever take).
	Never bool
}

func (r *Refusal) Error() string { return r.Message }

// AsRefusal returns err's Refusal, or nil when err is not one.
func AsRefusal(err error) *Refusal {
	var r *Refusal
	if errors.As(err, &r) {
		return r
	}
	return nil
}

// Mode is what a request does with its session.
type Mode int

const (
	// Send claims the session for the actor (it becomes its owner when it has none): requests
	// go only into one's own sessions, whatever one may read.
	Send Mode = iota
	// Follow reads the session as it is recorded (an event stream): the actor's own, or, for
	// those who read every session, any the record holds.
	Follow
	// NoSession: the request names none (yet).
	NoSession
	// Claimed: the request is part of one admitted with Send into the same session (a chat
	// run's turns): the session is the actor's, and is not claimed again.
	Claimed
)

// Store says how a request counts against the record's room.
type Store int

const (
	// StoreCount refuses the request when the record is near its limit, or would be with
	// the request's footprint (Ask.Size bytes); counted until its writes are seen.
	StoreCount Store = iota
	// StoreCheck refuses the request while the record is near its limit, counting nothing
	// (a chat run, whose turns are counted one by one).
	StoreCheck
	// StoreAccepted counts the request's footprint, never refusing it: it is part of a run
	// the record has accepted, which must be able to finish.
	StoreAccepted
	// StoreNone: the request writes nothing.
	StoreNone
)

// Ask is one request at a door.
type Ask struct {
	Actor Actor
	// Need is the permission the request needs ("" none beyond being a caller).
	Need    auth.Permission
	Session string
	Mode    Mode
	// Hold is what the request holds of its caller's limits while it is served.
	Hold Hold
	// WaitRate waits for the caller's rate rather than refusing (the requests one request
	// makes: each turn of a chat run).
	WaitRate bool
	Store    Store
	// Size is the request's size in bytes, for StoreCount and StoreAccepted.
	Size int
}

// Ticket is an admitted request: what it holds until Close.
type Ticket struct {
	// Owner is the session's owner ("" without identities or without a session).
	Owner string
	// Caller is the actor as the record keeps it (nil without identities).
	Caller  *protocol.Caller
	release func()
	count   *counted
}

// Accepted notes whether the submission accepted something new (err nil and not a replay);
// only then does the request keep counting against the store after Close.
func (t *Ticket) Accepted(yes bool) {
	if t != nil && t.count != nil {
		t.count.kept = yes
	}
}

// Close gives back what the ticket holds. Safe on nil and more than once.
func (t *Ticket) Close() {
	if t == nil {
		return
	}
	if t.release != nil {
		t.release()
		t.release = nil
	}
	if t.count != nil {
		t.count.close()
		t.count = nil
	}
}

// Config configures an Admitter.
type Config struct {
	// Bus is where sessions' owners (its bucket OwnersBucket, provisioned as Bucket says) and
	// the record are; nil keeps owners in memory and never finds the store full (tests).
	Bus *bus.Bus
	// Limits bound each caller; zero fields take DefaultCallerLimits.
	Limits CallerLimits
	// StoreCheckEvery is how often the record's fill is looked at (Run). Default 2 s.
	StoreCheckEvery time.Duration
	Logger          *slog.Logger
}

// Admitter admits requests at every door of one process. It is safe for concurrent use.
type Admitter struct {
	bus    *bus.Bus
	log    *slog.Logger
	every  time.Duration
	limits *Limits
	owners *owners
	store  storeGauge
}

// New returns an Admitter for cfg; the store's fill is known once Run has looked at it.
func New(cfg Config) *Admitter {
	a := &Admitter{bus: cfg.Bus, log: cfg.Logger, every: cfg.StoreCheckEvery, limits: NewLimits(cfg.Limits)}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	if a.every <= 0 {
		a.every = storeCheckEvery
	}
	var kv jetstream.KeyValue
	if cfg.Bus != nil {
		kv = cfg.Bus.Bucket(OwnersBucket)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	a.owners = newOwners(ctx, kv)
	cancel()
	return a
}

// Limits are the per-caller counts (the HTTP edge takes each request's rate, and slows
// guessing, with them).
func (a *Admitter) Limits() *Limits { return a.limits }

// Run looks at how full the store is — once before it returns to nothing, then every
// StoreCheckEvery — until ctx ends.
func (a *Admitter) Run(ctx context.Context) error {
	a.checkStore(ctx)
	a.watchStore(ctx, a.every)
	return nil
}

// Look looks at how full the store is now (Run does so periodically).
func (a *Admitter) Look(ctx context.Context) { a.checkStore(ctx) }

// Full says why the record takes nothing new now, or "".
func (a *Admitter) Full() string {
	if why := a.store.full.Load(); why != nil {
		return *why
	}
	return ""
}

// Admit admits ask, or refuses it (a *Refusal; any other error is the bus failing, which the
// door answers as unavailable). Close the ticket when the request is done.
func (a *Admitter) Admit(ctx context.Context, ask Ask) (_ *Ticket, err error) {
	t := &Ticket{}
	defer func() {
		if err != nil {
			t.Close()
			t = nil
		}
	}()
	act := ask.Actor
	if r := act.check(ask.Need); r != nil {
		return nil, r
	}
	if c := act.Caller; c != nil {
		if ask.WaitRate {
			if err := a.limits.Wait(ctx, c); err != nil {
				return nil, err
			}
		}
		release, r := a.limits.hold(c, ask.Hold)
		if r != nil {
			return nil, r
		}
		t.release = release
	}
	switch ask.Store {
	case StoreCount, StoreAccepted:
		count, why := a.store.admit(ask.Size)
		if why != nil && ask.Store == StoreCount {
			count.close()
			return nil, a.storeFull(*why, ask.Size)
		}
		if ask.Store == StoreAccepted {
			count.kept = true
		}
		t.count = count
	case StoreCheck:
		if why := a.store.full.Load(); why != nil {
			return nil, a.storeFull(*why, 0)
		}
	}
	if act.identified() && ask.Session != "" {
		if err := protocol.CheckID("session_id", ask.Session); err != nil {
			return nil, invalid(err)
		}
		switch ask.Mode {
		case Send:
			owner, err := a.claim(ctx, act, ask.Session)
			if err != nil {
				a.log.Warn("claim a session", "session_id", ask.Session, "err", err)
				return nil, unavailable("the session could not be claimed; nothing was accepted: retry")
			}
			if owner != act.Owner() {
				return nil, NoSuchSession(ask.Session)
			}
			t.Owner = owner
		case Claimed:
			t.Owner = act.Owner()
		case Follow:
			known, err := a.known(ctx, act, ask.Session)
			switch {
			case err != nil:
				a.log.Warn("who owns a session", "session_id", ask.Session, "err", err)
				return nil, unavailable("the bus is not reachable; retry")
			case !known:
				return nil, NoSuchSession(ask.Session)
			}
		}
	}
	t.Caller = act.Record()
	return t, nil
}

// storeFull is the refusal of a request the record has no room for.
func (a *Admitter) storeFull(why string, size int) *Refusal {
	return &Refusal{Status: http.StatusServiceUnavailable, Code: protocol.CodeStoreFull, Message: why, RetryAfter: 30 * time.Second,
		Never: a.store.never(size)}
}

// NoSuchSession is the refusal of a session that is not the actor's, in the words used for one
// that does not exist: whether someone else's exists is not the actor's to learn.
func NoSuchSession(session string) *Refusal {
	return &Refusal{Status: http.StatusNotFound, Code: protocol.CodeNotFound, Message: fmt.Sprintf("no session %s of yours is known", session)}
}

func unavailable(msg string) *Refusal {
	return &Refusal{Status: http.StatusServiceUnavailable, Code: protocol.CodeBusUnavailable, Message: msg, RetryAfter: time.Second}
}

// claim claims session for act: its owner, act's when act may send into it. A session the
// record holds requests of without an owner is nobody's — asked first unless act reads every
// session (who may then take it over): a session someone else opened (perhaps under the id one
// was about to use) would hand them what is sent.
func (a *Admitter) claim(ctx context.Context, act Actor, session string) (string, error) {
	var history func(context.Context) (bool, error)
	if !act.ReadsAll() {
		history = func(ctx context.Context) (bool, error) { return a.recorded(ctx, session) }
	}
	return a.owners.claim(ctx, session, act.Owner(), history)
}

// known reports whether act may follow session and it exists: a session of act's own, or, for
// those who read every session, any the record holds requests of.
func (a *Admitter) known(ctx context.Context, act Actor, session string) (bool, error) {
	owner, err := a.owners.of(ctx, session)
	switch {
	case err != nil:
		return false, err
	case owner == act.Owner():
		return true, nil
	case !act.ReadsAll():
		return false, nil
	case owner != "":
		return true, nil
	}
	// Nobody owns it: requests submitted on the bus directly, or from before callers.
	return a.recorded(ctx, session)
}

// MayRead reports whether act may see session: its own, or any when act reads every session.
// A session nobody owns is seen only by those who read every session.
func (a *Admitter) MayRead(ctx context.Context, act Actor, session string) (bool, error) {
	if act.ReadsAll() {
		return true, nil
	}
	owner, err := a.owners.of(ctx, session)
	return err == nil && owner == act.Owner(), err
}

// OwnerOf names who session belongs to ("" for nobody, or before identities).
func (a *Admitter) OwnerOf(ctx context.Context, session string) (string, error) {
	return a.owners.of(ctx, session)
}

// recorded reports whether the record holds requests of session.
func (a *Admitter) recorded(ctx context.Context, session string) (bool, error) {
	if a.bus == nil {
		return false, nil
	}
	_, err := a.bus.StreamOf(session).GetLastMsgForSubject(ctx, a.bus.Layout().FilterRequestsOf(session))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	return err == nil, err
}
