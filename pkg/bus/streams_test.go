package bus_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

func TestARecordKeepsTheStreamsItWasCreatedWith(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{Streams: 3, Partitions: 6})
	if b.Layout().Streams() != 3 || len(b.Streams) != 3 || b.Partitions() != 6 {
		t.Fatalf("%d streams (%d opened), %d partitions", b.Layout().Streams(), len(b.Streams), b.Partitions())
	}
	for k, s := range b.Streams {
		if name := s.CachedInfo().Config.Name; name != protocol.RecordStream(k) {
			t.Errorf("stream %d is %s", k, name)
		}
	}
	// Each partition's consumer in the stream that holds its sessions.
	for p := range 6 {
		if _, err := b.Streams[p%3].Consumer(ctx, bus.RequestConsumer(p)); err != nil {
			t.Errorf("partition %d in stream %d: %v", p, p%3, err)
		}
	}
	// A process configured otherwise, or not at all, opens the record as it is.
	for _, streams := range []int{0, 1, 5} {
		other, err := bus.Provision(ctx, b.JS, bus.Config{Streams: streams})
		if err != nil {
			t.Fatal(err)
		}
		if other.Layout().Streams() != 3 || len(other.Streams) != 3 {
			t.Errorf("configured with %d: opened %d streams", streams, other.Layout().Streams())
		}
		if said := strings.Join(other.Drift, "\n"); (streams == 1 || streams == 5) != strings.Contains(said, "kept in 3 streams") {
			t.Errorf("configured with %d, drift: %s", streams, said)
		}
	}
	// Partitions that do not divide among the streams are refused, saying why.
	if _, err := bus.Provision(ctx, b.JS, bus.Config{Partitions: 7}); err == nil || !strings.Contains(err.Error(), "multiple") {
		t.Errorf("7 partitions over 3 streams: %v", err)
	}
	if _, err := b.Repartition(ctx, 8); err == nil || !strings.Contains(err.Error(), "multiple") {
		t.Errorf("Repartition(8) over 3 streams: %v", err)
	}
}

// Two processes creating the record at once with different numbers of streams agree on the one
// that created it.
func TestProcessesCreatingTheRecordAtOnceAgreeOnItsStreams(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := bustest.NewServer(t)
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *bus.Bus, 2)
	errs := make(chan error, 2)
	for _, streams := range []int{1, 4} {
		go func() {
			b, err := bus.Provision(ctx, js, bus.Config{Streams: streams, Partitions: 16})
			errs <- err
			got <- b
		}()
	}
	var layouts []int
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		b := <-got
		layouts = append(layouts, b.Layout().Streams())
		if len(b.Streams) != b.Layout().Streams() {
			t.Errorf("layout of %d streams, %d opened", b.Layout().Streams(), len(b.Streams))
		}
	}
	first, err := js.Stream(ctx, protocol.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	made, err := bus.RecordLayout(first.CachedInfo().Config)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range layouts {
		if n != made.Streams() {
			t.Errorf("the processes use %v streams; the record was made with %d", layouts, made.Streams())
		}
	}
}

// A change of the partitions cut short — the later streams changed, the first not — is put right
// by the next provisioning: the first stream's number is the record's.
func TestAPartitionChangeCutShortIsPutRight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{Streams: 2, Partitions: 8})
	cfg := b.Streams[1].CachedInfo().Config
	src, dest := protocol.RequestTransformIn(1, 4)
	cfg.SubjectTransform = &jetstream.SubjectTransformConfig{Source: src, Destination: dest}
	if _, err := b.JS.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.Provision(ctx, b.JS, bus.Config{OpenOnly: true}); err == nil || !strings.Contains(err.Error(), "other partitions") {
		t.Errorf("opened as it is: %v", err)
	}
	again, err := bus.Provision(ctx, b.JS, bus.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if again.Partitions() != 8 || !strings.Contains(strings.Join(again.Drift, "\n"), "now over its 8") {
		t.Errorf("%d partitions, drift %q", again.Partitions(), again.Drift)
	}
	info, err := again.Streams[1].Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, want := protocol.RequestTransformIn(1, 8); info.Config.SubjectTransform.Destination != want {
		t.Errorf("stream %s's transform %s, want %s", protocol.RecordStream(1), info.Config.SubjectTransform.Destination, want)
	}
}

