package policies

import (
	"time"

	"github.com/hermesbus/hermes/pkg/bus"
)

// The buckets policies keep their state in on the bus (bus.Config.Buckets).
const (
	// PoliciesBucket holds the policies applied through the API (key: the tool), each apply a
	// new revision: the last History versions of each stay readable.
	PoliciesBucket = "hermes-policies"
	// WindowsBucket holds the rate limits' windows (key: the tool and whose calls are counted):
	// the calls each let through in the last window, shared by every router.
	WindowsBucket = "hermes-ratelimits"
)

// History is how many versions of a tool's applied policy stay readable.
const History = 64

// windowTTL drops a window nobody used for longer than the longest window.
const windowTTL = 2 * time.Hour

// Buckets are the policies' buckets: the applied policies, written by gateways (the API) and
// followed by routers and gateways; and the rate windows, written by routers and by gateways
// (the calls of the tools Hermes runs itself, Local). Both are strict:
// a policy changed, or a call counted, is what the next read sees, from whichever server.
func Buckets() []bus.Bucket {
	return []bus.Bucket{
		{Name: PoliciesBucket, Description: "Hermes: the tools' policies applied through the API, each version kept", MaxBytes: 16 << 20, History: History, Strict: true,
			Watchers: []bus.Role{bus.RoleRouter}, Writers: []bus.Role{bus.RoleGateway}},
		{Name: WindowsBucket, Description: "Hermes: the rate limits' windows every router and gateway shares", MaxBytes: 64 << 20, TTL: windowTTL, Strict: true, Writers: []bus.Role{bus.RoleRouter, bus.RoleGateway}},
	}
}
