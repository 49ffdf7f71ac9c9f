package fastlane

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hermesbus/hermes/pkg/bus"
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
	r := &record{requestID: "r", messages: []bus.Encoded{{Data: make([]byte, 10)}}}
	if !w.Fits(r) {
		t.Fatal("a small record does not fit an empty buffer")
	}
	w.Fill(r)
	big := &record{requestID: "big", messages: []bus.Encoded{{Data: make([]byte, MaxBufferBytes)}}}
	if w.Fits(big) {
		t.Fatal("a record past the buffer's bytes fits")
	}
	if len(w.queue) != 1 {
		t.Fatalf("queue holds %d records, want 1", len(w.queue))
	}
}