func TestTheDefaultPartitionsFitTheStreams(t *testing.T) {
	procs := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(procs)
	for _, cores := range []int{1, 2, 5, 32, 64} {
		runtime.GOMAXPROCS(cores)
		for streams := 1; streams <= protocol.MaxRecordStreams; streams++ {
			n := bus.WithDefaults(bus.Config{Streams: streams}).Partitions
			if n < 1 || n > protocol.MaxRequestPartitions || n%streams != 0 {
				t.Errorf("%d cores, %d streams: %d partitions by default", cores, streams, n)
			}
		}
	}
}

func TestInFlightSharesHoldTheBound(t *testing.T) {
	for _, c := range []struct {
		n, streams int
		want       []int
	}{
		{10, 1, []int{10}}, {10, 3, []int{4, 3, 3}}, {3, 3, []int{1, 1, 1}}, {1, 3, []int{1, 1, 1}}, {0, 2, []int{0, 0}}, {-1, 2, []int{-1, -1}},
	} {
		got := bus.InFlightShares(c.n, c.streams)
		if len(got) != len(c.want) {
			t.Fatalf("InFlightShares(%d, %d) = %v", c.n, c.streams, got)
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Errorf("InFlightShares(%d, %d) = %v, want %v", c.n, c.streams, got, c.want)
				break
			}
		}
	}
}

// Restream moves each session whole to the stream that keeps it under the new number, in
// order, and back; the record keeps every message once.
func TestRestreamMovesSessionsWhole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{Partitions: 6})
	const sessions, each = 12, 4
	publish := func(b *bus.Bus, round string) { publishEvents(t, b, round, sessions, each) }
	read := func(b *bus.Bus) map[string][]string { return readSessions(t, b) }
	publish(b, "a")
	want := read(b)
	done, err := b.Restream(ctx, 3)
	if err != nil || done.Sessions == 0 || done.Messages != done.Sessions*(each+1) { // and a summary each
		t.Fatalf("Restream(3) = %+v, %v", done, err)
	}
	b3 := srv.Provision(t, bus.Config{})
	if b3.Layout().Streams() != 3 {
		t.Fatalf("reopened: %d streams", b3.Layout().Streams())
	}
	// Each partition's consumer where its partition is now, and nowhere else.
	for k, s := range b3.Streams {
		for p := range 6 {
			_, err := s.Consumer(ctx, bus.RequestConsumer(p))
			if (err == nil) != (p%3 == k) {
				t.Errorf("partition %d's consumer in stream %d: %v", p, k, err)
			}
		}
	}
	if got := read(b3); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after Restream(3):\n%v\nwant\n%v", got, want)
	}
	publish(b3, "b")
	want = read(b3)
	if done, err := b3.Restream(ctx, 1); err != nil || done.Messages == 0 {
		t.Fatalf("Restream(1) = %+v, %v", done, err)
	}
	b1 := srv.Provision(t, bus.Config{})
	if got := read(b1); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after Restream(1):\n%v\nwant\n%v", got, want)
	}
}

// Restream refuses while anything waits to be handled: a request not yet routed would be
// routed again from its copy, or not at all.
func TestRestreamWaitsForWorkToBeDone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{Partitions: 6})
	publishRequest(t, b, "waiting")
	if _, err := b.Restream(ctx, 2); err == nil || !strings.Contains(err.Error(), "not yet handled") {
		t.Fatalf("Restream with a request waiting: %v", err)
	}
	if _, err := b.Restream(ctx, 4); err == nil || !strings.Contains(err.Error(), "multiple") {
		t.Errorf("Restream(4) over 6 partitions: %v", err)
	}
	routeAll(t, b)
	if done, err := b.Restream(ctx, 2); err != nil || done.After != 2 {
		t.Fatalf("Restream once routed: %+v, %v", done, err)
	}
}

