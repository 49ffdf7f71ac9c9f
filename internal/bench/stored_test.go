package bench_test

import (
	"context"
	"testing"

	"github.com/hermesbus/hermes/internal/bench"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Each "request" stores one message on the record and puts two keys again: the first request
// adds one of them, every later one replaces what is there and stores nothing new.
func TestStoredPerRequestCountsEveryStreamAndBucket(t *testing.T) {
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{})
	ctx := context.Background()
	pub := bus.NewPublisher(b.JS, protocol.Sender{Role: "bench", Instance: "t"})
	do := func(ctx context.Context, _, seq int) error {
		id := "r" + string(rune('a'+seq))
		m, err := protocol.NewMessage(protocol.TypeRequest, &protocol.Request{RequestID: id})
		if err != nil {
			return err
		}
		m.MsgID, m.RequestID, m.SessionID = protocol.MsgIDRequest(id), id, "s"
		if _, err := pub.Publish(ctx, protocol.SubjectEvent(protocol.EventCancel, "s"), m); err != nil {
			return err
		}
		if _, err := b.Sessions.Put(ctx, protocol.KeySerialTail("s"), []byte(id)); err != nil {
			return err
		}
		_, err = b.Tools.Put(ctx, "http.echo", []byte(id))
		return err
	}
	if _, err := b.Tools.Put(ctx, "http.echo", []byte("x")); err != nil {
		t.Fatal(err)
	}
	got, err := bench.StoredPerRequest(ctx, b.JS, 10, do)
	if err != nil {
		t.Fatal(err)
	}
	// The tail key is new with the first request only: 10 record messages + 1 key over 10.
	if want := 1.1; got != want {
		t.Fatalf("stored per request = %v, want %v", got, want)
	}
}
