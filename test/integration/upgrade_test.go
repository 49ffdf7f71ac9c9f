package integration

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/minio/highwayhash"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// untar unpacks the gzipped tar at path into dir.
func untar(t *testing.T, path, dir string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		target := filepath.Join(dir, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				t.Fatal(err)
			}
			out, err := os.Create(target)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(out, io.LimitReader(tr, 64<<20)); err != nil {
				t.Fatal(err)
			}
			out.Close()
		}
	}
}

// jsonLines decodes each line of b as a JSON object, dropping the payload fields of tool calls
// that this version no longer has: the call ids and serial flag that rode on every dispatch now
// travel in the envelope's correlation, which replay does not show.
func jsonLines(t *testing.T, b []byte) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var m map[string]any
		dec := json.NewDecoder(strings.NewReader(sc.Text()))
		dec.UseNumber()
		if err := dec.Decode(&m); err != nil {
			t.Fatalf("not a JSON line: %v: %s", err, sc.Text())
		}
		if m["type"] == string(protocol.TypeToolCall) {
			if p, ok := m["payload"].(map[string]any); ok {
				delete(p, "request_call_ids")
				delete(p, "serial")
			}
		}
		out = append(out, m)
	}
	return out
}

// TestRecordOfTheEarlierVersionStillServes starts this version on the store an earlier Hermes
// left behind (testdata/record-v1: commit 086f7ff, before the restructuring): every session
// replays as it did then and dead letters are still listed; hermes migrate names the work the
// earlier version left unfinished in its own layout (calls queued in its one-consumer-per-tool
// layout), removes that layout once told to give the work up, and the responses the earlier
// version recorded are served by request id.
func TestRecordOfTheEarlierVersionStillServes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	untar(t, "testdata/record-v1/hermes-data.tar.gz", dir)
	keepForever(t, filepath.Join(dir, "hermes-data"))
	srv, err := bus.StartServer(bus.ServerConfig{StoreDir: filepath.Join(dir, "hermes-data"), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	s := start(t, options{workers: 1, natsURL: srv.ClientURL()})

	// Replay: what the earlier version printed, line for line.
	for _, session := range []string{"req_abc123", "sess_demo_parallel", "req_echo_001", "fx_sess", "fx_serial", "fx_poison"} {
		golden, err := os.ReadFile("testdata/record-v1/replay-" + session + ".jsonl")
		if err != nil {
			t.Fatal(err)
		}
		var out, errOut bytes.Buffer
		if code := app.Exec(app.RunReplay, []string{"--nats", srv.ClientURL(), "--session", session, "--json"}, app.Env{Stdout: &out, Stderr: &errOut}); code != 0 {
			t.Fatalf("replay %s: exit %d: %s", session, code, errOut.String())
		}
		want, got := jsonLines(t, golden), jsonLines(t, out.Bytes())
		if len(got) < len(want) {
			t.Fatalf("replay %s: %d messages, the earlier version had %d", session, len(got), len(want))
		}
		for i := range want {
			if !jsonDeepEqual(want[i], got[i]) {
				w, _ := json.Marshal(want[i])
				g, _ := json.Marshal(got[i])
				t.Errorf("replay %s, message %d:\nthen %s\nnow  %s", session, i, w, g)
			}
		}
		// The text form reads every message too.
		out.Reset()
		if code := app.Exec(app.RunReplay, []string{"--nats", srv.ClientURL(), "--session", session}, app.Env{Stdout: &out, Stderr: &errOut}); code != 0 ||
			(session != "fx_poison" && strings.Contains(out.String(), "[?]")) {
			t.Errorf("replay %s (text): exit %d:\n%s", session, code, out.String())
		}
	}
	// The web view's event stream serves the old record.
	ev := openEvents(t, s.base, "req_abc123", "")
	if flow := ev.flow("req_abc123", 5); flow[0].Type != protocol.TypeRequest || flow[4].Type != protocol.TypeResponse {
		t.Errorf("events %+v", flow)
	}
	ev.close()
	// Dead letters of then are listed now.
	var out, errOut bytes.Buffer
	if code := app.Exec(app.RunDLQ, []string{"ls", "--json", "--nats", srv.ClientURL()}, app.Env{Stdout: &out, Stderr: &errOut}); code != 0 {
		t.Fatalf("dlq ls: exit %d: %s", code, errOut.String())
	}
	golden, _ := os.ReadFile("testdata/record-v1/dlq.jsonl")
	if want, got := jsonLines(t, golden), jsonLines(t, out.Bytes()); len(got) != len(want) || !jsonDeepEqual(want[0], got[0]) {
		t.Errorf("dlq ls:\nthen %s\nnow  %s", golden, out.Bytes())
	}
	// The earlier version's consumer tool-echo still holds the calls it never ran (fx_inflight's,
	// and fx_ser3's, behind which fx_ser4 waited): this version does not run them, and hermes
	// migrate refuses to remove its layouts while they are there, naming them.
	migrate := func(args ...string) (int, string) {
		var out, errOut bytes.Buffer
		code := app.Exec(app.RunMigrate, append([]string{"--nats", srv.ClientURL()}, args...), app.Env{Stdout: &out, Stderr: &errOut})
		return code, out.String() + errOut.String()
	}
	code, report := migrate()
	if code != 1 || !strings.Contains(report, "consumer tool-echo: 2 call(s) of echo not run (requests fx_inflight, fx_ser3)") ||
		!strings.Contains(report, "nothing removed") {
		t.Fatalf("migrate with the earlier version's work pending: exit %d:\n%s", code, report)
	}
	// Given up, the earlier layouts are removed; run again, there is nothing to do.
	if code, report = migrate("--discard-pending"); code != 0 || !strings.Contains(report, "Removed consumer tool-echo.") ||
		!strings.Contains(report, "Removed bucket hermes-intake.") {
		t.Fatalf("migrate --discard-pending: exit %d:\n%s", code, report)
	}
	if code, report = migrate(); code != 0 || !strings.Contains(report, "nothing to do") {
		t.Fatalf("migrate again: exit %d:\n%s", code, report)
	}
	// The responses the earlier version recorded are served by request id: migrate recorded
	// them again where this version reads them.
	for _, id := range []string{"req_abc123", "req_parallel_001", "fx_noroute", "fx_ser2"} {
		resp, err := http.Get(s.base + "/v1/requests/" + id)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: HTTP %d: %s", id, resp.StatusCode, got)
		}
		if r := decodeResponse(t, got); r.RequestID != id {
			t.Errorf("GET %s: %+v", id, r)
		}
	}
}

