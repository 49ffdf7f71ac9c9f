package integration

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/demotools"
	"github.com/hermesbus/hermes/internal/gateway"
	"github.com/hermesbus/hermes/internal/metrics"
	"github.com/hermesbus/hermes/internal/router"
	"github.com/hermesbus/hermes/internal/routes"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/worker"
)

// options shape a test system.
type options struct {
	routesFile string            // default testdata/routes.yaml
	routers    int               // default 1; -1 for none
	workers    int               // default 1; may be 0
	allowEnv   []string          // for every worker
	resolve    map[string]string // added to every worker's resolve map
	demoHosts  []string          // host:port names every worker dials at the demo tools
	bus        bus.Config        // stream, bucket and consumer settings
	logger     *slog.Logger      // for every service; nil discards
	metrics    *metrics.Metrics  // shared by every service; nil: each its own, unexported
	natsURL    string            // an external server; default: an embedded one
	limits     protocol.Limits   // of routers and dead-letter processors
	callers    bool              // the gateway asks every caller for an API key
	oidc       auth.OIDCConfig   // with callers: the issuer whose tokens it takes too
	seal       *router.SealKey   // routers seal every call with it; workers run only sealed calls
	// with seal, every service seals the results it records with it, and a result counts only
	// when a key of seal's, or of resultKeys for its tool, sealed it
	resultKeys protocol.ResultKeys
	// users are more NATS users of the test's server (worker users of some tools only)
	users []bus.User
	// chat, when set, serves the chat doors on every gateway (with the model it names)
	chat *app.ChatConfig
	// callerLimits bound each caller at every gateway (with callers)
	callerLimits admission.CallerLimits
	// listenHost is where the test's own servers (demo tools, recorder, gateways) listen;
	// default 127.0.0.1 (the partition test's services in other network namespaces reach
	// them at its bridge's address)
	listenHost string
}

// system is Hermes running in-process: embedded NATS, demo tools, routers (each with a
// dead-letter processor beside it, as the router binary runs one), workers, a gateway. Every
// service is built by the same constructors hermes up and the binaries use (package app).
type system struct {
	t        *testing.T
	srv      *bustest.Server
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	table    *routes.Table
	opts     options
	resolve  map[string]string
	base     string // gateway base URL
	js       jetstream.JetStream
	admin    *bus.Bus // the system's own connection, as admin
	routers  []*app.RouterService
	workers  []*worker.Worker
	demoAddr string
	conns    []*nats.Conn
	recorder *recorder
	gwStop   func()
	gateway  *app.GatewayService // the last started
	poisoned string              // a session whose undecodable messages the test published on purpose
	// violating: the test tried what a user may not do, on purpose
	violating bool
}

