package record

import "errors"

// ErrNoRecord is returned when the server holds no Hermes record (no HERMES stream): it is not
// the server Hermes runs on, or Hermes has never run there.
var ErrNoRecord = errors.New("record: no Hermes record on this server (stream HERMES not found)")

// ErrStart is returned for a Start that names both a sequence and a time.
var ErrStart = errors.New("record: start at a sequence or at a time, not both")
