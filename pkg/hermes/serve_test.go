package hermes_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/hermes"
)

type stockIn struct {
	SKU string `json:"sku" jsonschema:"pattern=^SKU-[0-9]{5}$"`
}

type stockOut struct {
	Count int `json:"count" jsonschema:"minimum=0"`
}

// Serve registers each tool's contract with the gateway (the tool's contract as JSON, with the
// API key) while it serves the tool; a contract the gateway refuses — its sandbox found a case
// broken — ends Serve with the refusal, naming the case and what it broke.
func TestServeEndsWithTheGatewaysRefusal(t *testing.T) {
	srv := bustest.NewServer(t)
	srv.Provision(t, bus.Config{})
	posted := make(chan map[string]any, 1)
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var doc map[string]any
		body, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || r.URL.Path != "/api/v1/tools" || r.Header.Get("Authorization") != "Bearer hk_test" ||
			json.Unmarshal(body, &doc) != nil {
			t.Errorf("%s %s %q: %s", r.Method, r.URL, r.Header.Get("Authorization"), body)
		}
		posted <- doc
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = io.WriteString(w, `{"error":{"code":"SANDBOX_REFUSED","message":"1 of 4 cases broke the contract"},`+
			`"sandbox":{"verdict":"refused","cases":[{"id":"case-01","kind":"valid","name":"an example","arguments":{"sku":"SKU-00000"},"outcome":"violation","detail":"success.count: is -1; at least 0"},`+
			`{"id":"case-02","kind":"invalid","name":"sku missing","arguments":{},"outcome":"passed"}]}}`)
	}))
	t.Cleanup(gw.Close)
	broken := hermes.Tool("stock_count_broken", "库存数量（坏的）", func(_ context.Context, in stockIn) (stockOut, error) {
		return stockOut{Count: -1}, nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := hermes.Serve(ctx, hermes.Config{NATS: srv.URL, Gateway: gw.URL, APIKey: "hk_test", Instance: "sdk-broken"}, broken)
	if err == nil || !strings.Contains(err.Error(), "422 SANDBOX_REFUSED") || !strings.Contains(err.Error(), `case-01 VIOLATION [valid] an example {"sku":"SKU-00000"}: success.count: is -1; at least 0`) ||
		strings.Contains(err.Error(), "case-02") {
		t.Fatalf("Serve: %v", err)
	}
	if doc := <-posted; doc["name"] != "stock_count_broken" || doc["input_schema"] == nil || doc["reach"] == nil {
		t.Errorf("the contract posted: %v", doc)
	}
}

// Stopped while the gateway still weighs a contract (its sandbox takes its time), Serve ends
// without an error: the registration cut short is the stop, not a failure.
func TestServeStoppedWhileRegistering(t *testing.T) {
	srv := bustest.NewServer(t)
	srv.Provision(t, bus.Config{})
	posted := make(chan struct{}, 1)
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // read through: the server then sees the client go
		posted <- struct{}{}
		<-r.Context().Done()
	}))
	t.Cleanup(gw.Close)
	tool := hermes.Tool("stock_count_slow", "库存数量", func(_ context.Context, in stockIn) (stockOut, error) {
		return stockOut{Count: 1}, nil
	})
	for range 5 { // Serve's stop races the registration's end: each way round, a few times
		ctx, cancel := context.WithCancel(context.Background())
		served := make(chan error, 1)
		go func() {
			served <- hermes.Serve(ctx, hermes.Config{NATS: srv.URL, Gateway: gw.URL, APIKey: "hk_test", Instance: "sdk-slow"}, tool)
		}()
		<-posted
		cancel()
		select {
		case err := <-served:
			if err != nil {
				t.Fatalf("Serve stopped while registering: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Serve did not stop")
		}
	}
}