func start(t *testing.T, opts options) *system {
	t.Helper()
	if opts.routesFile == "" {
		opts.routesFile = "testdata/routes.yaml"
	}
	if opts.routers == 0 {
		opts.routers = 1
	}
	s := &system{t: t, opts: opts}
	if opts.natsURL != "" {
		s.srv = &bustest.Server{URL: opts.natsURL, Plain: opts.natsURL}
	} else {
		// Every service runs as its own NATS user, with only its role's permissions, as in
		// hermes up and deploy/: a permission the table lacks fails the test that needed it.
		s.srv = bustest.NewLocked(t, bustest.Locked{Users: opts.users, Buckets: app.Buckets(opts.bus)})
		t.Cleanup(func() {
			if v := s.srv.Violations(); len(v) > 0 && !s.violating {
				t.Errorf("the NATS server refused what a service did (the permission table lacks it):\n%s", strings.Join(v, "\n"))
			}
		})
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	t.Cleanup(s.stop)
	table, err := routes.Load(opts.routesFile)
	if err != nil {
		t.Fatal(err)
	}
	s.table = table

	demo := s.listen()
	s.demoAddr = demo.Addr().String()
	s.goRun(func(ctx context.Context) error { return demotools.Serve(ctx, demo, nil) })
	s.resolve = map[string]string{"127.0.0.1:8081": s.demoAddr}
	for k, v := range opts.resolve {
		s.resolve[k] = v
	}
	for _, h := range opts.demoHosts {
		s.resolve[h] = s.demoAddr
	}
	s.recorder = newRecorderOn(t, s.listen())
	if _, set := s.resolve["127.0.0.1:8082"]; !set {
		s.resolve["127.0.0.1:8082"] = s.recorder.addr
	}

	_, b := s.connect()
	s.js, s.admin = b.JS, b
	for _, name := range table.ToolNames() { // as a router would before its first dispatch
		for _, kind := range table.KindsOf(name) {
			if _, err := b.EnsureToolConsumer(context.Background(), kind, name); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range max(opts.routers, 0) {
		s.addRouter(fmt.Sprintf("router-%d", i+1))
	}
	for i := range opts.workers {
		s.addWorker(fmt.Sprintf("worker-%d", i+1))
	}
	if opts.natsURL == "" {
		s.addEraser()
	}
	s.startGateway("gateway-1")
	return s
}

// addEraser starts an eraser, as hermes up runs one.
func (s *system) addEraser() {
	s.t.Helper()
	_, b := s.connectAs(bus.RoleEraser)
	e, err := app.NewEraser(b, s.opts.logger)
	if err != nil {
		s.t.Fatal(err)
	}
	e.Retry = 200 * time.Millisecond
	s.goRun(e.Run)
}

// startGateway starts a gateway on a new port and points s.base at it.
func (s *system) startGateway(instance string) {
	s.t.Helper()
	s.base, s.gwStop = s.newGateway(instance)
	s.waitReady()
}

// newGateway starts one more gateway on a new port, and returns its base URL and its stop.
func (s *system) newGateway(instance string) (base string, stop func()) {
	s.t.Helper()
	nc, gb := s.connectAs(bus.RoleGateway)
	gc := gateway.Config{Instance: instance, MaxBodyBytes: 64 << 10, Metrics: s.opts.metrics, Logger: s.opts.logger, StoreCheckEvery: 50 * time.Millisecond,
		CallerLimits: s.opts.callerLimits}
	if s.opts.callers {
		callers, err := app.CallerVerifier(gb, s.opts.oidc)
		if err != nil {
			s.t.Fatal(err)
		}
		gc.Callers, gc.Signins = callers, app.NewSignins(gb)
	}
	g, err := app.NewGateway(nc, gb, gc, s.opts.chat)
	if err != nil {
		s.t.Fatal(err)
	}
	s.gateway = g
	gl := s.listen()
	ctx, cancel := context.WithCancel(s.ctx)
	done := make(chan struct{})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(done)
		if err := g.Run(ctx, gl); err != nil && ctx.Err() == nil {
			s.t.Errorf("gateway stopped: %v", err)
		}
	}()
	return "http://" + gl.Addr().String(), func() { cancel(); <-done }
}

// restartGateway stops the gateway and starts a new one (new instance, new port).
func (s *system) restartGateway(instance string) {
	s.t.Helper()
	s.gwStop()
	s.startGateway(instance)
}

func (s *system) listen() net.Listener {
	s.t.Helper()
	host := s.opts.listenHost
	if host == "" {
		host = "127.0.0.1"
	}
	ln, err := net.Listen("tcp", host+":0")
	if err != nil {
		s.t.Fatal(err)
	}
	return ln
}

func (s *system) goRun(run func(context.Context) error) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := run(s.ctx); err != nil && s.ctx.Err() == nil {
			s.t.Errorf("service stopped: %v", err)
		}
	}()
}

// addRouter starts a router, and a dead-letter processor beside it (as the router binary
// does by default).
func (s *system) addRouter(instance string) *app.RouterService {
	s.t.Helper()
	return s.addRouterWith(app.RouterConfig{Instance: instance})
}

