package fastlane

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestWriterReservesWithinItsBuffer: a request is answered only in a place of the buffer; a full
// buffer reserves none until one is given back.
func TestWriterReservesWithinItsBuffer(t *testing.T) {
	w := NewWriter(nil, nil, 2, nil)
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "waiting"})
	w.waiting = g
	for i := range 2 {
		if !w.Reserve() {
			t.Fatalf("an empty buffer of 2 refused reservation %d", i+1)
		}
	}
	if w.Reserve() {
		t.Fatal("a full buffer reserved a third place")
	}
	if w.Waiting() != 2 || testutil.ToFloat64(g) != 2 {
		t.Fatalf("waiting %d, gauge %v; want 2", w.Waiting(), testutil.ToFloat64(g))
	}
	w.Release()
	if !w.Reserve() {
		t.Fatal("a place given back was not reserved again")
	}
	w.Fill(&record{requestID: "r"})
	if len(w.queue) != 1 {
		t.Fatalf("queue holds %d records, want 1", len(w.queue))
	}
}
