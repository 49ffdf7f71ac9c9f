package bus_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
)

// Buckets of an application on the bus, as Hermes' gateway keeps its own: one the gateway
// watches (credentials: written by admin only), one it writes (owners), one it writes and
// purges (sign-ins).
const (
	appKeys    = "app-keys"
	appOwners  = "app-owners"
	appSignins = "app-signins"
)

var appBuckets = []bus.Bucket{
	{Name: appKeys, MaxBytes: 1 << 20, Strict: true, Watchers: []bus.Role{bus.RoleGateway}},
	{Name: appOwners, MaxBytes: 1 << 20, AsLongAsPlans: true, Strict: true, Writers: []bus.Role{bus.RoleGateway}},
	{Name: appSignins, MaxBytes: 1 << 20, TTL: time.Hour, Strict: true, Rollup: true, Writers: []bus.Role{bus.RoleGateway}},
}

// lockedWithApp is a locked server whose users' permissions include appBuckets.
func lockedWithApp(t *testing.T) *bustest.Server {
	return bustest.NewLocked(t, bustest.Locked{Buckets: appBuckets})
}

// An application's buckets are provisioned with Hermes' as each says — TTL, strict reads,
// roll-ups — and opened by a process that may not create them; the roles they name may watch
// and write them, and nobody else may.
func TestApplicationBuckets(t *testing.T) {
	t.Parallel()
	s := lockedWithApp(t)
	admin := s.Provision(t, bus.Config{MaxAge: 2 * time.Hour, StateTTL: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, b := range appBuckets {
		if admin.Bucket(b.Name) == nil {
			t.Fatalf("bucket %s not opened", b.Name)
		}
		st, err := admin.JS.Stream(ctx, bus.KVStream(b.Name))
		if err != nil {
			t.Fatal(err)
		}
		c := st.CachedInfo().Config
		wantAge := b.TTL
		if b.AsLongAsPlans {
			wantAge = 3 * time.Hour // the record's two, and an hour more
		}
		if c.MaxAge != wantAge || c.MaxBytes != b.MaxBytes || c.AllowRollup != b.Rollup {
			t.Errorf("bucket %s: max age %s, max bytes %d, roll-ups %v", b.Name, c.MaxAge, c.MaxBytes, c.AllowRollup)
		}
	}
	if admin.Bucket("nope") != nil {
		t.Error("a bucket nobody configured")
	}
	// A gateway opens them without the right to create anything, and writes what it may.
	gw, err := jetstream.New(s.ConnectAs(t, bus.RoleGateway))
	if err != nil {
		t.Fatal(err)
	}
	b, err := bus.Provision(ctx, gw, bus.Config{NoProvision: true, Buckets: appBuckets})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Bucket(appOwners).Create(ctx, "s1", []byte("alice")); err != nil {
		t.Fatalf("the gateway owns a session: %v", err)
	}
	if _, err := b.Bucket(appSignins).Put(ctx, "x", []byte("signed in")); err != nil {
		t.Fatalf("the gateway signs a browser in: %v", err)
	}
	if err := b.Bucket(appSignins).Purge(ctx, "x"); err != nil {
		t.Fatalf("the gateway signs a browser out: %v", err)
	}
	if _, err := admin.Bucket(appKeys).Put(ctx, "k1", []byte("a key")); err != nil {
		t.Fatal(err)
	}
	if e, err := b.Bucket(appKeys).Get(ctx, "k1"); err != nil || string(e.Value()) != "a key" {
		t.Fatalf("the gateway reads a key: %v %v", e, err)
	}
	w, err := b.Bucket(appKeys).WatchAll(ctx)
	if err != nil {
		t.Fatalf("the gateway watches the keys: %v", err)
	}
	_ = w.Stop()
	short, cancelShort := context.WithTimeout(ctx, time.Second)
	defer cancelShort()
	if _, err := b.Bucket(appKeys).Put(short, "k2", []byte("forged")); err == nil {
		t.Error("the gateway wrote an API key")
	}
	// Badly described buckets are refused, naming the problem.
	for _, tc := range []struct {
		buckets []bus.Bucket
		want    string
	}{
		{[]bus.Bucket{{Name: "a.b", MaxBytes: 1}}, "bucket name"},
		{[]bus.Bucket{{Name: "*", MaxBytes: 1, Writers: []bus.Role{bus.RoleGateway}}}, "bucket name"},
		{[]bus.Bucket{{Name: "hermes-intake", MaxBytes: 1}}, "one of Hermes' own"},
		{[]bus.Bucket{{Name: bus.BucketCalls, MaxBytes: 1}}, "one of Hermes' own"},
		{[]bus.Bucket{{Name: "a"}}, "MaxBytes"},
		{[]bus.Bucket{{Name: "a", MaxBytes: 1}, {Name: "a", MaxBytes: 1}}, "twice"},
		{[]bus.Bucket{{Name: "a", MaxBytes: 1, Writers: []bus.Role{"boss"}}}, "boss"},
	} {
		if _, err := bus.Provision(ctx, admin.JS, bus.Config{Buckets: tc.buckets}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error naming %q", tc.buckets, err, tc.want)
		}
		if _, err := bus.AuthConf(nil, tc.buckets); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("AuthConf %+v: %v, want an error naming %q", tc.buckets, err, tc.want)
		}
		if _, err := bus.AccessOf(bus.RoleGateway, "gateway", tc.buckets...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("AccessOf %+v: %v, want an error naming %q", tc.buckets, err, tc.want)
		}
	}
}
