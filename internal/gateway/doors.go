package gateway

import (
	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/httpapi"
)

// A Door is a front door the gateway serves beside its own endpoints (the chat dialects, MCP):
// each of its routes behind the gateway's authentication, browser protections and the
// permission it names. A door admits each request through the gateway's Admitter, as the
// gateway's own endpoints do; what it runs besides is a service of its process, not the
// gateway's.
type Door interface {
	Routes() []httpapi.Route
}

// Mount serves d's routes. Call it before Run or Listen.
func (g *Gateway) Mount(d Door) {
	for _, r := range d.Routes() {
		g.mux.HandleFunc(r.Pattern, g.require(r.Need, r.Handler))
	}
}

// Admitter is what admits every request this gateway serves, its doors' too.
func (g *Gateway) Admitter() *admission.Admitter { return g.admit }

// Submitter is what submits the requests of this gateway and its doors.
func (g *Gateway) Submitter() Submitter { return g.submit }
