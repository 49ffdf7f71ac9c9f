package routes

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
)

const waitFor = 10 * time.Second

// recordHandler sends log records to a channel, dropping them when it is full.
type recordHandler struct{ records chan slog.Record }

func (h recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h recordHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h recordHandler) WithGroup(string) slog.Handler            { return h }
func (h recordHandler) Handle(_ context.Context, r slog.Record) error {
	select {
	case h.records <- r.Clone():
	default:
	}
	return nil
}

// watchHarness runs Watch on a file in a temporary directory.
type watchHarness struct {
	t       *testing.T
	path    string
	tables  chan *Table
	records chan slog.Record
	done    chan error
	cancel  context.CancelFunc
}

func startWatch(t *testing.T, initial string) *watchHarness {
	t.Helper()
	h := &watchHarness{
		t:       t,
		path:    filepath.Join(t.TempDir(), "routes.yaml"),
		tables:  make(chan *Table, 16),
		records: make(chan slog.Record, 256),
		done:    make(chan error, 1),
	}
	if initial != "" {
		h.write(initial)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	logger := slog.New(recordHandler{h.records})
	go func() { h.done <- Watch(ctx, h.path, 5*time.Millisecond, func(t *Table) { h.tables <- t }, logger) }()
	t.Cleanup(h.stop)
	return h
}

// write replaces the file atomically, so that Watch never reads half a file.
func (h *watchHarness) write(content string) {
	h.t.Helper()
	tmp := h.path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		h.t.Fatal(err)
	}
	if err := os.Rename(tmp, h.path); err != nil {
		h.t.Fatal(err)
	}
}

// nextTable waits for onChange and checks the table's first rule name.
func (h *watchHarness) nextTable(wantRule string) *Table {
	h.t.Helper()
	select {
	case tab := <-h.tables:
		if tab.Rules[0].Name != wantRule {
			h.t.Fatalf("onChange got a table with rule %q; want %q", tab.Rules[0].Name, wantRule)
		}
		return tab
	case <-time.After(waitFor):
		h.t.Fatalf("no onChange with rule %q within %v", wantRule, waitFor)
	}
	return nil
}

// nextError waits for a log record at Error and returns its attributes.
func (h *watchHarness) nextError() (string, map[string]any) {
	h.t.Helper()
	deadline := time.After(waitFor)
	for {
		select {
		case r := <-h.records:
			if r.Level != slog.LevelError {
				continue
			}
			attrs := map[string]any{}
			r.Attrs(func(a slog.Attr) bool {
				attrs[a.Key] = a.Value.Any()
				return true
			})
			return r.Message, attrs
		case <-deadline:
			h.t.Fatalf("no error logged within %v", waitFor)
		}
	}
}

func (h *watchHarness) stop() {
	h.cancel()
	select {
	case err := <-h.done:
		if err != nil {
			h.t.Errorf("Watch returned %v; want nil after cancel", err)
		}
	case <-time.After(waitFor):
		h.t.Errorf("Watch did not return within %v of cancel", waitFor)
	}
}

func versioned(rule string) string {
	return lines("version: 1.0", "rules:", "  - name: "+rule, "    match: {tool_name: t}", "    action: {http: {url: 'http://s/x'}}")
}

// broken misses tool_name: line 4, rules[0].match.tool_name.
var broken = lines("version: 1.0", "rules:", "  - name: broken", "    match: {intent_contains: [a]}", "    action: {http: {url: 'http://s/x'}}")

func TestWatchReloadsAndKeepsLastGood(t *testing.T) {
	h := startWatch(t, versioned("v1"))
	h.nextTable("v1")

	h.write(versioned("v2"))
	v2 := h.nextTable("v2")

	h.write(broken)
	msg, attrs := h.nextError()
	if msg != "routes: reload failed; keeping the last good table" {
		t.Errorf("message = %q", msg)
	}
	want := map[string]any{
		"file": h.path, "line": int64(4), "field": "rules[0].match.tool_name", "reason": "is required", "kept_digest": v2.Digest,
	}
	for k, v := range want {
		if attrs[k] != v {
			t.Errorf("log attribute %s = %v (%T); want %v", k, attrs[k], attrs[k], v)
		}
	}

	// onChange runs in load order, so the next table proving v3 also proves the broken file
	// was never delivered.
	h.write(versioned("v3"))
	h.nextTable("v3")
	select {
	case tab := <-h.tables:
		t.Errorf("unexpected extra onChange with rule %q", tab.Rules[0].Name)
	default:
	}
}

func TestWatchUnchangedContentIsNotReloaded(t *testing.T) {
	h := startWatch(t, versioned("v1"))
	first := h.nextTable("v1")
	// Rewriting the same bytes is no change; the next table must be the next content.
	h.write(versioned("v1"))
	h.write(versioned("v2"))
	if second := h.nextTable("v2"); second.Digest == first.Digest {
		t.Error("different files have the same digest")
	}
}

func TestWatchStartsBrokenThenRecovers(t *testing.T) {
	h := startWatch(t, broken)
	msg, attrs := h.nextError()
	if msg != "routes: load failed; no good table yet" || attrs["line"] != int64(4) {
		t.Errorf("first log = %q %v", msg, attrs)
	}
	h.write(versioned("fixed"))
	h.nextTable("fixed")
}

func TestWatchMissingFile(t *testing.T) {
	h := startWatch(t, "")
	msg, attrs := h.nextError()
	if msg != "routes: load failed; no good table yet" || attrs["file"] != h.path {
		t.Errorf("log = %q %v", msg, attrs)
	}
	h.write(versioned("created"))
	h.nextTable("created")
}

func TestWatchRejectsBadArguments(t *testing.T) {
	ctx := context.Background()
	if err := Watch(ctx, "x.yaml", 0, func(*Table) {}, nil); err == nil {
		t.Error("Watch accepted a zero interval")
	}
	if err := Watch(ctx, "x.yaml", time.Second, nil, nil); err == nil {
		t.Error("Watch accepted a nil onChange")
	}
}

func TestWatchReturnsWhenContextIsDone(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Watch(ctx, filepath.Join(t.TempDir(), "none.yaml"), time.Hour, func(*Table) {
		t.Error("onChange called after cancel")
	}, nil); err != nil {
		t.Errorf("Watch = %v; want nil", err)
	}
}
