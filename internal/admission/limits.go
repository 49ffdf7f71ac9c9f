package admission

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/submit"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// CallerLimits bound what one caller may hold of a gateway at once, so that no caller can take
// what others need. Zero fields take DefaultCallerLimits; a negative field means no limit.
type CallerLimits struct {
	// RequestsPerSecond is the sustained rate of requests a caller may make, Burst how many
	// it may make at once above it.
	RequestsPerSecond float64
	Burst             int
	// Waiting bounds the POST /v1/route requests a caller has waiting for their response.
	Waiting int
	// Streams bounds a caller's open session event streams.
	Streams int
	// Budget bounds the bytes of requests a caller may have accepted by this gateway in any
	// window (submit.Budget): its requests over it get 429. Zero Bytes or Window take the
	// default's; negative Bytes is no budget.
	Budget submit.Budget
}

// DefaultCallerLimits are the limits where none are configured.
var DefaultCallerLimits = CallerLimits{RequestsPerSecond: 200, Burst: 400, Waiting: 256, Streams: 16, Budget: submit.DefaultBudget}

// OrDefault is l with DefaultCallerLimits for its zero fields.
func (l CallerLimits) OrDefault() CallerLimits {
	d := DefaultCallerLimits
	if l.RequestsPerSecond == 0 {
		l.RequestsPerSecond = d.RequestsPerSecond
	}
	if l.Burst == 0 {
		l.Burst = d.Burst
	}
	if l.Waiting == 0 {
		l.Waiting = d.Waiting
	}
	if l.Streams == 0 {
		l.Streams = d.Streams
	}
	if l.Budget.Bytes == 0 {
		l.Budget.Bytes = d.Budget.Bytes
	}
	if l.Budget.Window <= 0 {
		l.Budget.Window = d.Budget.Window
	}
	return l
}

// SubmitBudget is the submit.Budget of l (defaults applied): none when its Bytes are negative.
func (l CallerLimits) SubmitBudget() submit.Budget {
	if l.Budget.Bytes < 0 {
		return submit.Budget{}
	}
	return l.Budget
}

const (
	// maxTracked bounds the callers and the client addresses the limits keep state for.
	maxTracked = 100_000
	// FailureBurst failed credentials from one address are answered as usual; after that one
	// more attempt is taken every failureEvery, others get 429 without being checked.
	FailureBurst = 10
	failureEvery = 6 * time.Second
	// signinBurst sign-ins of one caller are made at once, then one every signinEvery: what a
	// caller can keep of the sign-ins bucket stays small (12 h / 2 min = 360 at most).
	signinBurst = 10
	signinEvery = 2 * time.Minute
)

// Limits keeps the per-caller counts, and the failed credentials per client address that slow
// guessing. It is safe for concurrent use.
type Limits struct {
	cfg CallerLimits

	mu       sync.Mutex
	callers  map[string]*callerUse
	failures map[string]*rate.Limiter // by client address
}

type callerUse struct {
	rate     *rate.Limiter // nil: no rate limit
	signins  *rate.Limiter
	waiting  int
	streams  int
	listings int
	seen     time.Time
}

// NewLimits returns the counts for cfg (defaults applied).
func NewLimits(cfg CallerLimits) *Limits {
	return &Limits{cfg: cfg.OrDefault(), callers: map[string]*callerUse{}, failures: map[string]*rate.Limiter{}}
}

// use returns c's counts, made when first seen. Call with l.mu held.
func (l *Limits) use(c *auth.Caller, now time.Time) *callerUse {
	u, ok := l.callers[c.ID]
	if !ok {
		if len(l.callers) >= maxTracked {
			l.forgetIdle(now)
		}
		u = &callerUse{signins: rate.NewLimiter(rate.Every(signinEvery), signinBurst)}
		if l.cfg.RequestsPerSecond > 0 {
			u.rate = rate.NewLimiter(rate.Limit(l.cfg.RequestsPerSecond), max(l.cfg.Burst, 1))
		}
		l.callers[c.ID] = u
	}
	u.seen = now
	return u
}

// forgetIdle drops the callers holding nothing whose rate allowance is full again (forgetting
// them changes nothing); if none is idle, the oldest half.
func (l *Limits) forgetIdle(now time.Time) {
	for id, u := range l.callers {
		if u.waiting == 0 && u.streams == 0 && u.listings == 0 && (u.rate == nil || u.rate.TokensAt(now) >= float64(u.rate.Burst())) &&
			u.signins.TokensAt(now) >= signinBurst {
			delete(l.callers, id)
		}
	}
	if len(l.callers) < maxTracked {
		return
	}
	cut := now.Add(-time.Minute)
	for id, u := range l.callers {
		if u.seen.Before(cut) && u.waiting == 0 && u.streams == 0 && u.listings == 0 {
			delete(l.callers, id)
		}
	}
}

