package admission

import "github.com/hermesbus/hermes/pkg/bus"

// OwnersBucket says who each session belongs to (key: the session id): written once, when the
// session's first request is admitted; kept as long as plans (so as long as the record holds
// any of the session's messages), and renewed while the session is used.
const OwnersBucket = "hermes-owners"

// Bucket is the owners bucket for a bus configured with cfg: as large as a state bucket
// (bus.Config.StateMaxBytes), strict (an owner, once written, is what every gateway reads), and
// written by gateways only.
func Bucket(cfg bus.Config) bus.Bucket {
	return bus.Bucket{Name: OwnersBucket, Description: "Hermes: who each session belongs to", MaxBytes: bus.WithDefaults(cfg).StateMaxBytes, AsLongAsPlans: true, Strict: true,
		Writers: []bus.Role{bus.RoleGateway}}
}