// keepForever makes every stream of the JetStream store in dir keep its messages whatever their
// age (max_age 0), before a server opens it: the fixture was written on one day, and its
// streams' own limits (the record's 7 days, the buckets' 24 hours) would otherwise empty them
// as the days pass. What the test reads is the earlier version's layout, not its retention.
// The stream's metadata is checksummed as the server checks it (HighwayHash-64, keyed by the
// SHA-256 of the stream's name).
func keepForever(t *testing.T, dir string) {
	t.Helper()
	streams, err := filepath.Glob(filepath.Join(dir, "jetstream", "*", "streams", "*"))
	if err != nil || len(streams) == 0 {
		t.Fatalf("no streams in %s: %v", dir, err)
	}
	for _, sd := range streams {
		meta := filepath.Join(sd, "meta.inf")
		data, err := os.ReadFile(meta)
		if err != nil {
			t.Fatal(err)
		}
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		var cfg map[string]any
		if err := dec.Decode(&cfg); err != nil {
			t.Fatalf("%s: %v", meta, err)
		}
		cfg["max_age"] = 0
		if data, err = json.Marshal(cfg); err != nil {
			t.Fatal(err)
		}
		key := sha256.Sum256([]byte(filepath.Base(sd)))
		hh, err := highwayhash.New64(key[:])
		if err != nil {
			t.Fatal(err)
		}
		hh.Write(data)
		if err := os.WriteFile(meta, data, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(sd, "meta.sum"), []byte(hex.EncodeToString(hh.Sum(nil))), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func jsonDeepEqual(a, b map[string]any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}