// TakeRate takes one request of c's rate: nil, or a refusal (429) saying how long until one
// is there.
func (l *Limits) TakeRate(c *auth.Caller) *Refusal {
	if wait := l.takeRate(c); wait > 0 {
		return tooMany(wait, fmt.Sprintf("this caller is over its rate of %g requests a second", l.cfg.RequestsPerSecond))
	}
	return nil
}

// takeRate takes one request of c's rate, or says how long until one is there.
func (l *Limits) takeRate(c *auth.Caller) time.Duration {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	u := l.use(c, now)
	if u.rate == nil {
		return 0
	}
	_, wait := take(u.rate, now)
	return wait
}

// wait takes one request of c's rate, waiting for it when c is over its rate (until ctx ends):
// for the requests a caller's one request makes (each turn of a chat run).
func (l *Limits) Wait(ctx context.Context, c *auth.Caller) error {
	for {
		wait := l.takeRate(c)
		if wait <= 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// TakeSignin takes one of c's sign-ins, or refuses (429).
func (l *Limits) TakeSignin(c *auth.Caller) *Refusal {
	now := time.Now()
	l.mu.Lock()
	_, wait := take(l.use(c, now).signins, now)
	l.mu.Unlock()
	if wait > 0 {
		return tooMany(wait, "this caller signed in too often lately; wait")
	}
	return nil
}

// Hold is what a request holds of its caller's allowance while it is served.
type Hold int

const (
	HoldNone    Hold = iota // nothing: a request answered at once
	HoldWaiting             // a request waiting for its response (a route, a chat run, an MCP call)
	HoldStream              // an open event stream
	HoldListing             // a session listing running (one per caller: they scan the record)
)

// hold takes one of c's k for the request's time, or refuses (429). Call the returned release
// when done.
func (l *Limits) hold(c *auth.Caller, k Hold) (release func(), refused *Refusal) {
	l.mu.Lock()
	u := l.use(c, time.Now())
	var n *int
	var limit int
	var what string
	switch k {
	case HoldNone:
		l.mu.Unlock()
		return func() {}, nil
	case HoldWaiting:
		n, limit, what = &u.waiting, l.cfg.Waiting, "requests waiting for their response"
	case HoldStream:
		n, limit, what = &u.streams, l.cfg.Streams, "event streams open"
	default:
		n, limit, what = &u.listings, 1, "session listings running"
	}
	if limit > 0 && *n >= limit {
		l.mu.Unlock()
		return nil, tooMany(time.Second, fmt.Sprintf("this caller has %d %s, its limit", limit, what))
	}
	*n++
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		*n--
		l.mu.Unlock()
	}, nil
}

// Attempt takes one of the unknown credentials addr (a client's address) may have checked, or
// refuses (429) when it has failed too many lately: guessing is slowed to one attempt per
// failureEvery, however many are sent at once. Call succeeded when the credential named a
// caller, to give the attempt back.
func (l *Limits) Attempt(addr string) (succeeded func(), refused *Refusal) {
	now := time.Now()
	l.mu.Lock()
	lim, ok := l.failures[addr]
	if !ok {
		if len(l.failures) >= maxTracked {
			l.forgetFailures(now)
		}
		lim = rate.NewLimiter(rate.Every(failureEvery), FailureBurst)
		l.failures[addr] = lim
	}
	res, wait := take(lim, now)
	l.mu.Unlock()
	if wait > 0 {
		return nil, tooMany(wait, "too many failed credentials from this address; wait")
	}
	return func() {
		l.mu.Lock()
		res.CancelAt(now) // as of when it was taken, so that it is given back whole
		l.mu.Unlock()
	}, nil
}

// forgetFailures drops the addresses whose allowance is full again (forgetting them changes
// nothing), then, while more than 80 % of the bound are left, any: memory stays bounded, at the
// price of a guesser forgotten early. Call with l.mu held.
func (l *Limits) forgetFailures(now time.Time) {
	for a, f := range l.failures {
		if f.TokensAt(now) >= FailureBurst {
			delete(l.failures, a)
		}
	}
	for a := range l.failures {
		if len(l.failures) <= maxTracked*8/10 {
			return
		}
		delete(l.failures, a)
	}
}

// take takes one token of lim at now; when there is none, it takes nothing and says how long
// until there is.
func take(lim *rate.Limiter, now time.Time) (*rate.Reservation, time.Duration) {
	res := lim.ReserveN(now, 1)
	wait := res.DelayFrom(now)
	if wait > 0 {
		res.CancelAt(now)
	}
	return res, wait
}

// tooMany is the refusal of a caller over one of its limits, until wait has passed.
func tooMany(wait time.Duration, msg string) *Refusal {
	return &Refusal{Status: http.StatusTooManyRequests, Code: protocol.CodeRateLimited, Message: msg, RetryAfter: max(wait, time.Second)}
}