// addRouterWith is addRouter configured by cfg, with the system's routes, limits, metrics, seal
// and logger.
func (s *system) addRouterWith(cfg app.RouterConfig) *app.RouterService {
	s.t.Helper()
	instance := cfg.Instance
	_, b := s.connectAs(bus.RoleRouter)
	cfg.Routes, cfg.Limits, cfg.Metrics, cfg.Seal, cfg.Logger = s.table, s.opts.limits, s.opts.metrics, s.opts.seal, s.opts.logger
	r, err := app.NewRouter(b, cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	s.routers = append(s.routers, r)
	s.goRun(r.Run)
	s.addDeadLetters(instance)
	return r
}

// addDeadLetters starts a dead-letter processor.
func (s *system) addDeadLetters(instance string) {
	s.t.Helper()
	_, db := s.connectAs(bus.RoleRouter) // a connection of its own, as in hermes up
	d, err := app.NewDeadLetters(db, instance, s.opts.limits, s.opts.metrics, s.opts.logger)
	if err != nil {
		s.t.Fatal(err)
	}
	s.goRun(d.Run)
}

func (s *system) addWorker(instance string) *worker.Worker {
	s.t.Helper()
	return s.addWorkerWith(app.WorkerConfig{Instance: instance})
}

// addWorkerWith starts a worker configured by cfg plus the system's env allow-list and resolve map.
func (s *system) addWorkerWith(cfg app.WorkerConfig) *worker.Worker {
	s.t.Helper()
	return s.addWorkerAs(string(bus.RoleWorker), cfg)
}

// addWorkerAs is addWorkerWith connected as the NATS user named user (a tool worker's).
func (s *system) addWorkerAs(user string, cfg app.WorkerConfig) *worker.Worker {
	s.t.Helper()
	_, b := s.connectAsUser(user)
	cfg.AllowEnv, cfg.Resolve = s.opts.allowEnv, s.resolve
	if k := s.opts.seal; k != nil && cfg.TrustedSeals == nil {
		cfg.TrustedSeals = map[string]ed25519.PublicKey{k.ID: k.Key.Public().(ed25519.PublicKey)}
	}
	if cfg.Metrics == nil {
		cfg.Metrics = s.opts.metrics
	}
	if cfg.Logger == nil {
		cfg.Logger = s.opts.logger
	}
	w, err := app.NewWorker(b, cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	s.workers = append(s.workers, w.Worker)
	s.goRun(w.Run)
	return w.Worker
}

// connect opens a connection of the system's own as admin, as hermes provision and the
// command line do (app.Connect), closed by stop after every service ended.
func (s *system) connect() (*nats.Conn, *bus.Bus) {
	s.t.Helper()
	return s.connectAs(bus.RoleAdmin)
}

// connectAs opens a connection as role's NATS user, as a service of that role does (on a
// server of the test's own; one given by natsURL has no users), closed by stop after every
// service ended. Services run without provisioning: the system's own connection did.
func (s *system) connectAs(role bus.Role) (*nats.Conn, *bus.Bus) {
	s.t.Helper()
	return s.connectAsUser(string(role))
}

// connectAsUser is connectAs for the NATS user named user (a role's is named for it).
func (s *system) connectAsUser(user string) (*nats.Conn, *bus.Bus) {
	s.t.Helper()
	admin := user == string(bus.RoleAdmin)
	url, cfg, opts := s.srv.URL, s.opts.bus, []nats.Option(nil)
	if !admin {
		url, opts = s.srv.Plain, s.srv.AsUser(s.t, user)
		cfg.NoProvision = true
	}
	nc, b, err := app.Connect(context.Background(), url, "hermes-it-"+user, cfg, s.opts.logger, opts...)
	if err != nil {
		s.t.Fatal(err)
	}
	if k := s.opts.seal; k != nil && !admin {
		keys := protocol.ResultKeys{k.ID: {Key: k.Key.Public().(ed25519.PublicKey)}}
		maps.Copy(keys, s.opts.resultKeys)
		b.SealResults(k.ID, k.Key)
		b.TrustResults(keys)
	}
	s.conns = append(s.conns, nc)
	return nc, b
}

func (s *system) stop() {
	s.cancel()
	s.wg.Wait()
	for _, nc := range s.conns {
		nc.Close()
	}
}

func (s *system) waitReady() {
	s.t.Helper()
	waitFor(s.t, "gateway ready", func() bool {
		resp, err := http.Get(s.base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// post sends body to POST /v1/route (query appended) and returns status, headers and body.
func (s *system) post(body any, query string, header ...string) (int, http.Header, []byte) {
	s.t.Helper()
	var data []byte
	switch b := body.(type) {
	case []byte:
		data = b
	case string:
		data = []byte(b)
	default:
		var err error
		if data, err = json.Marshal(b); err != nil {
			s.t.Fatal(err)
		}
	}
	req, _ := http.NewRequest(http.MethodPost, s.base+"/v1/route"+query, bytes.NewReader(data))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, out
}

// route posts req and requires a 200 HermesResponse.
func (s *system) route(req any) *protocol.Response {
	s.t.Helper()
	status, _, body := s.post(req, "")
	if status != http.StatusOK {
		s.t.Fatalf("POST /v1/route: HTTP %d: %s", status, body)
	}
	return decodeResponse(s.t, body)
}

func decodeResponse(t *testing.T, body []byte) *protocol.Response {
	t.Helper()
	var r protocol.Response
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatalf("response is not a HermesResponse: %v: %s", err, body)
	}
	return &r
}

// storedRequest is the subject the record stores session's requests under.
func (s *system) storedRequest(session string) string { return s.admin.StoredSubjectRequest(session) }

// partitionOf is the request partition of session.
func (s *system) partitionOf(session string) int {
	return protocol.RequestPartition(session, s.admin.Partitions())
}

// stored returns every message stored in the record: each stream's in order, stream after
// stream (each session's messages are in one).
func (s *system) stored() []*jetstream.RawStreamMsg {
	var out []*jetstream.RawStreamMsg
	for k := range s.admin.Layout().Streams() {
		out = append(out, s.storedIn(protocol.RecordStream(k))...)
	}
	return out
}

// deadLetters returns the dead letters, in order.
func (s *system) deadLetters() []*jetstream.RawStreamMsg {
	var out []*jetstream.RawStreamMsg
	for _, m := range s.storedIn(protocol.DLQStreamName) {
		if strings.HasPrefix(m.Subject, "hermes.dlq.") {
			out = append(out, m)
		}
	}
	return out
}

func (s *system) storedIn(name string) []*jetstream.RawStreamMsg {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := s.js.Stream(ctx, name)
	if err != nil {
		s.t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		// Each read has a deadline of its own: a long record read on a busy machine must not
		// run out of time part-way and look shorter than it is.
		get, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		raw, err := stream.GetMsg(get, seq)
		cancel()
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // deleted
		}
		if err != nil {
			s.t.Fatalf("read %s message %d: %v", name, seq, err)
		}
		out = append(out, raw)
	}
	return out
}

// record decodes the whole stream in order.
func (s *system) record() []*protocol.Message {
	s.t.Helper()
	var out []*protocol.Message
	for _, raw := range s.stored() {
		m, err := protocol.Unmarshal(raw.Data)
		if err != nil {
			if s.poisoned != "" && strings.HasSuffix(raw.Subject, "."+s.poisoned) {
				continue // published as poison on purpose
			}
			s.t.Fatalf("undecodable message %d on %s: %v", raw.Sequence, raw.Subject, err)
		}
		out = append(out, m)
	}
	return out
}

// rawRecord returns every stored message's subject, headers and data as one byte slice.
func (s *system) rawRecord() []byte {
	s.t.Helper()
	var buf bytes.Buffer
	for _, raw := range s.stored() {
		buf.WriteString(raw.Subject)
		for k, v := range raw.Header {
			buf.WriteString(k + ":" + strings.Join(v, ",") + "\n")
		}
		buf.Write(raw.Data)
	}
	return buf.Bytes()
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitForWithin(t, what, 20*time.Second, cond)
}

// waitForWithin is waitFor with its own deadline.
func waitForWithin(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// result returns the result of callID, failing the test if absent.
func result(t *testing.T, r *protocol.Response, callID string) protocol.ToolResult {
	t.Helper()
	for _, res := range r.Results {
		if res.ToolCallID == callID {
			return res
		}
	}
	t.Fatalf("no result for %s in %+v", callID, r)
	return protocol.ToolResult{}
}

// call builds a tool call with arguments given as a Go value.
func call(id, name string, args any) map[string]any {
	return map[string]any{"tool_call_id": id, "name": name, "arguments": args}
}

func request(id, intent string, calls ...map[string]any) map[string]any {
	return map[string]any{"request_id": id, "intent": intent, "tool_calls": calls}
}

// seedPath names a file of ../shared/seed-examples (beside the repository), falling back to
// the byte-for-byte copy in testdata when shared/ is not there.
func seedPath(name string) string {
	p := "../../../shared/seed-examples/" + name
	if _, err := os.Stat(p); err == nil {
		return p
	}
	return "testdata/seed-examples/" + name
}

// long marks a test that go test -short skips even when -run names it (under -short without
// -run only the smoke tests run; see TestMain): the cluster, nemesis, NATS-restart, load, soak,
// browser and other-language (Node, the nats CLI) suites are left to the full run (.ci/run).
func long(t *testing.T, what string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("%s: skipped under -short", what)
	}
}
