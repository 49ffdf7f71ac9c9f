package tracing

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/hermesbus/hermes/pkg/protocol"
)

func TestWithoutExportTheCallersContextPassesThrough(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx, span := Start(context.Background(), &protocol.Message{Trace: protocol.TraceContext{Traceparent: tp}}, "x", trace.SpanKindConsumer)
	defer span.End()
	var out protocol.TraceContext
	Inject(ctx, &out)
	if out.Traceparent != tp {
		t.Fatalf("traceparent %q, want the caller's %q unchanged", out.Traceparent, tp)
	}
	if TraceID(ctx) != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("TraceID %q", TraceID(ctx))
	}
}
