package audit

import "errors"

// ErrSchemaNewer is returned by Migrate for a database whose audit schema is newer than this
// Hermes knows: a newer audit service wrote it, and an older one must not write there.
var ErrSchemaNewer = errors.New("audit: the database's schema is newer than this Hermes")
