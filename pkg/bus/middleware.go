package bus

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/tracing"
)

// Middleware wraps a Handler: decoding, tracing, logging and recovery are written once, so a
// consumer's handler is only its business logic.
type Middleware func(Handler) Handler

// Chain wraps h in mw; mw[0] is the outermost, the first to see a delivery.
func Chain(h Handler, mw ...Middleware) Handler {
	for i := len(mw) - 1; i >= 0; i-- {
		h = mw[i](h)
	}
	return h
}

// Recover turns a panic in the handler into an error (with the stack), so the message is
// redelivered and the process lives on.
func Recover() Middleware {
	return func(next Handler) Handler {
		return HandlerFunc(func(ctx context.Context, d *Delivery) (err error) {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("bus: handler panic: %v\n%s", r, debug.Stack())
				}
			}()
			return next.Handle(ctx, d)
		})
	}
}

// Decode reads the delivery's HermesMessage envelope into d.Msg. Bytes that are not a valid
// envelope can never be handled: the message is terminated (Permanent), and so dead-lettered.
func Decode() Middleware {
	return func(next Handler) Handler {
		return HandlerFunc(func(ctx context.Context, d *Delivery) error {
			m, err := protocol.Unmarshal(d.Data)
			if err != nil {
				return Permanent(err)
			}
			d.Msg = m
			return next.Handle(ctx, d)
		})
	}
}

// Log sets d.Log to logger with the fields that name the delivery's message: request_id,
// session_id, msg_id and trace_id (from the decoded envelope, or else from the headers Hermes
// sets on every message). A nil logger discards.
func Log(logger *slog.Logger) Middleware {
	logger = orDiscard(logger)
	return func(next Handler) Handler {
		return HandlerFunc(func(ctx context.Context, d *Delivery) error {
			if m := d.Msg; m != nil {
				d.Log = logger.With("request_id", m.RequestID, "session_id", m.SessionID, "msg_id", m.MsgID, "trace_id", m.Trace.TraceID)
			} else {
				d.Log = logger.With("request_id", d.Header.Get(HeaderRequestID), "session_id", d.Header.Get(HeaderSessionID),
					"msg_id", d.Header.Get(jetstream.MsgIDHeader), "trace_id", d.Header.Get(HeaderTraceID))
			}
			return next.Handle(ctx, d)
		})
	}
}

// Trace runs the handler in a span named name, a child of the decoded message's trace context
// (use after Decode), and ends the span with the handler's error.
func Trace(name string, kind trace.SpanKind) Middleware {
	return func(next Handler) Handler {
		return HandlerFunc(func(ctx context.Context, d *Delivery) (err error) {
			if d.Msg == nil {
				return next.Handle(ctx, d)
			}
			ctx, span := tracing.Start(ctx, d.Msg, name, kind)
			defer func() { tracing.End(span, err) }()
			return next.Handle(ctx, d)
		})
	}
}

// Messages is the stack every consumer of HermesMessages uses: recover, decode, log fields,
// and a consumer span named span. h sees d.Msg and d.Log set, and its span in ctx.
func Messages(h Handler, logger *slog.Logger, span string) Handler {
	return Chain(h, Recover(), Decode(), Log(logger), Trace(span, trace.SpanKindConsumer))
}
