package retry

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestDelay(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		name string
		p    Policy
		want []time.Duration // delays after failures 1, 2, 3, …
	}{
		{"exponential capped", Policy{Initial: 100 * ms, Factor: 2, Max: 500 * ms}, []time.Duration{100 * ms, 200 * ms, 400 * ms, 500 * ms, 500 * ms}},
		{"fixed", Fixed(250 * ms), []time.Duration{250 * ms, 250 * ms, 250 * ms}},
		{"factor below 1 is fixed", Policy{Initial: 10 * ms, Factor: 0.5}, []time.Duration{10 * ms, 10 * ms}},
		{"no cap", Policy{Initial: ms, Factor: 10}, []time.Duration{ms, 10 * ms, 100 * ms, time.Second}},
		{"zero", Policy{}, []time.Duration{0, 0}},
		{"cap below the first delay caps at it", Policy{Initial: time.Second, Factor: 2, Max: 500 * ms}, []time.Duration{time.Second, time.Second, time.Second}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for i, want := range c.want {
				if got := c.p.Delay(i + 1); got != want {
					t.Errorf("Delay(%d) = %v, want %v", i+1, got, want)
				}
			}
			if got := c.p.Delay(0); got != c.p.Delay(1) {
				t.Errorf("Delay(0) = %v, want Delay(1)", got)
			}
		})
	}
	// A huge try number neither overflows nor loops for long.
	if d := (Policy{Initial: time.Second, Factor: 1000, Max: time.Hour}).Delay(1 << 30); d != time.Hour {
		t.Errorf("Delay(2^30) = %v", d)
	}
}

func TestJitterStaysWithinBounds(t *testing.T) {
	p := Policy{Initial: 10 * time.Millisecond, Factor: 1, Jitter: 5 * time.Millisecond}
	seen := map[time.Duration]bool{}
	for range 200 {
		d := p.Delay(1)
		if d < 10*time.Millisecond || d >= 15*time.Millisecond {
			t.Fatalf("delay %v outside [10ms, 15ms)", d)
		}
		seen[d] = true
	}
	if len(seen) < 2 {
		t.Error("jitter never varied")
	}
}

func TestDo(t *testing.T) {
	ctx := context.Background()
	fail := errors.New("fail")
	n := 0
	var waits []time.Duration
	err := Do(ctx, Policy{Initial: time.Millisecond, Factor: 2}, time.Time{}, func() error {
		if n++; n < 4 {
			return fail
		}
		return nil
	}, func(_ error, w time.Duration) { waits = append(waits, w) })
	if err != nil || n != 4 || len(waits) != 3 || waits[2] != 4*time.Millisecond {
		t.Fatalf("err %v, tries %d, waits %v", err, n, waits)
	}

	n = 0
	permanent := errors.New("permanent")
	if err := Do(ctx, Fixed(time.Millisecond), time.Time{}, func() error { n++; return Stop(permanent) }, nil); err != permanent || n != 1 {
		t.Fatalf("Stop: err %v after %d tries", err, n)
	}

	n = 0
	start := time.Now()
	err = Do(ctx, Fixed(20*time.Millisecond), time.Now().Add(50*time.Millisecond), func() error { n++; return fail }, nil)
	if err != fail || n < 2 || n > 4 || time.Since(start) > time.Second {
		t.Fatalf("deadline: err %v after %d tries in %v", err, n, time.Since(start))
	}

	cctx, cancel := context.WithCancel(ctx)
	n = 0
	err = Do(cctx, Fixed(time.Hour), time.Time{}, func() error { n++; cancel(); return fail }, nil)
	if err != fail || n != 1 {
		t.Fatalf("cancelled: err %v after %d tries", err, n)
	}
}

func TestSleep(t *testing.T) {
	if !Sleep(context.Background(), time.Millisecond) || !Sleep(context.Background(), 0) {
		t.Error("Sleep did not wait")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) || Sleep(ctx, 0) {
		t.Error("Sleep ignored a done context")
	}
}

func TestDelayOfHugeTryNumbers(t *testing.T) {
	if d := (Policy{Initial: time.Millisecond, Factor: 1}).Delay(1 << 40); d != time.Millisecond {
		t.Errorf("factor 1: %v", d)
	}
	// Growth stops at maxSteps: a slowly growing delay stays finite and positive.
	if d := (Policy{Initial: time.Millisecond, Factor: 1.0000001}).Delay(1 << 40); d < time.Millisecond || d > 2*time.Millisecond {
		t.Errorf("slow growth: %v", d)
	}
}
