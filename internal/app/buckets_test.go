package app

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
)

// The buckets of callers' credentials and sessions' owners: provisioned with the bus, as
// strict as a revocation needs, and touched only by whom they are for — gateways watch the API
// keys and write owners and sign-ins; admin (hermes keys) makes keys; routers, workers and
// external clients never write any of them, workers and clients never read them, and only
// sign-ins (purged at sign-out) take roll-ups.
func TestHermesOwnBuckets(t *testing.T) {
	t.Parallel()
	s := bustest.NewLocked(t, bustest.Locked{Buckets: Buckets(bus.Config{})})
	admin := s.Provision(t, bus.Config{})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for _, name := range []string{auth.KeysBucket, auth.SigninsBucket, admission.OwnersBucket} {
		st, err := admin.JS.Stream(ctx, bus.KVStream(name))
		if err != nil {
			t.Fatal(err)
		}
		if c := st.CachedInfo().Config; c.AllowRollup != (name == auth.SigninsBucket) {
			t.Errorf("bucket %s takes roll-ups: %v", name, c.AllowRollup)
		}
	}
	gw, err := jetstream.New(s.ConnectAs(t, bus.RoleGateway))
	if err != nil {
		t.Fatal(err)
	}
	b, err := bus.Provision(ctx, gw, withBuckets(bus.Config{NoProvision: true}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Bucket(admission.OwnersBucket).Create(ctx, "s1", []byte(`{"owner":"key:a"}`)); err != nil {
		t.Fatalf("a gateway records an owner: %v", err)
	}
	if _, _, err := auth.NewSignins(b.Bucket(auth.SigninsBucket), apiKeys(b)).Create(ctx, &auth.Caller{ID: "key:a", Name: "a", Role: auth.RoleUser}, time.Time{}); err != nil {
		t.Fatalf("a gateway signs a browser in: %v", err)
	}
	if _, _, err := apiKeys(admin).Create(ctx, auth.NewKey{Name: "a", Role: auth.RoleUser, CreatedBy: "test"}); err != nil {
		t.Fatalf("admin makes an API key: %v", err)
	}
	cases := map[bus.Role][]string{
		bus.RoleGateway: {"$KV." + auth.KeysBucket + ".k1"},
		bus.RoleRouter:  {"$KV." + auth.KeysBucket + ".k1", "$KV." + admission.OwnersBucket + ".s1", "$KV." + auth.SigninsBucket + ".x"},
		bus.RoleWorker: {"$KV." + admission.OwnersBucket + ".s1", "$KV." + auth.SigninsBucket + ".x",
			"$JS.API.DIRECT.GET." + bus.KVStream(auth.KeysBucket), "$JS.API.STREAM.MSG.GET." + bus.KVStream(auth.KeysBucket),
			"$JS.API.DIRECT.GET." + bus.KVStream(auth.SigninsBucket), "$JS.API.STREAM.MSG.GET." + bus.KVStream(admission.OwnersBucket),
			"$JS.API.CONSUMER.CREATE." + bus.KVStream(auth.KeysBucket)},
		bus.RoleClient: {"$KV." + admission.OwnersBucket + ".s1", "$JS.API.DIRECT.GET." + bus.KVStream(auth.KeysBucket)},
	}
	for role, subjects := range cases {
		nc := s.ConnectAs(t, role)
		for _, subject := range subjects {
			before := len(s.Violations())
			if err := nc.Publish(subject, []byte("{}")); err != nil {
				t.Fatal(err)
			}
			_ = nc.Flush()
			if !s.RefusedSince(before, subject) {
				t.Errorf("%s may publish on %s: the server let it", role, subject)
			}
		}
	}
}

// Every stream, durable consumer and bucket Hermes makes says what it is (nats stream ls,
// consumer ls, kv ls); one made by an earlier Hermes without a description is given one.
func TestEverythingOnTheBusIsDescribed(t *testing.T) {
	t.Parallel()
	s := bustest.NewServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	admin := s.Provision(t, withBuckets(bus.Config{}))
	if _, err := admin.EnsureToolConsumer(ctx, "http", "echo"); err != nil {
		t.Fatal(err)
	}
	// An earlier Hermes' consumer and bucket, without descriptions.
	c, err := admin.Stream.Consumer(ctx, bus.ConsumerRouterResults)
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.CachedInfo().Config
	cfg.Description = ""
	if _, err := admin.Stream.UpdateConsumer(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	st, err := admin.JS.Stream(ctx, bus.KVStream(auth.KeysBucket))
	if err != nil {
		t.Fatal(err)
	}
	sc := st.CachedInfo().Config
	sc.Description = ""
	if _, err := admin.JS.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	s.Provision(t, withBuckets(bus.Config{})) // as every process does at start
	streams := admin.JS.ListStreams(ctx)
	n := 0
	for info := range streams.Info() {
		n++
		if strings.TrimSpace(info.Config.Description) == "" {
			t.Errorf("stream %s has no description", info.Config.Name)
		}
		stream, err := admin.JS.Stream(ctx, info.Config.Name)
		if err != nil {
			t.Fatal(err)
		}
		consumers := stream.ListConsumers(ctx)
		for ci := range consumers.Info() {
			if ci.Config.Durable != "" && (ci.Config.Description == "" || ci.Config.Description == "Hermes") {
				t.Errorf("consumer %s of %s: description %q", ci.Name, info.Config.Name, ci.Config.Description)
			}
		}
		if err := consumers.Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := streams.Err(); err != nil {
		t.Fatal(err)
	}
	if n < 20 {
		t.Fatalf("%d streams listed", n)
	}
}
