package wake

import "testing"

// A wake reaches every waiter of its key, and no other; wakes while nobody looks are
// coalesced into one; a waiter that stopped is not woken.
func TestWake(t *testing.T) {
	var w Waiters
	a, stopA := w.Add("k")
	b, stopB := w.Add("k")
	other, stopOther := w.Add("other")
	defer stopOther()
	w.Wake("k")
	w.Wake("k") // coalesced, and never blocks
	for _, ch := range []<-chan struct{}{a, b} {
		select {
		case <-ch:
		default:
			t.Fatal("a waiter was not woken")
		}
		select {
		case <-ch:
			t.Fatal("two wakes were not coalesced")
		default:
		}
	}
	select {
	case <-other:
		t.Fatal("another key's waiter was woken")
	default:
	}
	stopA()
	stopB()
	w.Wake("k")
	if len(w.m["k"]) != 0 {
		t.Fatalf("stopped waiters kept: %d", len(w.m["k"]))
	}
}
