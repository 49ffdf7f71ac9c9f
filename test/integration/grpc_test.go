package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/hermesbus/hermes/examples"
	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/demotools"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// grpcRoutes routes the seed's tool to customer.ProfileService three ways: by reflection, by a
// descriptor set (at a server without reflection), and as the seed writes it, without a target.
const grpcRoutes = `version: 1.0
rules:
  - name: profile_reflection
    match: {tool_name: get_customer_profile}
    action:
      grpc:
        service: customer.ProfileService
        method: GetProfile
        target: profile-service:50051
        timeout_ms: 3000
        retry: {max_attempts: 3, backoff_factor: 1, initial_interval_ms: 100, max_interval_ms: 100}
  - name: profile_descriptors
    match: {tool_name: profile_plain}
    action:
      grpc:
        service: customer.ProfileService
        method: GetProfile
        target: profile-plain:50051
        descriptor_set: profile.pb
        timeout_ms: 3000
  - name: profile_unreflected
    match: {tool_name: profile_unreflected}
    action:
      grpc: {service: customer.ProfileService, method: GetProfile, target: profile-plain:50051, timeout_ms: 3000}
  - name: customer_profile_fetch
    match: {tool_name: profile_seed}
    action:
      grpc: {service: customer.ProfileService, method: GetProfile, timeout_ms: 3000}
`

// profileServer serves customer.ProfileService on addr ("" for a free port) until the test
// ends; hold, when set, runs before each call.
func profileServer(t *testing.T, addr string, reflect bool, hold func(ctx context.Context)) (*grpc.Server, string) {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var (
		ln  net.Listener
		err error
	)
	for range 100 { // a restarted server may find its port not yet free
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	var opts []grpc.ServerOption
	if hold != nil {
		opts = append(opts, grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			hold(ctx)
			return h(ctx, req)
		}))
	}
	s := demotools.NewProfileServer(reflect, opts...)
	go s.Serve(ln)
	t.Cleanup(s.Stop)
	return s, ln.Addr().String()
}

// The seed's gRPC tool through the whole system: found by reflection, or by a descriptor set
// the route names; without either, or without a target, the call says what is missing; 64-bit
// integers come back exact; every call is on the record.
func TestGRPCToolsThroughHermes(t *testing.T) {
	t.Parallel()
	_, withReflection := profileServer(t, "", true, nil)
	_, plain := profileServer(t, "", false, nil)
	dir := t.TempDir()
	routesFile := filepath.Join(dir, "routes.yaml")
	if err := os.WriteFile(routesFile, []byte(grpcRoutes), 0o600); err != nil {
		t.Fatal(err)
	}
	descriptors := t.TempDir()
	fd, err := demotools.ProfileFiles.FindFileByPath("customer/profile.proto")
	if err != nil {
		t.Fatal(err)
	}
	set, _ := proto.Marshal(&descriptorpb.FileDescriptorSet{File: []*descriptorpb.FileDescriptorProto{protodesc.ToFileDescriptorProto(fd)}})
	if err := os.WriteFile(filepath.Join(descriptors, "profile.pb"), set, 0o600); err != nil {
		t.Fatal(err)
	}
	s := start(t, options{routesFile: routesFile,
		resolve: map[string]string{"profile-service:50051": withReflection, "profile-plain:50051": plain}})
	s.addWorkerWith(app.WorkerConfig{Instance: "grpc-worker", GRPCDescriptors: descriptors})

	resp := s.route(request("grpc_1", "查询客户C102938的信息",
		call("reflected", "get_customer_profile", map[string]any{"customer_id": "C102938"}),
		call("described", "profile_plain", map[string]any{"customer_id": "C102938"}),
		call("missing", "get_customer_profile", map[string]any{"customer_id": "C000000"}),
		call("refused", "profile_plain", map[string]any{"customer_id": "bob"}),
		call("unreflected", "profile_unreflected", map[string]any{"customer_id": "C102938"}),
		call("seed", "profile_seed", map[string]any{"customer_id": "C102938"}),
		call("unknown_field", "get_customer_profile", map[string]any{"customer_id": "C102938", "nickname": "x"}),
	))
	reflected, described := result(t, resp, "reflected"), result(t, resp, "described")
	for _, r := range []protocol.ToolResult{reflected, described} {
		if r.Status != protocol.ResultOK || r.Attempts != 1 {
			t.Fatalf("%s: %s %s %s", r.ToolCallID, r.Status, r.ErrorCode, r.RecoveryHint)
		}
	}
	var profile map[string]any
	dec := json.NewDecoder(strings.NewReader(string(reflected.Content)))
	dec.UseNumber()
	if err := dec.Decode(&profile); err != nil || profile["customer_id"] != "C102938" || profile["name"] == "" {
		t.Fatalf("profile %s: %v", reflected.Content, err)
	}
	if _, ok := profile["points"].(string); !ok {
		t.Errorf("points %v: an int64 is a string of digits in the JSON mapping", profile["points"])
	}
	if string(described.Content) != string(reflected.Content) {
		t.Errorf("by descriptor set %s, by reflection %s", described.Content, reflected.Content)
	}
	for id, want := range map[string]struct {
		code, toolCode, says string
		attempts             int
	}{
		"missing":       {protocol.CodeToolGRPCStatus, "NOT_FOUND", "no customer C000000", 1},
		"refused":       {protocol.CodeToolGRPCStatus, "INVALID_ARGUMENT", "C followed by 6 digits", 1},
		"unreflected":   {protocol.CodeGRPCMethodUnknown, "", "descriptor_set", 1},
		"seed":          {protocol.CodeRouteIncomplete, "", "action.grpc.target", 1},
		"unknown_field": {protocol.CodeBadArguments, "", "nickname", 1},
	} {
		r := result(t, resp, id)
		if r.Status != protocol.ResultError || r.ErrorCode != want.code || r.ToolErrorCode != want.toolCode || r.Attempts != want.attempts ||
			!strings.Contains(r.RecoveryHint+string(r.Content), want.says) {
			t.Errorf("%s: %s %s/%s attempts %d: %s %s; want %s/%s, %d, saying %q", id, r.Status, r.ErrorCode, r.ToolErrorCode,
				r.Attempts, r.RecoveryHint, r.Content, want.code, want.toolCode, want.attempts, want.says)
		}
	}
	if n := s.countRecorded("grpc_1", protocol.TypeToolResult); n != 7 {
		t.Errorf("%d tool results on the record, want 7", n)
	}
}

