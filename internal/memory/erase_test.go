package memory

import (
	"context"
	"errors"
	"maps"
	"testing"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
)

// An erasure while the record's streams are being changed would miss the copies still to come:
// it is refused, to be tried again, and done once the change is over.
func TestEraseWaitsForAChangeOfTheRecordsStreams(t *testing.T) {
	ctx := context.Background()
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{Partitions: 6})
	cfg := b.Stream.CachedInfo().Config
	under := cfg
	under.Metadata = maps.Clone(cfg.Metadata)
	if under.Metadata == nil {
		under.Metadata = map[string]string{}
	}
	under.Metadata["hermes.record.restream"] = `{"From":1,"To":3,"Bytes":-1,"Msgs":-1}`
	if _, err := b.JS.UpdateStream(ctx, under); err != nil {
		t.Fatal(err)
	}
	if _, err := EraseRecord(ctx, b.JS, "owner-1", []string{"s1"}); !errors.Is(err, ErrRecordChanging) {
		t.Fatalf("an erasure during a change: %v, want ErrRecordChanging", err)
	}
	if _, err := b.JS.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if out, err := EraseRecord(ctx, b.JS, "owner-1", []string{"s1"}); err != nil || len(out.Sessions) != 1 {
		t.Fatalf("an erasure after the change: %+v, %v", out, err)
	}
}
