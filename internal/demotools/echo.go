package demotools

import (
	"bytes"
	"container/list"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"
)

const (
	maxFailKeys           = 10_000
	maxDelay              = 10 * time.Minute
	defaultBarrierTimeout = 10 * time.Second
	maxBarrierCount       = 1000
)

// echo is the echo tool: it answers with exactly the JSON object it received (for GET, the
// query as an object of strings), after applying its control arguments in this order:
//
//  1. fail_times N: the first N requests with the same Idempotency-Key answer 503 at once;
//  2. delay_ms: wait that long;
//  3. barrier {id, count, timeout_ms}: wait until count requests wait on the barrier id;
//  4. status: answer with that status instead of 200.
//
// All control arguments are checked before any takes effect, so a bad one is a 400 that
// neither counts as a try nor waits.
func (s *server) echo(w http.ResponseWriter, r *http.Request) {
	reply, a, err := echoInput(r)
	if err != nil {
		writeError(w, err)
		return
	}
	ctl, err := echoControls(a)
	if err != nil {
		writeError(w, err)
		return
	}

	if ctl.failTimes > 0 {
		if try := s.fails.hit(r.Header.Get("Idempotency-Key")); try <= ctl.failTimes {
			writeError(w, &toolError{Status: http.StatusServiceUnavailable, Code: "UNAVAILABLE",
				Hint: "retry later", Message: fmt.Sprintf("failing try %d of %d", try, ctl.failTimes)})
			return
		}
	}
	ctx := r.Context()
	if ctl.delay > 0 {
		t := time.NewTimer(ctl.delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			writeError(w, cancelled(ctx))
			return
		}
	}
	if ctl.barrierID != "" {
		if err := s.barriers.wait(ctx, ctl.barrierID, ctl.barrierCount, ctl.barrierTimeout); err != nil {
			writeError(w, err)
			return
		}
	}
	writeRaw(w, ctl.status, reply)
}

// echoInput returns the bytes echo answers with and the arguments they hold.
func echoInput(r *http.Request) ([]byte, args, error) {
	if !bodyMethod(r.Method) {
		q := r.URL.Query()
		obj := make(map[string]any, len(q))
		for k, vs := range q {
			if len(vs) == 1 {
				obj[k] = vs[0]
			} else {
				obj[k] = vs
			}
		}
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		err := enc.Encode(obj)
		return bytes.TrimSuffix(b.Bytes(), []byte("\n")), args{query: q}, err
	}
	body, err := readBody(r)
	if err != nil {
		return nil, args{}, err
	}
	m, err := parseObject(body)
	if err != nil {
		return nil, args{}, err
	}
	if len(m) == 0 {
		body = []byte("{}")
	}
	return body, args{body: m}, nil
}

// echoControl holds echo's control arguments.
type echoControl struct {
	failTimes      int64
	delay          time.Duration
	barrierID      string
	barrierCount   int
	barrierTimeout time.Duration
	status         int
}

func echoControls(a args) (echoControl, error) {
	ctl := echoControl{status: http.StatusOK, barrierTimeout: defaultBarrierTimeout}
	var err error
	if ctl.failTimes, _, err = a.integer("fail_times", 0, 1_000_000); err != nil {
		return ctl, err
	}
	ms, _, err := a.integer("delay_ms", 0, maxDelay.Milliseconds())
	if err != nil {
		return ctl, err
	}
	ctl.delay = time.Duration(ms) * time.Millisecond
	status, ok, err := a.integer("status", 200, 599)
	if err != nil {
		return ctl, err
	}
	if ok {
		ctl.status = int(status)
	}
	b, ok, err := a.object("barrier")
	if err != nil || !ok {
		return ctl, err
	}
	if ctl.barrierID, ok, err = b.str("id"); err != nil {
		return ctl, err
	} else if !ok {
		return ctl, missingArg("barrier.id", "the barrier's name; requests with the same id wait for each other")
	}
	count, ok, err := b.integer("count", 1, maxBarrierCount)
	if err != nil {
		return ctl, err
	} else if !ok {
		return ctl, missingArg("barrier.count", fmt.Sprintf("how many requests the barrier waits for, 1 to %d", maxBarrierCount))
	}
	ctl.barrierCount = int(count)
	timeout, ok, err := b.integer("timeout_ms", 1, maxDelay.Milliseconds())
	if err != nil {
		return ctl, err
	}
	if ok {
		ctl.barrierTimeout = time.Duration(timeout) * time.Millisecond
	}
	return ctl, nil
}

