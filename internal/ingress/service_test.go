package ingress

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/hermesbus/hermes/internal/submit"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// waitingSubmitter holds every submission until its context ends.
type waitingSubmitter struct{ held atomic.Int32 }

func (w *waitingSubmitter) Submit(ctx context.Context, _ submit.Submission) (*submit.Outcome, error) {
	w.held.Add(1)
	<-ctx.Done()
	return nil, ctx.Err()
}

// One client holds at most MaxPerClient calls (the next is 429); a stopping service takes no
// new call, and answers those it holds 503 once Grace has passed, before Run returns.
func TestTheServiceBoundsEachClientAndStopsInTime(t *testing.T) {
	t.Parallel()
	srv := bustest.NewServer(t)
	nc, err := nats.Connect(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub := &waitingSubmitter{}
	s := &Service{Conn: nc, Submit: sub, Admit: &fakeAdmitter{}, MaxPerClient: 2, Grace: 300 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- s.Run(ctx) }()
	client, err := nats.Connect(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	subject := protocol.SubjectClientService("crm", protocol.EndpointRequest)
	body := func(id string) []byte {
		return []byte(`{"request_id":"` + id + `","tool_calls":[{"tool_call_id":"c1","name":"echo","arguments":{}}]}`)
	}
	deadline := time.Now().Add(5 * time.Second)
	for { // the service is up once it answers
		if m, err := client.Request(subject, []byte("{"), time.Second); err == nil && m.Header.Get(micro.ErrorCodeHeader) == "400" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the service never answered")
		}
	}
	answers := make(chan *nats.Msg, 2)
	for _, id := range []string{"r1", "r2"} {
		go func() {
			m, err := client.Request(subject, body(id), 10*time.Second)
			if err != nil {
				t.Error(err)
			}
			answers <- m
		}()
	}
	for sub.held.Load() < 2 {
		time.Sleep(5 * time.Millisecond)
	}
	m, err := client.Request(subject, body("r3"), 5*time.Second)
	if err != nil || m.Header.Get(micro.ErrorCodeHeader) != "429" {
		t.Fatalf("a third call: %v %v %s", err, m.Header, m.Data)
	}
	stopped := time.Now()
	cancel()
	for range 2 {
		select {
		case m := <-answers:
			if m == nil || m.Header.Get(micro.ErrorCodeHeader) != "503" {
				t.Fatalf("a held call at the stop: %+v", m)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a held call was never answered")
		}
	}
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	if d := time.Since(stopped); d < 300*time.Millisecond {
		t.Fatalf("stopped after %v, before its grace", d)
	}
}
