package bench_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/internal/bench"
)

// A blueprint step's cost against a single request: one client, one after another, each op
// one run of a blueprint of one echo step (BlueprintOneStep) or three chained ones
// (BlueprintThreeSteps), against one request of one echo call (Request1CallSerial). The run is
// begun and waited for in one POST (?wait=), as a caller would.
func BenchmarkRequest1CallSerial(b *testing.B) {
	sys := startSystem(b)
	h := &bench.Hermes{Client: bench.NewClient(1), URL: sys.GatewayURL, Key: sys.Key.Key, Tool: "echo", Calls: 1, Args: "{}",
		RunID: fmt.Sprintf("rs%d-%d", os.Getpid(), runs.Add(1))}
	b.ResetTimer()
	for i := range b.N {
		if err := h.Do(context.Background(), 0, i); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkBlueprintOneStep(b *testing.B) { benchBlueprint(b, 1) }

func BenchmarkBlueprintThreeSteps(b *testing.B) { benchBlueprint(b, 3) }

func benchBlueprint(b *testing.B, steps int) {
	sys := startSystem(b)
	client := bench.NewClient(1)
	post := func(path, contentType, body string) string {
		req, err := http.NewRequest(http.MethodPost, sys.GatewayURL+path, strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		req.Header.Set("Content-Type", contentType)
		req.Header.Set("Authorization", "Bearer "+sys.Key.Key)
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode >= 300 {
			b.Fatalf("POST %s: %d %s", path, resp.StatusCode, data)
		}
		return string(data)
	}
	var doc strings.Builder
	fmt.Fprintf(&doc, `{"name":"chain%d","steps":[{"tool":"echo","input_mapping":{"n":"$.user_input.n"},"output_key":"s0"}`, steps)
	for i := 1; i < steps; i++ {
		fmt.Fprintf(&doc, `,{"tool":"echo","input_mapping":{"n":"$.s%d.n"},"output_key":"s%d"}`, i-1, i)
	}
	doc.WriteString(`]}`)
	post("/api/v1/blueprints", "application/json", doc.String())
	prefix := fmt.Sprintf("bb%d-%d", os.Getpid(), runs.Add(1))
	b.ResetTimer()
	for i := range b.N {
		out := post(fmt.Sprintf("/v1/blueprints/chain%d/runs?wait=30s", steps), "application/json",
			fmt.Sprintf(`{"run_id":"%s-%d","user_input":{"n":%d}}`, prefix, i, i))
		if !strings.Contains(out, `"status":"succeeded"`) {
			b.Fatalf("run %d: %s", i, out)
		}
	}
}
