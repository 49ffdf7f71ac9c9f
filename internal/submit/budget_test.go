package submit

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// clock is a settable time for budgets.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

func testBudgets(bytes int64, window time.Duration) (*budgets, *clock) {
	c := &clock{t: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}
	b := newBudgets(Budget{Bytes: bytes, Window: window})
	b.now = c.now
	return b, c
}

func TestBudget(t *testing.T) {
	t.Parallel()
	b, clk := testBudgets(60_000, time.Minute) // drains 1,000 bytes a second
	if _, err := b.take("a", 50_000); err != nil {
		t.Fatal(err)
	}
	// Over: refused, saying how long until it fits, naming the budget.
	_, err := b.take("a", 30_000)
	var be *BudgetError
	if !errors.As(err, &be) || !errors.Is(err, ErrOverBudget) || be.Caller != "a" || be.RetryAfter != 20*time.Second {
		t.Fatalf("over budget: %#v", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "58.6 KiB of requests per 1m0s") || !strings.Contains(msg, "retry in 20s") {
		t.Errorf("message %q", msg)
	}
	// Another caller is not affected.
	if _, err := b.take("b", 60_000); err != nil {
		t.Errorf("another caller: %v", err)
	}
	// The window slides: 20 s later what was used has drained enough.
	clk.advance(19 * time.Second)
	if _, err := b.take("a", 30_000); err == nil {
		t.Error("fit a second early")
	}
	clk.advance(time.Second)
	if _, err := b.take("a", 30_000); err != nil {
		t.Errorf("after the wait: %v", err)
	}
	// A cost given back is not counted.
	refund, err := b.take("c", 60_000)
	if err != nil {
		t.Fatal(err)
	}
	refund()
	if _, err := b.take("c", 60_000); err != nil {
		t.Errorf("after the refund: %v", err)
	}
	// A request costing more than the whole budget takes all of it, once the caller has it.
	if _, err := b.take("d", 1<<30); err != nil {
		t.Errorf("a request beyond the budget never fits: %v", err)
	}
	if _, err := b.take("d", 1); err == nil {
		t.Error("the budget was not all taken")
	}
	// Callers whose use has drained away are forgotten as others come: memory follows the
	// callers of the last window.
	clk.advance(time.Minute)
	for i := range 10 {
		_, _ = b.take(fmt.Sprint("e", i), 1)
	}
	if n := b.tracked(); n != 10 {
		t.Errorf("%d callers kept a minute on", n)
	}
	// No budget: nothing counted.
	var none *budgets = newBudgets(Budget{})
	if none != nil {
		t.Fatal("a zero budget counts")
	}
	if _, err := none.take("a", 1<<40); err != nil {
		t.Error(err)
	}
}

func TestBudgetForgetsTheOldestAtItsBound(t *testing.T) {
	t.Parallel()
	b, clk := testBudgets(1000, time.Hour)
	if b.maxCallers != maxBudgetCallers {
		t.Fatalf("bound %d", b.maxCallers)
	}
	b.maxCallers = 1000
	if _, err := b.take("first", 1000); err != nil {
		t.Fatal(err)
	}
	for i := range b.maxCallers {
		clk.advance(time.Microsecond)
		if _, err := b.take(fmt.Sprint("c", i), 1000); err != nil {
			t.Fatal(err)
		}
	}
	if n := b.tracked(); n != b.maxCallers {
		t.Fatalf("%d callers kept; the bound is %d", n, b.maxCallers)
	}
	// The one charged longest ago was forgotten: it starts again with a whole budget.
	if _, err := b.take("first", 1000); err != nil {
		t.Errorf("the oldest caller was kept: %v", err)
	}
	if _, err := b.take("c1", 1); err == nil {
		t.Error("a recent caller was forgotten")
	}
}

func TestRequestCost(t *testing.T) {
	t.Parallel()
	r := req("r1", "a", "b") // two calls of {}
	small := requestCost(Submission{Request: r})
	if want := int64(costFactor*(len("r1")+len("test")+2*(1+len("echo")+len("{}"))) + 2*costPerCall); small != want {
		t.Errorf("cost %d, want %d", small, want)
	}
	if got := requestCost(Submission{Request: r, Size: 10_000}); got != costFactor*10_000+2*costPerCall {
		t.Errorf("cost by the size received: %d", got)
	}
}

// Through Submit: a caller over its budget is refused before anything is accepted, others go
// on, and what stored nothing (a replay) costs nothing.
func TestSubmitCountsTheCallersBudget(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	cost := requestCost(Submission{Request: req("r1", "a")})
	var clk *clock
	f.s.budget, clk = testBudgets(2*cost, time.Hour)
	alice, bob := &protocol.Caller{ID: "key:alice"}, &protocol.Caller{ID: "key:bob"}
	submit := func(id string, caller *protocol.Caller) (*Outcome, error) {
		return f.s.Submit(ctx, Submission{Request: req(id, "a"), Caller: caller, Wait: 10 * time.Second})
	}
	if _, err := submit("r1", alice); err != nil {
		t.Fatal(err)
	}
	for range 3 { // answered from the record: nothing stored, nothing counted
		if out, err := submit("r1", alice); err != nil || !out.Replayed {
			t.Fatalf("replay: %+v %v", out, err)
		}
	}
	if _, err := submit("r2", alice); err != nil {
		t.Fatalf("second request: %v", err)
	}
	_, err := submit("r3", alice)
	var be *BudgetError
	if !errors.As(err, &be) || be.Caller != "key:alice" || be.RetryAfter <= 0 {
		t.Fatalf("over budget: %v", err)
	}
	if _, err := f.b.Plan(ctx, "r3"); !errors.Is(err, bus.ErrNotFound) {
		t.Errorf("a request over budget was accepted: %v", err)
	}
	if _, err := submit("r4", bob); err != nil {
		t.Errorf("another caller: %v", err)
	}
	// Requests without a caller (the command line) are not counted.
	if _, err := submit("r5", nil); err != nil {
		t.Errorf("no caller: %v", err)
	}
	clk.advance(be.RetryAfter)
	if _, err := submit("r3", alice); err != nil {
		t.Errorf("after the wait: %v", err)
	}
}