// publishEvents records each events of sessions sessions, and a summary of each (written once,
// with an expected last subject sequence, as summaries are).
func publishEvents(t *testing.T, b *bus.Bus, round string, sessions, each int) {
	t.Helper()
	ctx := context.Background()
	pub := b.NewPublisher(protocol.Sender{Role: "test", Instance: "t"})
	for i := range sessions {
		for j := range each {
			m, err := protocol.NewMessage(protocol.TypeCancel, &protocol.Cancel{By: "t"})
			if err != nil {
				t.Fatal(err)
			}
			m.MsgID, m.RequestID, m.SessionID = fmt.Sprintf("%s-%d-%d", round, i, j), fmt.Sprintf("r%s%d%d", round, i, j), fmt.Sprintf("s%d", i)
			if _, err := pub.Publish(ctx, protocol.SubjectEvent(protocol.EventCancel, m.SessionID), m); err != nil {
				t.Fatal(err)
			}
		}
		m, _ := protocol.NewMessage(protocol.TypeCancel, &protocol.Cancel{By: "t"})
		m.MsgID, m.RequestID, m.SessionID = fmt.Sprintf("%s-%d-sum", round, i), fmt.Sprintf("r%s%dsum", round, i), fmt.Sprintf("s%d", i)
		data, err := protocol.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		subject := b.Layout().SubjectEvent(protocol.EventSummary, m.SessionID)
		last, err := b.StreamOf(m.SessionID).GetLastMsgForSubject(ctx, subject)
		seq := uint64(0)
		if err == nil {
			seq = last.Sequence
		}
		msg := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{jetstream.MsgIDHeader: {m.MsgID}, jetstream.ExpectedLastSubjSeqHeader: {fmt.Sprint(seq)}}}
		if _, err := b.JS.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
}

// readSessions returns every session's request ids, in the order its stream holds them,
// checking that each is in the stream that keeps its session.
func readSessions(t *testing.T, b *bus.Bus) map[string][]string {
	t.Helper()
	ctx := context.Background()
	out := map[string][]string{}
	for k, s := range b.Streams {
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
			raw, err := s.GetMsg(ctx, seq)
			if err != nil {
				continue
			}
			m, err := protocol.Unmarshal(raw.Data)
			if err != nil {
				t.Fatal(err)
			}
			if b.Layout().StreamOf(m.SessionID) != k {
				t.Errorf("stream %d holds %s of session %s (of stream %d)", k, raw.Subject, m.SessionID, b.Layout().StreamOf(m.SessionID))
			}
			out[m.SessionID] = append(out[m.SessionID], m.RequestID)
		}
	}
	return out
}

// A change of the record's streams cut short — while it copies, and once it switched — is
// finished by the next run: every message once, in order, each session in its stream; the
// streams added have the record's settings, and the record's limits are shared.
func TestARestreamCutShortIsFinished(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{Partitions: 6, MaxAge: 720 * time.Hour, MaxMsgs: 300})
	publishEvents(t, b, "a", 12, 4)
	publishEvents(t, b, "b", 12, 1) // a second summary of each: written on the first
	want := fmt.Sprint(readSessions(t, b))
	cut := errors.New("cut short")
	copies := 0
	bus.OnRestreamStep(b, func(step string) error {
		if step == "copied" {
			if copies++; copies == 7 {
				return cut
			}
		}
		if step == "switched" && copies < 1000 {
			copies = 1000
			return cut
		}
		return nil
	})
	for run := range 2 {
		if _, err := b.Restream(ctx, 3); !errors.Is(err, cut) {
			t.Fatalf("run %d: %v, want it cut short", run, err)
		}
		if p, err := b.Restreaming(ctx); err != nil || p == nil || p.Before != 1 || p.After != 3 {
			t.Fatalf("run %d: under way %+v, %v", run, p, err)
		}
		if _, err := b.Restream(ctx, 2); err == nil || !strings.Contains(err.Error(), "unfinished") {
			t.Fatalf("another change while one is unfinished: %v", err)
		}
		reopened := srv.Provision(t, bus.Config{})
		if !strings.Contains(strings.Join(reopened.Drift, "\n"), "unfinished") {
			t.Errorf("run %d: opening the record says nothing of the change under way: %q", run, reopened.Drift)
		}
	}
	if _, err := b.Restream(ctx, 3); err != nil {
		t.Fatal(err)
	}
	b3 := srv.Provision(t, bus.Config{})
	if p, _ := b3.Restreaming(ctx); p != nil || b3.Layout().Streams() != 3 {
		t.Fatalf("%d streams, under way %+v", b3.Layout().Streams(), p)
	}
	if got := fmt.Sprint(readSessions(t, b3)); got != want {
		t.Fatalf("after the change:\n%s\nwant\n%s", got, want)
	}
	var msgs int64
	for _, s := range b3.Streams {
		cfg := s.CachedInfo().Config
		if cfg.MaxAge != 720*time.Hour {
			t.Errorf("stream %s keeps messages %s, the record %s", cfg.Name, cfg.MaxAge, 720*time.Hour)
		}
		msgs += cfg.MaxMsgs
	}
	if msgs < 300 || msgs > 330 {
		t.Errorf("the streams keep %d messages together; the record kept 300", msgs)
	}
	// And back to one, its message limit tight.
	if _, err := b3.Restream(ctx, 1); err != nil {
		t.Fatal(err)
	}
	b1 := srv.Provision(t, bus.Config{})
	if got := fmt.Sprint(readSessions(t, b1)); got != want || len(b1.Streams) != 1 {
		t.Fatalf("back to one stream (%d):\n%s\nwant\n%s", len(b1.Streams), got, want)
	}
}