// A gRPC server killed while it runs a call: the try fails as unreachable, the worker tries
// again, and the server, back on its address, answers.
func TestAGRPCServerKilledMidCall(t *testing.T) {
	variant(t, "pkg/worker/grpcexec's TestServerKilledMidCall (the try fails as unreachable, the next one reaches the server back); TestGRPCToolsThroughHermes end to end")
	t.Parallel()
	var calls atomic.Int32
	started := make(chan struct{})
	first, addr := profileServer(t, "", true, func(ctx context.Context) {
		if calls.Add(1) == 1 {
			close(started)
			<-ctx.Done() // held until the server is killed
		}
	})
	dir := t.TempDir()
	routesFile := filepath.Join(dir, "routes.yaml")
	if err := os.WriteFile(routesFile, []byte(grpcRoutes), 0o600); err != nil {
		t.Fatal(err)
	}
	s := start(t, options{routesFile: routesFile, resolve: map[string]string{"profile-service:50051": addr}, workers: 1})
	go func() {
		<-started
		first.Stop()
		for range 100 { // its port may not be free at once
			if ln, err := net.Listen("tcp", addr); err == nil {
				back := demotools.NewProfileServer(true)
				go back.Serve(ln)
				t.Cleanup(back.Stop)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Error("the server could not listen on its address again")
	}()
	resp := s.route(request("grpc_kill", "", call("c1", "get_customer_profile", map[string]any{"customer_id": "C102938"})))
	r := result(t, resp, "c1")
	if r.Status != protocol.ResultOK || r.Attempts < 2 {
		t.Fatalf("%s %s attempts %d: %s %s", r.Status, r.ErrorCode, r.Attempts, r.RecoveryHint, r.Content)
	}
	if !strings.Contains(string(r.Content), `"customer_id":"C102938"`) {
		t.Errorf("content %s", r.Content)
	}
}

// hermes up serves the seed's gRPC tool: its contract, registered through the gateway, is tried
// by the sandbox over gRPC and passes; the example request reaches it by the seed's rule.
func TestUpServesTheSeedGRPCTool(t *testing.T) {
	variant(t, "TestGRPCToolsThroughHermes (the seed's gRPC tool through the whole system) and TestUpServesTheGoMeetingTools (hermes up registering contracts through its gateway, each tried by the sandbox)")
	sys, _ := startUp(t, "grpc-up-it")
	if sys.DemoGRPC == "" {
		t.Fatal("no demo gRPC service")
	}
	post := func(path, contentType, body string) (int, []byte) {
		req, _ := http.NewRequest("POST", sys.GatewayURL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", contentType)
		req.Header.Set("Authorization", "Bearer "+sys.Key.Key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	contract, _ := examples.Files.ReadFile("contracts/get_customer_profile.yaml")
	code, body := post("/api/v1/tools", "application/yaml", string(contract))
	if code != http.StatusCreated && code != http.StatusOK || !strings.Contains(string(body), `"verdict":"passed"`) {
		t.Fatalf("registering get_customer_profile: HTTP %d %s", code, body)
	}
	// The routers learn of the contract by watching the registry: a probe shows when they have.
	waitFor(t, "the contract in use", func() bool {
		_, probe := post("/v1/route", "application/json", fmt.Sprintf(
			`{"request_id":"probe_%d","intent":"x","tool_calls":[{"tool_call_id":"c","name":"get_customer_profile","arguments":{"customer_id":"bob"}}]}`, time.Now().UnixNano()))
		var r protocol.Response
		return json.Unmarshal(probe, &r) == nil && len(r.Results) == 1 && r.Results[0].ContractVersion == 1
	})
	req, _ := examples.Files.ReadFile("request-get_customer_profile.json")
	code, body = post("/v1/route", "application/json", string(req))
	if code != http.StatusOK {
		t.Fatalf("HTTP %d %s", code, body)
	}
	r := result(t, decodeResponse(t, body), "call_profile_1")
	if r.Status != protocol.ResultOK || r.Route != "customer_profile_fetch" || r.ContractVersion != 1 ||
		!strings.HasPrefix(string(r.Content), `{"success":{"customer_id":"C102938",`) {
		t.Fatalf("%+v %s", r, r.Content)
	}
}