// cancelled is the answer to a request whose context ended while it waited; its client is
// usually gone and never reads it.
func cancelled(ctx context.Context) *toolError {
	return &toolError{Status: http.StatusServiceUnavailable, Code: "CANCELLED",
		Hint: "retry the call", Message: "request cancelled while waiting: " + context.Cause(ctx).Error()}
}

// failCounter counts requests per Idempotency-Key for echo's fail_times. It remembers at most
// max keys, forgetting the least recently used first. It is safe for concurrent use.
type failCounter struct {
	mu    sync.Mutex
	max   int
	keys  map[string]*list.Element // element value: *failCount
	order *list.List               // most recently used at the front
}

type failCount struct {
	key string
	n   int64
}

func newFailCounter(max int) *failCounter {
	return &failCounter{max: max, keys: make(map[string]*list.Element), order: list.New()}
}

// hit counts one more request with key and returns how many there have been, this one included.
func (c *failCounter) hit(key string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.keys[key]; ok {
		c.order.MoveToFront(e)
		fc := e.Value.(*failCount)
		fc.n++
		return fc.n
	}
	c.keys[key] = c.order.PushFront(&failCount{key: key, n: 1})
	for c.order.Len() > c.max {
		oldest := c.order.Back()
		c.order.Remove(oldest)
		delete(c.keys, oldest.Value.(*failCount).key)
	}
	return 1
}

// len returns how many keys are remembered.
func (c *failCounter) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.keys)
}

// barrierSet holds echo's barriers: requests that wait until a given number of them with the
// same id are in flight together. It is safe for concurrent use.
type barrierSet struct {
	mu     sync.Mutex
	groups map[string]*barrierGroup
}

// barrierGroup is one filling of a barrier; once released it leaves the set, so the id can
// start a new group.
type barrierGroup struct {
	count    int
	waiting  int
	released chan struct{} // closed when waiting reaches count
}

func newBarrierSet() *barrierSet {
	return &barrierSet{groups: make(map[string]*barrierGroup)}
}

// errBarrierTimeout is the answer of a barrier that did not fill in time.
func errBarrierTimeout(id string, count, waiting int, timeout time.Duration) *toolError {
	return &toolError{Status: http.StatusGatewayTimeout, Code: "BARRIER_TIMEOUT",
		Hint:    fmt.Sprintf("send %d requests with barrier id %q concurrently, or raise barrier.timeout_ms", count, id),
		Message: fmt.Sprintf("barrier %q had %d of %d requests after %s", id, waiting, count, timeout)}
}

// wait joins the barrier id and returns nil once count requests wait on it together. It
// returns a BARRIER_TIMEOUT error after timeout, a CANCELLED error when ctx ends first (in both
// cases the request leaves the barrier), and a 400 when the barrier is filling for another
// count.
func (s *barrierSet) wait(ctx context.Context, id string, count int, timeout time.Duration) error {
	s.mu.Lock()
	g := s.groups[id]
	if g == nil {
		g = &barrierGroup{count: count, released: make(chan struct{})}
		s.groups[id] = g
	}
	if g.count != count {
		s.mu.Unlock()
		return badArg("barrier.count", fmt.Sprintf("%d, the count the requests already waiting on %q gave", g.count, id),
			fmt.Sprintf("barrier %q is filling for %d requests, not %d", id, g.count, count))
	}
	g.waiting++
	if g.waiting == g.count {
		close(g.released)
		delete(s.groups, id)
	}
	s.mu.Unlock()

	t := time.NewTimer(timeout)
	defer t.Stop()
	var err error
	select {
	case <-g.released:
		return nil
	case <-t.C:
	case <-ctx.Done():
		err = cancelled(ctx)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-g.released: // filled while we were giving up: go with the group
		return nil
	default:
	}
	waiting := g.waiting
	g.waiting--
	if g.waiting == 0 && s.groups[id] == g {
		delete(s.groups, id)
	}
	if err == nil {
		err = errBarrierTimeout(id, count, waiting, timeout)
	}
	return err
}

// waiting returns how many requests wait on the barrier id now.
func (s *barrierSet) waiting(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g := s.groups[id]; g != nil {
		return g.waiting
	}
	return 0
}
