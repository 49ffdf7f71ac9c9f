package audit

import "errors"

// ErrSchemaNewer is returned by Migrate for a database whose audit schema is newer than this
// Hermes knows: a newer audit service wrote it, and an older one must not write there.
var ErrSchemaNewer = errors.New("audit: the database's schema is newer than this Hermes")

// ErrEncoding is returned by Migrate for a database whose encoding is not UTF8: the record's
// names and words are UTF-8, and a database in another encoding would refuse some of them (or,
// as SQL_ASCII, store bytes no query can compare as text).
var ErrEncoding = errors.New("audit: the database's encoding is not UTF8")
