package gateway

import (
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/hermesbus/hermes/internal/auth"
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
}

// DefaultCallerLimits are the limits where none are configured.
var DefaultCallerLimits = CallerLimits{RequestsPerSecond: 200, Burst: 400, Waiting: 256, Streams: 16}

func (l CallerLimits) orDefault() CallerLimits {
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
	return l
}

const (
	// maxTracked bounds the callers and the client addresses the limits keep state for.
	maxTracked = 100_000
	// failureBurst failed credentials from one address are answered as usual; after that one
	// more attempt is taken every failureEvery, others get 429 without being checked.
	failureBurst = 10
	failureEvery = 6 * time.Second
)

// limits keeps the per-caller counts, and the failed credentials per client address that slow
// guessing. It is safe for concurrent use.
type limits struct {
	cfg CallerLimits

	mu       sync.Mutex
	callers  map[string]*callerUse
	failures map[string]*rate.Limiter // by client address
}

type callerUse struct {
	rate    *rate.Limiter // nil: no rate limit
	waiting int
	streams int
	seen    time.Time
}

func newLimits(cfg CallerLimits) *limits {
	return &limits{cfg: cfg.orDefault(), callers: map[string]*callerUse{}, failures: map[string]*rate.Limiter{}}
}

// use returns c's counts, made when first seen. Call with l.mu held.
func (l *limits) use(c *auth.Caller, now time.Time) *callerUse {
	u, ok := l.callers[c.ID]
	if !ok {
		if len(l.callers) >= maxTracked {
			l.forgetIdle(now)
		}
		u = &callerUse{}
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
func (l *limits) forgetIdle(now time.Time) {
	for id, u := range l.callers {
		if u.waiting == 0 && u.streams == 0 && (u.rate == nil || u.rate.TokensAt(now) >= float64(u.rate.Burst())) {
			delete(l.callers, id)
		}
	}
	if len(l.callers) < maxTracked {
		return
	}
	cut := now.Add(-time.Minute)
	for id, u := range l.callers {
		if u.seen.Before(cut) && u.waiting == 0 && u.streams == 0 {
			delete(l.callers, id)
		}
	}
}

// allow takes one request of c's rate, or answers 429 with Retry-After.
func (l *limits) allow(w http.ResponseWriter, c *auth.Caller) bool {
	now := time.Now()
	l.mu.Lock()
	u := l.use(c, now)
	var wait time.Duration
	if u.rate != nil {
		r := u.rate.ReserveN(now, 1)
		if d := r.DelayFrom(now); d > 0 {
			r.CancelAt(now)
			wait = d
		}
	}
	l.mu.Unlock()
	if wait > 0 {
		tooMany(w, wait, fmt.Sprintf("this caller is over its rate of %g requests a second", l.cfg.RequestsPerSecond))
		return false
	}
	return true
}

// hold takes one of c's waiting requests (streams, when stream) for the handler's time, or
// answers 429. Call the returned release when done.
func (l *limits) hold(w http.ResponseWriter, c *auth.Caller, stream bool) (release func(), ok bool) {
	l.mu.Lock()
	u := l.use(c, time.Now())
	n, limit, what := &u.waiting, l.cfg.Waiting, "requests waiting for their response"
	if stream {
		n, limit, what = &u.streams, l.cfg.Streams, "event streams open"
	}
	if limit > 0 && *n >= limit {
		l.mu.Unlock()
		tooMany(w, time.Second, fmt.Sprintf("this caller has %d %s, its limit", limit, what))
		return nil, false
	}
	*n++
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		*n--
		l.mu.Unlock()
	}, true
}

// allowAttempt answers 429 when r's address has failed too many credentials lately: guessing
// is slowed to one attempt per failureEvery.
func (l *limits) allowAttempt(w http.ResponseWriter, r *http.Request) bool {
	now := time.Now()
	l.mu.Lock()
	lim, ok := l.failures[clientAddr(r)]
	var wait time.Duration
	if ok && lim.TokensAt(now) < 1 {
		wait = time.Duration((1 - lim.TokensAt(now)) * float64(failureEvery))
	}
	l.mu.Unlock()
	if wait > 0 {
		tooMany(w, wait, "too many failed credentials from this address; wait")
		return false
	}
	return true
}

// failed counts a credential from r's address that named no caller.
func (l *limits) failed(r *http.Request) {
	now := time.Now()
	addr := clientAddr(r)
	l.mu.Lock()
	defer l.mu.Unlock()
	lim, ok := l.failures[addr]
	if !ok {
		if len(l.failures) >= maxTracked {
			for a, f := range l.failures {
				if f.TokensAt(now) >= failureBurst {
					delete(l.failures, a)
				}
			}
			if len(l.failures) >= maxTracked {
				clear(l.failures)
			}
		}
		lim = rate.NewLimiter(rate.Every(failureEvery), failureBurst)
		l.failures[addr] = lim
	}
	lim.AllowN(now, 1)
}

// clientAddr is the address r came from, without its port.
func clientAddr(r *http.Request) string {
	if h, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return h
	}
	return r.RemoteAddr
}

func tooMany(w http.ResponseWriter, wait time.Duration, msg string) {
	w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(max(wait, time.Second).Seconds()))))
	writeError(w, http.StatusTooManyRequests, protocol.CodeRateLimited, msg, nil)
}
