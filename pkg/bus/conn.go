package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hermesbus/hermes/pkg/retry"
)

// EnvURL is the environment variable every Hermes binary reads for the NATS URL.
const EnvURL = "HERMES_NATS_URL"

// DefaultURL is the NATS URL used when none is given.
const DefaultURL = "nats://127.0.0.1:4222"

// Connect dials url with options fit for a long-running worker: it retries the first connect
// until ctx is done, reconnects forever (to another server of the list when one stops
// answering pings for about 15 s), and logs disconnects and reconnects on logger. A
// connection whose user may not subscribe under its inbox prefix (nats.CustomInboxPrefix) is
// closed and refused at once with ErrInboxRefused, rather than left to time out on every
// request.
func Connect(ctx context.Context, url, name string, logger *slog.Logger, extra ...nats.Option) (*nats.Conn, error) {
	logger = orDiscard(logger)
	opts := append([]nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		// A server cut off by the network (not closed) answers no ping: after about 15 s the
		// connection is taken for dead and another server of the URL list is dialed, instead
		// of waiting minutes on the library's defaults.
		nats.PingInterval(5 * time.Second),
		nats.MaxPingsOutstanding(3),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				logger.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { logger.Info("nats reconnected", "url", c.ConnectedUrlRedacted()) }),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			logger.Error("nats async error", "subject", subject, "err", err)
		}),
	}, extra...)
	var nc *nats.Conn
	err := retry.Do(ctx, ConnectRetry, time.Time{}, func() (err error) {
		if nc, err = nats.Connect(url, opts...); err != nil {
			return err
		}
		if err = CheckInbox(ctx, nc); err != nil {
			nc.Close()
			if errors.Is(err, ErrInboxRefused) {
				return retry.Stop(err)
			}
		}
		return err
	}, func(err error, _ time.Duration) {
		logger.Warn("nats connect failed; retrying", "url", Redact(url), "err", err)
	})
	if err != nil {
		return nil, fmt.Errorf("bus: connect to %s: %w", Redact(url), err)
	}
	return nc, nil
}

// CheckInbox subscribes under nc's inbox prefix, waits for the server's answer, and returns
// ErrInboxRefused when the server refused the subscription: the user's permissions name
// another inbox. Other errors say the server could not be asked.
func CheckInbox(ctx context.Context, nc *nats.Conn) error {
	subject := nc.NewInbox()
	sub, err := nc.SubscribeSync(subject)
	if err != nil {
		return fmt.Errorf("bus: subscribe under the inbox prefix: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	// The server answers the flush after it refused the subscription, if it did, and the
	// connection reads what it says in order.
	if err := nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("bus: check the inbox prefix: %w", err)
	}
	if last := nc.LastError(); errors.Is(last, nats.ErrPermissionViolation) && strings.Contains(last.Error(), `"`+subject+`"`) {
		prefix := nc.Opts.InboxPrefix
		if prefix == "" {
			prefix = "_INBOX"
		}
		return fmt.Errorf("%w (%s): connect with the inbox prefix the user's permissions name (a service role's _INBOX_<role>, a named worker's or an external client's _INBOX_<name>)", ErrInboxRefused, prefix)
	}
	return nil
}

// ConnectRetry spaces out tries to reach NATS, or to provision on it, at start: every 500 ms.
var ConnectRetry = retry.Fixed(500 * time.Millisecond)

// Redact hides credentials in a URL for logs, errors and banners.
func Redact(url string) string {
	if strings.Contains(url, ",") { // a list of servers: each may carry credentials
		parts := strings.Split(url, ",")
		for i, p := range parts {
			parts[i] = Redact(p)
		}
		return strings.Join(parts, ",")
	}
	for i := 0; i+3 <= len(url); i++ {
		if url[i:i+3] == "://" {
			rest := url[i+3:]
			for j := 0; j < len(rest); j++ {
				if rest[j] == '@' {
					return url[:i+3] + "***@" + rest[j+1:]
				}
				if rest[j] == '/' {
					break
				}
			}
			break
		}
	}
	return url
}

func orDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
