package worker

import "time"

// SetLegacyLook sets how often workers look for consumers of the earlier version, for tests
// that cannot wait the production interval; it returns the previous value.
func SetLegacyLook(d time.Duration) time.Duration {
	prev := legacyLook
	legacyLook = d
	return prev
}
