package bus_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
)

// Each service role receives its replies under an inbox of its own: connected with it, its
// JetStream calls are answered; connected with the shared _INBOX or another role's, Connect
// refuses at once, saying why, instead of every call timing out.
func TestEachServiceReceivesRepliesUnderItsOwnInbox(t *testing.T) {
	t.Parallel()
	s := bustest.NewLockedServer(t)
	s.Provision(t, bus.Config{})
	services := []bus.Role{bus.RoleGateway, bus.RoleRouter, bus.RoleWorker}
	for _, role := range services {
		t.Run(string(role), func(t *testing.T) {
			a, err := bus.AccessOf(role, string(role))
			if err != nil {
				t.Fatal(err)
			}
			if a.Inbox != "_INBOX_"+string(role) || a.Inbox != bus.RoleInbox(role) {
				t.Fatalf("inbox %q", a.Inbox)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			nc, err := bus.Connect(ctx, s.Plain, "inbox-"+string(role), nil, s.As(t, role)...)
			if err != nil {
				t.Fatalf("connected with its own inbox: %v", err)
			}
			js, _ := jetstream.New(nc)
			if _, err := js.AccountInfo(ctx); err != nil {
				t.Errorf("a JetStream call under its own inbox: %v", err)
			}
			nc.Close()

			wrong := []string{"_INBOX"}
			for _, other := range services {
				if other != role {
					wrong = append(wrong, bus.RoleInbox(other))
				}
			}
			for _, inbox := range wrong {
				start := time.Now()
				nc, err := bus.Connect(ctx, s.Plain, "inbox-"+string(role), nil, append(s.As(t, role), nats.CustomInboxPrefix(inbox))...)
				if err == nil {
					nc.Close()
					t.Fatalf("connected with inbox %s", inbox)
				}
				if !errors.Is(err, bus.ErrInboxRefused) {
					t.Errorf("inbox %s: %v, want ErrInboxRefused", inbox, err)
				}
				if took := time.Since(start); took > 5*time.Second {
					t.Errorf("inbox %s: refused after %v", inbox, took)
				}
			}
		})
	}
}

// An unlocked server lets any inbox in, and admin (allowed everything) keeps _INBOX.
func TestAnyInboxOnAnOpenServer(t *testing.T) {
	t.Parallel()
	s := bustest.NewServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, inbox := range []string{"", bus.RoleInbox(bus.RoleRouter)} {
		var opts []nats.Option
		if inbox != "" {
			opts = append(opts, nats.CustomInboxPrefix(inbox))
		}
		nc, err := bus.Connect(ctx, s.URL, "open", nil, opts...)
		if err != nil {
			t.Fatalf("inbox %q: %v", inbox, err)
		}
		nc.Close()
	}
	locked := bustest.NewLockedServer(t)
	nc, err := bus.Connect(ctx, locked.URL, "admin", nil)
	if err != nil {
		t.Fatalf("admin: %v", err)
	}
	nc.Close()
	if a, _ := bus.AccessOf(bus.RoleAdmin, "admin"); a.Inbox != "_INBOX" {
		t.Fatalf("admin's inbox %q", a.Inbox)
	}
}
