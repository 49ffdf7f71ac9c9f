package integration

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/pkg/bus"
	sdk "github.com/hermesbus/hermes/pkg/hermes"
	"github.com/hermesbus/hermes/pkg/protocol"
)

type stockIn struct {
	SKU string `json:"sku" jsonschema:"description=商品编号,pattern=^SKU-[0-9]{5}$"`
}

type stockOut struct {
	SKU   string `json:"sku"`
	Count int    `json:"count" jsonschema:"minimum=0"`
}

// A Go function served with the SDK, as a tool worker's NATS user: its contract registered at
// start through the gateway, its arguments and answers checked, its failures the tool's own.
func TestAGoFunctionBecomesATool(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1, callers: true})
	keys := callerKeys(t, s, map[string]auth.Role{"admin": auth.RoleAdmin})
	stock := sdk.Tool("stock_count", "库存数量", func(_ context.Context, in stockIn) (stockOut, error) {
		if in.SKU == "SKU-00000" {
			return stockOut{}, sdk.Fail("SKU_UNKNOWN", "check the SKU against the catalogue", errors.New("no such SKU"))
		}
		return stockOut{SKU: in.SKU, Count: 7}, nil
	}, sdk.Errors("SKU_UNKNOWN"), sdk.Level("L"))
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- sdk.Serve(ctx, sdk.Config{NATS: s.srv.Plain, NKey: s.srv.SeedFile(t, bus.RoleWorker),
			Gateway: s.base, APIKey: keys["admin"], Instance: "sdk-worker"}, stock)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	var r *protocol.Response
	waitFor(t, "the Go tool answers", func() bool {
		r = s.routeAs(keys["admin"], request(fmt.Sprintf("sdk_%d", time.Now().UnixNano()), "",
			call("ok", "stock_count", map[string]any{"sku": "SKU-12345"}),
			call("unknown", "stock_count", map[string]any{"sku": "SKU-00000"}),
			call("bad", "stock_count", map[string]any{"sku": "12345"})))
		return result(t, r, "ok").Status == protocol.ResultOK
	})
	if ok := result(t, r, "ok"); string(ok.Content) != `{"success":{"sku":"SKU-12345","count":7}}` || ok.ContractVersion != 1 || ok.Route != "contract:stock_count" {
		t.Errorf("ok: %+v %s", ok, ok.Content)
	}
	if u := result(t, r, "unknown"); u.ErrorCode != "SKU_UNKNOWN" || u.ErrorOrigin != protocol.OriginTool || u.RecoveryHint != "check the SKU against the catalogue" {
		t.Errorf("the tool's failure: %+v", u)
	}
	if b := result(t, r, "bad"); b.ErrorCode != protocol.CodeBadArguments || !strings.Contains(string(b.Content), "sku: does not match ^SKU-[0-9]{5}$") {
		t.Errorf("a bad argument: %+v %s", b, b.Content)
	}
}

// The SDK's example program, built and run as a user would, serves its tool.
func TestTheSDKExampleRuns(t *testing.T) {
	variant(t, "TestAGoFunctionBecomesATool (a Go function served with the SDK, end to end); go vet ./... builds the example")
	t.Parallel()
	s := start(t, options{workers: 1, callers: true})
	keys := callerKeys(t, s, map[string]auth.Role{"admin": auth.RoleAdmin})
	bin := filepath.Join(t.TempDir(), "sdk-weather")
	if out, err := exec.Command("go", "build", "-o", bin, "../../examples/sdk-weather").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "HERMES_NATS_URL="+s.srv.Plain, "HERMES_NATS_NKEY="+s.srv.SeedFile(t, bus.RoleWorker),
		"HERMES_URL="+s.base, "HERMES_API_KEY="+keys["admin"])
	var logs strings.Builder
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Signal(os.Interrupt); _ = cmd.Wait() })
	var r *protocol.Response
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(logs.String())
		}
	})
	waitFor(t, "the example's tool answers", func() bool {
		r = s.routeAs(keys["admin"], request(fmt.Sprintf("sdkex_%d", time.Now().UnixNano()), "",
			call("c", "city_weather", map[string]any{"city": "上海"}), call("x", "city_weather", map[string]any{"city": "Atlantis"})))
		return result(t, r, "c").Status == protocol.ResultOK
	})
	if c := result(t, r, "c"); !strings.HasPrefix(string(c.Content), `{"success":{"city":"上海"`) || c.ContractVersion != 1 {
		t.Errorf("%+v %s\n%s", c, c.Content, logs.String())
	}
	if x := result(t, r, "x"); x.ErrorCode != "CITY_NOT_FOUND" {
		t.Errorf("%+v", x)
	}
}

// An SDK tool is sandboxed at start like any other: one whose answers break its own contract
// is refused, and Serve returns the refusal naming the case, serving nothing.
func TestTheSandboxRefusesABrokenGoTool(t *testing.T) {
	variant(t, "pkg/hermes's TestServeEndsWithTheGatewaysRefusal (Serve ends with the gateway's refusal, naming the case) and TestTheSandboxRefusesBrokenTools (the sandbox refuses a tool that breaks its contract)")
	t.Parallel()
	s := start(t, options{workers: 1, callers: true})
	keys := callerKeys(t, s, map[string]auth.Role{"admin": auth.RoleAdmin})
	broken := sdk.Tool("stock_count_broken", "库存数量（坏的）", func(_ context.Context, in stockIn) (stockOut, error) {
		return stockOut{SKU: in.SKU, Count: -1}, nil // below the minimum its type declares
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := sdk.Serve(ctx, sdk.Config{NATS: s.srv.Plain, NKey: s.srv.SeedFile(t, bus.RoleWorker),
		Gateway: s.base, APIKey: keys["admin"], Instance: "sdk-broken"}, broken)
	if err == nil || !strings.Contains(err.Error(), "SANDBOX_REFUSED") || !strings.Contains(err.Error(), `{"sku":"SKU-00000"}`) ||
		!strings.Contains(err.Error(), "count: is -1; at least 0") {
		t.Fatalf("Serve: %v", err)
	}
	if code, _ := s.call("GET", "/api/v1/tools/stock_count_broken", keys["admin"], ""); code != http.StatusNotFound {
		t.Errorf("the refused tool is registered: %d", code)
	}
}
