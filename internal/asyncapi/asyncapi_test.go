package asyncapi

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/pkg/protocol"
)

var update = flag.Bool("update", false, "write api/asyncapi.json from the code")

const docPath = "../../api/asyncapi.json"

// The repository's document is the one the code makes: a field of pkg/protocol changed
// without it fails here (go test ./internal/asyncapi -update writes it again).
func TestTheRepositorysDocumentIsCurrent(t *testing.T) {
	got := JSON()
	if *update {
		if err := os.WriteFile(docPath, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("api/asyncapi.json is not what the code describes (pkg/protocol changed?): run go test ./internal/asyncapi -update, and check the diff")
	}
}

// The request's schema names exactly what protocol.DecodeRequestJSON takes.
func TestTheRequestSchemaIsWhatTheDecoderTakes(t *testing.T) {
	props := requestSchema()["properties"].(map[string]any)
	var names []string
	for name := range props {
		names = append(names, name)
	}
	slices.Sort(names)
	want := slices.Sorted(slices.Values(RequestFields))
	if !slices.Equal(names, want) {
		t.Fatalf("schema properties %v, want %v", names, want)
	}
	// The decoder names the fields it knows when it refuses another: the same.
	_, err := protocol.DecodeRequestJSON([]byte(`{"request_id":"r1","tool_calls":[],"unknown_field":1}`), protocol.Limits{})
	if err == nil {
		t.Fatal("an unknown field was taken")
	}
	for _, name := range RequestFields {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("the decoder does not list %s among the fields it knows: %v", name, err)
		}
	}
	// And a request with every field is taken.
	full := `{"request_id":"r1","session_id":"s1","intent":"i","serial":true,"user":"u1","tool_calls":[{"tool_call_id":"c1","name":"echo","arguments":{}}]}`
	if _, err := protocol.DecodeRequestJSON([]byte(full), protocol.Limits{}); err != nil {
		t.Fatalf("every field: %v", err)
	}
	var doc map[string]any
	if err := json.Unmarshal(JSON(), &doc); err != nil || doc["asyncapi"] != "3.0.0" {
		t.Fatalf("the document: %v", err)
	}
}
