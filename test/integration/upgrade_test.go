package integration

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// fixtureWritten is when the fixture's first message was stored (its replay's first line).
func fixtureWritten(t *testing.T) time.Time {
	t.Helper()
	golden, err := os.ReadFile("testdata/record-v1/replay-req_abc123.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	var first struct {
		Time time.Time `json:"time"`
	}
	line, _, _ := bytes.Cut(golden, []byte("\n"))
	if err := json.Unmarshal(line, &first); err != nil || first.Time.IsZero() {
		t.Fatalf("the fixture's first message has no time: %v", err)
	}
	return first.Time
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
// replays as it did then, the responses it recorded are still served, dead letters are still
// listed, and the work it left unfinished — a call queued in its one-consumer-per-tool layout,
// a dispatched serial request, and the serial request parked behind it in its old parking
// place — is finished by this version.
func TestRecordOfTheEarlierVersionStillServes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	untar(t, "testdata/record-v1/hermes-data.tar.gz", dir)
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
	// What follows rests on the earlier version's state — its intake, plans and claims, kept
	// 24 hours — as a deployment upgraded while running has it. The store was written at a
	// fixed time; once that state has aged out by the earlier version's own TTL, the record is
	// all there is to read, and the checks above are what remains true.
	if age := time.Since(fixtureWritten(t)); age > 23*time.Hour {
		t.Logf("the fixture was written %s ago, past the earlier version's 24 h state TTL: the checks of its state (responses served by request id, a repeat answered from the first run, unfinished work finished) are not made", age.Round(time.Hour))
		return
	}
	// Responses recorded then are served now.
	for _, id := range []string{"req_abc123", "req_parallel_001", "fx_noroute", "fx_ser2"} {
		resp, err := http.Get(s.base + "/v1/requests/" + id)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %v %v", id, resp, err)
		}
		resp.Body.Close()
	}
	// The same request posted again is answered from the first run.
	body, _ := os.ReadFile("../../examples/request.json")
	if status, hdr, _ := s.post(body, ""); status != http.StatusOK || hdr.Get("X-Hermes-Replayed") != "true" {
		t.Errorf("repeat of req_abc123: HTTP %d replayed=%q", status, hdr.Get("X-Hermes-Replayed"))
	}
	// Work left unfinished is finished: the queued call, the dispatched serial request, and
	// the serial request parked behind it.
	for _, id := range []string{"fx_inflight", "fx_ser3", "fx_ser4"} {
		var status int
		var got []byte
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			resp, err := http.Get(s.base + "/v1/requests/" + id)
			if err != nil {
				t.Fatal(err)
			}
			got, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			if status = resp.StatusCode; status == http.StatusOK {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if status != http.StatusOK {
			t.Fatalf("%s was not finished: HTTP %d: %s", id, status, got)
		}
		if r := decodeResponse(t, got); r.Status != protocol.StatusSuccess {
			t.Errorf("%s: %+v", id, r)
		}
	}
	// fx_ser4 ran only after fx_ser3 was answered.
	var ser3Answered, ser4Dispatched time.Time
	for _, m := range s.stored() {
		dm, err := protocol.Unmarshal(m.Data)
		if err != nil {
			continue
		}
		if dm.RequestID == "fx_ser3" && dm.Type == protocol.TypeResponse {
			ser3Answered = m.Time
		}
		if dm.RequestID == "fx_ser4" && dm.Type == protocol.TypeToolCall {
			ser4Dispatched = m.Time
		}
	}
	if ser3Answered.IsZero() || ser4Dispatched.IsZero() || ser4Dispatched.Before(ser3Answered) {
		t.Errorf("fx_ser4 dispatched at %v, fx_ser3 answered at %v", ser4Dispatched, ser3Answered)
	}
}

func jsonDeepEqual(a, b map[string]any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}
