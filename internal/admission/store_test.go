package admission

import "testing"

// What the gauge counts: an accepted request until its writes are seen, not one refused further
// on or replayed (it writes nothing new); a look that sees writes stops counting the oldest.
func TestTheStoreGaugeCountsWhatIsWritten(t *testing.T) {
	var g storeGauge
	g.limit.Store(100 << 20)
	g.seen(10 << 20)
	for range 40 { // a caller's resends, each refused further on or replayed: never full
		adm, why := g.admit(1 << 20)
		if why != nil {
			t.Fatalf("refused: %s", *why)
		}
		adm.close()
	}
	if p := g.pending.Load(); p != 0 {
		t.Fatalf("pending %d after requests that wrote nothing", p)
	}
	_, why := g.admit(10 << 20) // 40 MB expected
	if why != nil || g.pending.Load() != 40<<20 {
		t.Fatalf("an accepted request: %v, pending %d", why, g.pending.Load())
	}
	if _, why := g.admit(11 << 20); why == nil { // 10 + 40 + 44 > 90 % of 100
		t.Fatal("a request past the margin was accepted")
	}
	g.seen(10<<20 + 30<<20) // 30 MB of its writes seen
	if p := g.pending.Load(); p != 10<<20 {
		t.Fatalf("pending %d after 30 MB seen; want 10 MB", p)
	}
}