// Something that writes to the record during a change (a service left running) is found
// before the switch: the run stops, nothing is lost, and the next run copies what was written.
func TestARestreamFindsWritesDuringIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{Partitions: 6})
	publishEvents(t, b, "a", 12, 3)
	wrote := false
	bus.OnRestreamStep(b, func(step string) error {
		if step == "copied" && !wrote {
			wrote = true
			publishEvents(t, b, "late", 12, 1) // b: the layout of one stream
		}
		return nil
	})
	if _, err := b.Restream(ctx, 3); err == nil || !strings.Contains(err.Error(), "written during the change") {
		t.Fatalf("a write during the change: %v", err)
	}
	want := fmt.Sprint(readSessions(t, b))
	if _, err := b.Restream(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(readSessions(t, srv.Provision(t, bus.Config{}))); got != want {
		t.Fatalf("after the change:\n%s\nwant\n%s", got, want)
	}
}

// A write with the old layout after the change switched (a process that opened the record
// before) is copied to its session's new stream, after the session's copies: nothing is lost,
// and the change finishes.
func TestARestreamCopiesWhatComesAfterTheSwitch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{Partitions: 6})
	publishEvents(t, b, "a", 12, 2)
	bus.OnRestreamStep(b, func(step string) error {
		if step == "switched" {
			publishEvents(t, b, "late", 12, 1) // b: the layout of one stream
		}
		return nil
	})
	if _, err := b.Restream(ctx, 3); err != nil {
		t.Fatal(err)
	}
	all := map[string][]string{}
	for i := range 12 {
		all[fmt.Sprintf("s%d", i)] = []string{fmt.Sprintf("ra%d0", i), fmt.Sprintf("ra%d1", i), fmt.Sprintf("ra%dsum", i), fmt.Sprintf("rlate%d0", i), fmt.Sprintf("rlate%dsum", i)}
	}
	want := fmt.Sprint(all)
	b3 := srv.Provision(t, bus.Config{})
	if p, _ := b3.Restreaming(ctx); p != nil {
		t.Fatalf("the change is not over: %+v", p)
	}
	if got := fmt.Sprint(readSessions(t, b3)); got != want {
		t.Fatalf("after the change:\n%s\nwant\n%s", got, want)
	}
}

// A message of a stream the record does not have (one a change of its streams deleted, named
// by an advisory from before) is gone, not an error to try again.
func TestRecordAtAStreamTheRecordHasNot(t *testing.T) {
	t.Parallel()
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{})
	for _, stream := range []string{protocol.RecordStream(2), protocol.DLQStreamName} {
		if _, err := b.RecordAt(context.Background(), stream, 1); !errors.Is(err, bus.ErrNotFound) {
			t.Errorf("RecordAt(%s): %v, want ErrNotFound", stream, err)
		}
	}
}
