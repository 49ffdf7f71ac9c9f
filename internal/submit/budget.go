package submit

import (
	"container/list"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// Budget bounds the bytes each caller may have accepted: Bytes in any Window, refilled evenly
// (a bucket of Bytes that empties at Bytes per Window), so a caller may send its whole budget at
// once and then Bytes/Window a second. A budget is kept per Submitter, so per process: with N
// gateways a caller may send N times it. Bytes <= 0 is no budget.
type Budget struct {
	Bytes  int64
	Window time.Duration
}

// DefaultBudget is the budget of a gateway where none is configured: 64 MiB a minute, at most
// 90 GiB a day, so that no one caller fills the record (8 GiB by default) within two hours,
// while a caller sending 1 KiB requests of one call may send about 54 a second, 3,000 at once.
var DefaultBudget = Budget{Bytes: 64 << 20, Window: time.Minute}

// What a request is counted as (requestCost).
const (
	// costFactor: a request is counted this many times its size: the request itself, its
	// calls' dispatches (which carry the arguments again), results that echo them, and the
	// response that holds those results.
	costFactor = 4
	// costPerCall is counted on top for each call: the failed result Hermes may write for it
	// and its copy in the response, at their bound (protocol.MaxErrorTextBytes of text,
	// protocol.MaxHintBytes of hint, ids and envelope), so that a request of many small calls,
	// each refused with a long message, is counted at what it writes.
	costPerCall = 16 << 10
	// maxBudgetCallers bounds the callers a budget keeps count of; beyond it the one charged
	// longest ago is forgotten (and starts again with a whole budget).
	maxBudgetCallers = 100_000
)

// ErrOverBudget is matched by every BudgetError.
var ErrOverBudget = errors.New("submit: the caller is over its budget of stored bytes")

// BudgetError refuses a request of a caller over its budget: nothing was accepted. It matches
// ErrOverBudget.
type BudgetError struct {
	// Caller is the caller's id.
	Caller string
	// Budget is the budget it is over.
	Budget Budget
	// Cost is what the request is counted as.
	Cost int64
	// RetryAfter is how long until the request would fit.
	RetryAfter time.Duration
}

func (e *BudgetError) Error() string {
	return fmt.Sprintf("this caller has sent its budget of %s of requests per %s (counted as %d× their size plus %d KiB per call; this one counts %s); retry in %s",
		byteSize(e.Budget.Bytes), e.Budget.Window, costFactor, costPerCall>>10, byteSize(e.Cost), e.RetryAfter.Round(time.Second))
}

// Is makes every BudgetError match ErrOverBudget.
func (e *BudgetError) Is(target error) bool { return target == ErrOverBudget }

// budgets keeps each caller's use of its budget. It is safe for concurrent use; its memory is
// bounded by maxBudgetCallers.
type budgets struct {
	cfg        Budget
	rate       float64 // bytes per second the use drains at
	now        func() time.Time
	maxCallers int // callers kept count of at most

	mu      sync.Mutex
	callers map[string]*list.Element // of *callerBudget
	order   list.List                // front: charged last
}

type callerBudget struct {
	id   string
	used float64 // bytes counted, as of at
	at   time.Time
}

// newBudgets returns cfg's budgets, or nil for no budget.
func newBudgets(cfg Budget) *budgets {
	if cfg.Bytes <= 0 {
		return nil
	}
	if cfg.Window <= 0 {
		cfg.Window = DefaultBudget.Window
	}
	return &budgets{cfg: cfg, rate: float64(cfg.Bytes) / cfg.Window.Seconds(), now: time.Now, maxCallers: maxBudgetCallers,
		callers: map[string]*list.Element{}}
}

// usedAt is what c has used as of now, drained since it was last charged.
func (b *budgets) usedAt(c *callerBudget, now time.Time) float64 {
	return max(c.used-b.rate*now.Sub(c.at).Seconds(), 0)
}

// take counts cost against caller's budget, or returns a BudgetError saying when it would fit.
// A cost beyond the whole budget is counted as the whole budget: such a request needs all of
// it. refund gives the cost back (for a request that stored nothing).
func (b *budgets) take(caller string, cost int64) (refund func(), err error) {
	if b == nil {
		return func() {}, nil
	}
	counted := float64(min(cost, b.cfg.Bytes))
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.forget(now, 2)
	var c *callerBudget
	if e, ok := b.callers[caller]; ok {
		c = e.Value.(*callerBudget)
		c.used, c.at = b.usedAt(c, now), now
		b.order.MoveToFront(e)
	} else {
		if len(b.callers) >= b.maxCallers {
			b.drop(b.order.Back())
		}
		c = &callerBudget{id: caller, at: now}
		b.callers[caller] = b.order.PushFront(c)
	}
	if over := c.used + counted - float64(b.cfg.Bytes); over > 0 {
		wait := time.Duration(math.Ceil(over / b.rate * float64(time.Second)))
		return nil, &BudgetError{Caller: caller, Budget: b.cfg, Cost: cost, RetryAfter: max(wait, time.Second)}
	}
	c.used += counted
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if e, ok := b.callers[caller]; ok && e.Value.(*callerBudget) == c {
			now := b.now()
			c.used, c.at = max(b.usedAt(c, now)-counted, 0), now
		}
	}, nil
}

// forget drops up to n callers charged longest ago whose use has drained away: forgetting them
// changes nothing. Call with b.mu held.
func (b *budgets) forget(now time.Time, n int) {
	for ; n > 0; n-- {
		e := b.order.Back()
		if e == nil || b.usedAt(e.Value.(*callerBudget), now) > 0 {
			return
		}
		b.drop(e)
	}
}

func (b *budgets) drop(e *list.Element) {
	if e == nil {
		return
	}
	delete(b.callers, e.Value.(*callerBudget).id)
	b.order.Remove(e)
}

// tracked is how many callers b keeps count of.
func (b *budgets) tracked() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.callers)
}

// requestCost is what sub's request is counted as against its caller's budget: costFactor
// times its size (the size as received, or the intent's and arguments' bytes when larger),
// plus costPerCall for each call.
func requestCost(sub Submission) int64 {
	req := sub.Request
	size := len(req.RequestID) + len(req.SessionID) + len(req.Intent)
	for i := range req.ToolCalls {
		c := &req.ToolCalls[i]
		size += len(c.ToolCallID) + len(c.Name) + len(c.Arguments)
	}
	return costFactor*int64(max(size, sub.Size)) + costPerCall*int64(len(req.ToolCalls))
}

// byteSize is n bytes for people: 64 MiB, 1.5 KiB, 300 B.
func byteSize(n int64) string {
	switch {
	case n >= 1<<30:
		return trimUnit(float64(n)/(1<<30), "GiB")
	case n >= 1<<20:
		return trimUnit(float64(n)/(1<<20), "MiB")
	case n >= 1<<10:
		return trimUnit(float64(n)/(1<<10), "KiB")
	}
	return fmt.Sprintf("%d B", n)
}

func trimUnit(v float64, unit string) string {
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f %s", v, unit)
	}
	return fmt.Sprintf("%.1f %s", v, unit)
}
