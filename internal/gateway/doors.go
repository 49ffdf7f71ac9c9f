package gateway

import (
	"context"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/httpapi"
)

// A Part is work that runs while the gateway listens (Listen): a front door, the bus ingress,
// the contracts followed. Run returns once ctx ends.
type Part interface {
	Run(ctx context.Context) error
}

// A Door is a Part that serves HTTP endpoints beside the gateway's own (the chat dialects,
// MCP): each route behind the gateway's authentication, browser protections and the
// permission it names. A door admits each request through the gateway's Admitter, as the
// gateway's own endpoints do.
type Door interface {
	Part
	Routes() []httpapi.Route
}

// Mount runs p while the gateway listens and, when p is a Door, serves its routes. Call it
// before Run or Listen.
func (g *Gateway) Mount(p Part) {
	if d, ok := p.(Door); ok {
		for _, r := range d.Routes() {
			g.mux.HandleFunc(r.Pattern, g.require(r.Need, r.Handler))
		}
	}
	g.parts = append(g.parts, p)
}

// Admitter is what admits every request this gateway serves, its doors' too.
func (g *Gateway) Admitter() *admission.Admitter { return g.admit }

// Submitter is what submits the requests of this gateway and its doors.
func (g *Gateway) Submitter() Submitter { return g.submit }
