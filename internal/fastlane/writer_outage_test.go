package fastlane

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// TestBufferBoundsItsBytes: the records waiting hold at most MaxBufferBytes, however many
// requests are answered at once.
func TestBufferBoundsItsBytes(t *testing.T) {
	w := NewWriter(nil, nil, DefaultBuffer, nil)
	for range DefaultInFlight {
		if !w.Reserve() {
			t.Fatal("refused")
		}
	}
	filled := 0
	for range DefaultInFlight {
		r := &record{messages: []bus.Encoded{{Data: make([]byte, 4<<20)}, {Data: make([]byte, 4<<20)}}}
		if w.Fits(r) {
			w.Fill(r)
			filled++
		}
	}
	if w.bytes.Load() > MaxBufferBytes || filled != MaxBufferBytes/(8<<20) {
		t.Errorf("the buffer holds %d MiB in %d records; its bound is %d MiB", w.bytes.Load()>>20, filled, MaxBufferBytes>>20)
	}
}

// TestWriterWaitsOutAJetStreamOutage: a record is written once JetStream is back, however long
// it was away while the connection stayed up.
func TestWriterWaitsOutAJetStreamOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out a 12 s JetStream outage")
	}
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{})
	pub := bus.NewPublisher(b.JS, protocol.Sender{Role: protocol.RoleRouter, Instance: "r"})
	w := NewWriter(b, pub, 4, nil)
	m, _ := protocol.NewMessage(protocol.TypeResponse, &protocol.Response{RequestID: "r1", SessionID: "s1"})
	m.MsgID, m.RequestID, m.SessionID = "response:r1", "r1", "s1"
	data, _ := protocol.Marshal(m)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = w.Run(ctx) }()
	jsCfg := srv.JetStreamConfig()
	jsCfg.StoreDir = filepath.Dir(jsCfg.StoreDir) // enabling adds the "jetstream" it ends in
	if err := srv.DisableJetStream(); err != nil {
		t.Fatal(err)
	}
	if !w.Reserve() {
		t.Fatal("reserve")
	}
	w.Fill(&record{requestID: "r1", messages: []bus.Encoded{{Subject: protocol.SubjectResponse("r1", "s1"), Msg: m, Data: data, Once: true}}})
	// The outage: longer than the writer takes to give up on a record the stream refuses
	// (pacing the fault, not synchronisation).
	time.Sleep(12 * time.Second)
	if _, _, lost := w.Stats(); lost != 0 {
		t.Fatalf("given up during a 12 s JetStream outage")
	}
	if err := srv.EnableJetStream(jsCfg); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		written, retries, lost := w.Stats()
		if written == 1 && lost == 0 {
			t.Logf("written once JetStream was back, after %d retries", retries)
			return
		}
		if lost != 0 || time.Now().After(deadline) {
			t.Fatalf("after the outage: written %d, lost %d", written, lost)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
