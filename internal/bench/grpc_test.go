package bench_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/bench"
	"github.com/hermesbus/hermes/internal/demotools"
	"github.com/hermesbus/hermes/pkg/protocol"
	"github.com/hermesbus/hermes/pkg/worker"
	"github.com/hermesbus/hermes/pkg/worker/grpcexec"
)

// The demo's customer.ProfileService/GetProfile (the seed's gRPC tool), called directly by a
// gRPC client, by the grpc executor alone (JSON in, JSON out), and through Hermes' /v1/route
// by the seed's rule — one call at a time: what Hermes adds to a gRPC call, with every call
// durable and recorded.

const profileArgs = `{"customer_id":"C102938"}`

func startGRPCSystem(b *testing.B) *app.System {
	b.Helper()
	return runSystem(b, app.SystemConfig{Instance: "bench-grpc", DemoGRPCAddr: "127.0.0.1:0", Worker: app.WorkerConfig{Concurrency: 64}},
		demotools.ProfileTool, profileArgs)
}

func profileMethod(b *testing.B) protoreflect.MethodDescriptor {
	d, err := demotools.ProfileFiles.FindDescriptorByName(demotools.ProfileService + ".GetProfile")
	if err != nil {
		b.Fatal(err)
	}
	return d.(protoreflect.MethodDescriptor)
}

// A client with the service's descriptors compiled in, calling the server itself.
func BenchmarkGRPCProfileDirect(b *testing.B) {
	sys := startGRPCSystem(b)
	cc, err := grpc.NewClient("passthrough:///"+sys.DemoGRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	m := profileMethod(b)
	in := dynamicpb.NewMessage(m.Input())
	if err := protojson.Unmarshal([]byte(profileArgs), in); err != nil {
		b.Fatal(err)
	}
	timed(b, func(int) error {
		return cc.Invoke(context.Background(), "/"+demotools.ProfileService+"/GetProfile", in, dynamicpb.NewMessage(m.Output()))
	})
}

// The grpc executor alone, as a worker runs it: JSON arguments to a request message, the call,
// the answer back to JSON.
func BenchmarkGRPCProfileExecutor(b *testing.B) {
	sys := startGRPCSystem(b)
	e, err := grpcexec.New(grpcexec.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	exec := worker.Chain(e, worker.Standard()...)
	timed(b, func(i int) error {
		c := &worker.Call{RequestID: fmt.Sprint("bench-", i), Attempt: 1, MaxAttempts: 1, Timeout: 3 * time.Second, MaxResultBytes: 1 << 20,
			Dispatch: &protocol.Dispatch{Call: protocol.ToolCall{ToolCallID: "c", Name: demotools.ProfileTool, Arguments: json.RawMessage(profileArgs)},
				Route: "bench", Action: protocol.Action{Kind: protocol.ActionGRPC, TimeoutMS: 3000,
					GRPC: &protocol.GRPCAction{Service: demotools.ProfileService, Method: "GetProfile", Target: sys.DemoGRPC}}}}
		out, err := exec.Execute(context.Background(), c)
		if err == nil && out.Result.Status != protocol.ResultOK {
			err = fmt.Errorf("%s %s", out.Result.ErrorCode, out.Result.RecoveryHint)
		}
		return err
	})
}

// Through /v1/route by the seed's rule: the whole path, every call on the record.
func BenchmarkGRPCProfileHermesRoute(b *testing.B) {
	sys := startGRPCSystem(b)
	h := &bench.Hermes{Client: bench.NewClient(1), URL: sys.GatewayURL, Key: sys.Key.Key, Tool: demotools.ProfileTool, Calls: 1,
		Args: profileArgs, RunID: fmt.Sprintf("grpc%d-%d", os.Getpid(), runs.Add(1))}
	timed(b, func(i int) error { return h.Do(context.Background(), 0, i) })
}

// The demo HTTP echo through /v1/route in the same system: the bus's share of any call, to set
// beside the gRPC tool's.
func BenchmarkGRPCBesideHTTPEchoHermesRoute(b *testing.B) {
	sys := startGRPCSystem(b)
	h := &bench.Hermes{Client: bench.NewClient(1), URL: sys.GatewayURL, Key: sys.Key.Key, Tool: "echo", Calls: 1,
		Args: `{"message":"hi"}`, RunID: fmt.Sprintf("grpchttp%d-%d", os.Getpid(), runs.Add(1))}
	timed(b, func(i int) error { return h.Do(context.Background(), 0, i) })
}
