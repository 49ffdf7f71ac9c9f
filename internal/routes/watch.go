package routes

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Watch keeps a routes table up to date with the file at path. It reads the file at once and
// then every interval; whenever the content (compared by SHA-256) differs from the last content
// it saw, it parses it and, if the file is valid, calls onChange with the new table. The first
// good load is delivered too, so a caller that already loaded the file gets an equivalent table
// once and misses no change made in between.
//
// A reload that fails (unreadable file, invalid content) is logged at Error with the file,
// line, field and reason, and onChange is not called: the caller keeps its last good table.
// Each bad content is reported once (it is not parsed again until the file changes), and so is
// each distinct read error.
//
// onChange is called from Watch's goroutine, one call at a time, in load order; Watch waits for
// it to return. Watch returns nil once ctx is done, and an error only for bad arguments. A nil
// logger discards.
func Watch(ctx context.Context, path string, interval time.Duration, onChange func(*Table), logger *slog.Logger) error {
	if interval <= 0 {
		return fmt.Errorf("routes: watch %s: interval must be positive, got %v", path, interval)
	}
	if onChange == nil {
		return fmt.Errorf("routes: watch %s: onChange is nil", path)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	w := &watcher{path: path, onChange: onChange, logger: logger}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		w.poll(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// watcher is the state of one Watch call; it is used by that call's goroutine only.
type watcher struct {
	path     string
	onChange func(*Table)
	logger   *slog.Logger

	seen        bool              // whether sum holds the last content read
	sum         [sha256.Size]byte // last content read, good or bad
	good        string            // digest of the last good table, "" before the first
	readFailure string            // the read error logged last, until a read succeeds
}

// poll reads the file once and acts on a change. A content that fails to parse is logged once,
// since it is not parsed again until it changes; a read error is logged when it differs from
// the previous one.
func (w *watcher) poll(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	data, err := readFile(w.path)
	if err != nil {
		if msg := err.Error(); msg != w.readFailure {
			w.readFailure = msg
			w.logFailure(err)
		}
		return
	}
	w.readFailure = ""
	sum := sha256.Sum256(data)
	if w.seen && sum == w.sum {
		return
	}
	w.seen, w.sum = true, sum
	t, err := Parse(w.path, data)
	if err != nil {
		w.logFailure(err)
		return
	}
	w.good = t.Digest
	w.logger.Info("routes: loaded", "file", w.path, "rules", len(t.Rules), "digest", t.Digest)
	w.onChange(t)
}

// logFailure logs a failed load at Error, with the file, line, field and reason.
func (w *watcher) logFailure(err error) {
	attrs := []any{"file", w.path}
	var le *LoadError
	if errors.As(err, &le) {
		attrs = append(attrs, "line", le.Line, "field", le.Field, "reason", le.Reason)
	} else {
		attrs = append(attrs, "reason", err.Error())
	}
	if w.good == "" {
		w.logger.Error("routes: load failed; no good table yet", attrs...)
		return
	}
	attrs = append(attrs, "kept_digest", w.good)
	w.logger.Error("routes: reload failed; keeping the last good table", attrs...)
}
