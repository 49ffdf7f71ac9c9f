// Package tracing carries OpenTelemetry traces across the bus.
//
// Every Hermes message holds its W3C trace context (protocol.TraceContext, also sent as the
// traceparent NATS header). A service handling a message starts its span as a child of the
// message's context with Start, and writes its own span's context into the messages it sends
// with Inject, so one trace runs gateway → router → tool worker → tool → router → gateway.
//
// It uses the global OpenTelemetry provider and propagates nothing else: a program installs
// an exporter of its own (Hermes' binaries do, from the OTEL_* variables), or none, in which
// case the no-op provider passes the caller's trace context through unchanged, so tools still
// see the caller's traceparent. It depends on the OpenTelemetry API only, not its SDK.
package tracing

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// Name is the instrumentation scope of Hermes' spans.
const Name = "github.com/hermesbus/hermes"

var propagator = propagation.TraceContext{}

// Tracer returns Hermes' tracer from the global provider (read at each call, so a provider
// installed later, e.g. by a test, takes effect).
func Tracer() trace.Tracer { return otel.Tracer(Name) }

// Context returns ctx carrying tc's W3C trace context as the remote parent; ctx unchanged
// when tc has none or an invalid one.
func Context(ctx context.Context, tc protocol.TraceContext) context.Context {
	if tc.Traceparent == "" {
		return ctx
	}
	return propagator.Extract(ctx, carrier{tc: &tc})
}

// Inject writes the trace context of ctx's span into tc (traceparent and tracestate). The
// correlation id tc.TraceID is kept. With no valid span context in ctx, tc is unchanged.
func Inject(ctx context.Context, tc *protocol.TraceContext) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	propagator.Inject(ctx, carrier{tc: tc})
}

// Start starts a span named name for handling m, as a child of m's trace context, with the
// message's ids as attributes.
func Start(ctx context.Context, m *protocol.Message, name string, kind trace.SpanKind, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	ctx, span := Tracer().Start(Context(ctx, m.Trace), name, trace.WithSpanKind(kind))
	if span.IsRecording() { // attributes cost allocations per message: only when exported
		span.SetAttributes(attrs...)
		span.SetAttributes(
			attribute.String("hermes.request_id", m.RequestID),
			attribute.String("hermes.session_id", m.SessionID),
			attribute.String("hermes.msg_id", m.MsgID),
			attribute.String("hermes.message_type", string(m.Type)),
		)
		if m.Trace.TraceID != "" {
			span.SetAttributes(attribute.String("hermes.trace_id", m.Trace.TraceID))
		}
	}
	return ctx, span
}

// End ends span, marking it failed when err is not nil.
func End(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// TraceID returns the W3C trace id of ctx's span as hex, or "" when it has none.
func TraceID(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	return sc.TraceID().String()
}

// carrier adapts a protocol.TraceContext to the propagator.
type carrier struct{ tc *protocol.TraceContext }

func (c carrier) Get(key string) string {
	switch key {
	case "traceparent":
		return c.tc.Traceparent
	case "tracestate":
		return c.tc.Tracestate
	}
	return ""
}

func (c carrier) Set(key, value string) {
	switch key {
	case "traceparent":
		c.tc.Traceparent = value
	case "tracestate":
		c.tc.Tracestate = value
	}
}

func (c carrier) Keys() []string { return []string{"traceparent", "tracestate"} }
