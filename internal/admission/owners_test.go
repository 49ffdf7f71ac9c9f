package admission

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus/bustest"
)

// An owner record is read from a bucket others may write: whatever it holds, decoding ends
// with an owner or an error, never a panic, and never an empty owner.
func FuzzDecodeOwner(f *testing.F) {
	f.Add([]byte(`{"owner":"key:abc#alice","since":"2026-12-01T00:00:00Z"}`))
	f.Add([]byte(`{"owner":""}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"owner":"x","since":"yesterday"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		rec, err := decodeOwner(data)
		if err == nil && (rec == nil || rec.Owner == "") {
			t.Fatalf("%q decoded to %+v", data, rec)
		}
	})
}

// A session the record holds requests of without an owner is nobody's to claim: however many
// claims race, and whether the claimant gives up halfway, no owner is written or remembered.
// A new session goes to its first claimant, once.
func TestOwnersClaim(t *testing.T) {
	js, err := jetstream.New(bustest.NewServer(t).Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "owners-test"})
	if err != nil {
		t.Fatal(err)
	}
	o := newOwners(t.Context(), kv)
	recorded := func(context.Context) (bool, error) { return true, nil }
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() {
			if got, err := o.claim(t.Context(), "old", fmt.Sprintf("key:%d", i), recorded); err != nil || got != unownedHistory {
				t.Errorf("claim %d: %q %v", i, got, err)
			}
		})
	}
	wg.Wait()
	ctx, cancel := context.WithCancel(t.Context())
	if _, err := o.claim(ctx, "old", "key:x", func(context.Context) (bool, error) { cancel(); return false, ctx.Err() }); err == nil {
		t.Error("a claim whose history check failed went through")
	}
	if got, err := o.of(t.Context(), "old"); err != nil || got != "" {
		t.Errorf("owner of the old session: %q %v", got, err)
	}
	if _, err := kv.Get(t.Context(), "old"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("an owner record was written: %v", err)
	}
	fresh := func(context.Context) (bool, error) { return false, nil }
	winners := make(chan string, 10)
	for i := range 10 {
		wg.Go(func() {
			me := fmt.Sprintf("key:%d", i)
			if got, err := o.claim(t.Context(), "new", me, fresh); err != nil {
				t.Error(err)
			} else if got == me {
				winners <- me
			}
		})
	}
	wg.Wait()
	close(winners)
	if n := len(winners); n != 1 {
		t.Errorf("%d claimants own the new session", n)
	}
}
