package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/policies"
	"github.com/hermesbus/hermes/internal/registry"
	"github.com/hermesbus/hermes/pkg/bus"
	"github.com/hermesbus/hermes/pkg/bus/bustest"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// seedPolicies is the seed's policy file (seed-examples/tool-policies.yaml).
const seedPolicies = `policies:
  meeting_book:
    confirm_required: true
    allowed_roles: [admin]
  notify_send:
    rate_limit: 10
    max_recipients: 20
`

// adminVerifier is fakeVerifier with an admin's key besides.
type adminVerifier struct{ fakeVerifier }

func (v adminVerifier) Verify(ctx context.Context, cred string) (*auth.Caller, error) {
	if cred == "admin-key" {
		return &auth.Caller{ID: "key:a", Name: "root", Role: auth.RoleAdmin}, nil
	}
	return v.fakeVerifier.Verify(ctx, cred)
}

// policyGateway is a gateway on a bus with the policies' bucket, the seed's tools registered
// (notify_send naming its recipients), a tool whose contract carries a policy block, and a
// tool served without a contract.
func policyGateway(t *testing.T, callers auth.Verifier) (*Gateway, *bus.Bus) {
	t.Helper()
	srv := bustest.NewServer(t)
	b := srv.Provision(t, bus.Config{Buckets: append([]bus.Bucket{admission.Bucket(bus.Config{})}, policies.Buckets()...)})
	store := registry.NewStore(b.Contracts)
	for _, src := range []string{
		`{"name":"meeting_book","description":"books a meeting","input_schema":{"type":"object"}}`,
		`{"name":"notify_send","description":"notifies users","input_schema":{"type":"object"},"recipients":["user_ids"]}`,
		`{"name":"wire_money","description":"sends money","input_schema":{"type":"object"},"policy":{"allowed_roles":["operator"]}}`,
	} {
		c, err := registry.Parse([]byte(src))
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := store.Register(t.Context(), c, []byte(src), "test"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Tools.Put(t.Context(), protocol.KeyTool(protocol.ActionHTTP, "served_only"), []byte("served_only")); err != nil {
		t.Fatal(err)
	}
	g, err := New(Config{Conn: srv.Connect(t), Bus: b, Instance: "test", PublicHosts: testHosts, Callers: callers})
	if err != nil {
		t.Fatal(err)
	}
	return g, b
}

// call serves one request to g as the caller of key ("" for none).
func call(g *Gateway, method, target, key, contentType, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, target, strings.NewReader(body))
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	rec := httptest.NewRecorder()
	g.Handler().ServeHTTP(rec, req)
	return rec
}

// A policy file is checked whole before anything is applied: a tool nobody registered or
// serves, a role no caller has, max_recipients for a tool whose contract names no recipients,
// or a limit that does not parse is 400 INVALID_POLICY naming the field, and nothing is
// written. The seed's file applies as versions; applying it again changes nothing; a removal
// is a version, and the contract's policy block stands again.
func TestPoliciesAPI(t *testing.T) {
	t.Parallel()
	g, b := policyGateway(t, adminVerifier{})
	const yamlType = "application/yaml"
	for _, tc := range []struct{ body, field, reason string }{
		{"policies:\n  notify_send: {rate_limit: 10}\n  nope: {allowed_roles: [admin]}\n", "policies.nope", "no tool or blueprint nope is known"},
		{"policies:\n  meeting_book: {allowed_roles: [admin, boss]}\n", "policies.meeting_book.allowed_roles[1]", `"boss" is no role`},
		{"policies:\n  meeting_book: {max_recipients: 5}\n", "policies.meeting_book.max_recipients", "names none"},
		{"policies:\n  served_only: {max_recipients: 5}\n", "policies.served_only.max_recipients", "names none"},
		{"policies:\n  notify_send: {rate_limit: fast}\n", "policies.notify_send.rate_limit", ""},
	} {
		rec := call(g, http.MethodPost, "/api/v1/policies", "admin-key", yamlType, tc.body)
		e := apiErr(t, rec)
		if rec.Code != http.StatusBadRequest || e.Error.Code != protocol.CodeInvalidPolicy || e.Error.Field != tc.field || !strings.Contains(e.Error.Message, tc.reason) {
			t.Errorf("%q: HTTP %d %+v", tc.body, rec.Code, e.Error)
		}
	}
	if list, err := policies.NewStore(b.Bucket(policies.PoliciesBucket)).List(t.Context()); err != nil || len(list) != 0 {
		t.Fatalf("refused files applied %v (%v)", list, err)
	}
	if rec := call(g, http.MethodPost, "/api/v1/policies", "user-key", yamlType, seedPolicies); rec.Code != http.StatusForbidden {
		t.Errorf("a user applies: HTTP %d %s", rec.Code, rec.Body)
	}
	if rec := call(g, http.MethodPost, "/api/v1/policies", "admin-key", "text/plain", seedPolicies); rec.Code != http.StatusUnsupportedMediaType {
		t.Errorf("text/plain: HTTP %d %s", rec.Code, rec.Body)
	}

	apply := func(body string, want int) PolicyList {
		t.Helper()
		rec := call(g, http.MethodPost, "/api/v1/policies", "admin-key", yamlType, body)
		var out PolicyList
		if rec.Code != want || json.Unmarshal(rec.Body.Bytes(), &out) != nil {
			t.Fatalf("apply: HTTP %d %s", rec.Code, rec.Body)
		}
		return out
	}
	out := apply(seedPolicies, http.StatusCreated)
	if len(out.Policies) != 2 || out.Policies[0].Tool != "meeting_book" || out.Policies[0].Version != 1 || !*out.Policies[0].Changed ||
		out.Policies[1].Tool != "notify_send" || out.Policies[1].Policy.MaxRecipients != 20 || out.Policies[0].By != "root (key:a)" {
		t.Fatalf("applied %+v", out)
	}
	out = apply(seedPolicies, http.StatusOK)
	if *out.Policies[0].Changed || *out.Policies[1].Changed || out.Policies[1].Version != 1 {
		t.Errorf("again: %+v", out)
	}
	apply("policies:\n  served_only: {rate_limit: 5/s}\n  notify_send: {rate_limit: 100/h, max_recipients: 20}\n", http.StatusCreated)

	var all PolicyList
	rec := call(g, http.MethodGet, "/api/v1/policies", "user-key", "", "")
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &all) != nil {
		t.Fatalf("list: HTTP %d %s", rec.Code, rec.Body)
	}
	var got []string
	for _, v := range all.Policies {
		got = append(got, fmt.Sprintf("%s:%s:v%d", v.Tool, v.Source, v.Version))
	}
	if want := "[meeting_book:policy:v1 notify_send:policy:v2 served_only:policy:v1 wire_money:contract:v1]"; fmt.Sprint(got) != want {
		t.Errorf("listed %v, want %s", got, want)
	}

	var one PolicyView
	rec = call(g, http.MethodGet, "/api/v1/policies/notify_send", "user-key", "", "")
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &one) != nil || one.Version != 2 || one.Policy.RateLimit.String() != "100/h" ||
		len(one.History) != 2 || one.History[0].Policy.RateLimit.String() != "10/min" {
		t.Errorf("get: HTTP %d %s", rec.Code, rec.Body)
	}
	if rec := call(g, http.MethodGet, "/api/v1/policies/echo", "user-key", "", ""); rec.Code != http.StatusNotFound || !strings.Contains(apiErr(t, rec).Error.Message, "echo") {
		t.Errorf("no policy: HTTP %d %s", rec.Code, rec.Body)
	}

	if rec := call(g, http.MethodDelete, "/api/v1/policies/meeting_book", "user-key", "", ""); rec.Code != http.StatusForbidden {
		t.Errorf("a user removes: HTTP %d %s", rec.Code, rec.Body)
	}
	if rec := call(g, http.MethodDelete, "/api/v1/policies/meeting_book", "admin-key", "", ""); rec.Code != http.StatusOK {
		t.Errorf("remove: HTTP %d %s", rec.Code, rec.Body)
	}
	if rec := call(g, http.MethodDelete, "/api/v1/policies/meeting_book", "admin-key", "", ""); rec.Code != http.StatusNotFound {
		t.Errorf("remove again: HTTP %d %s", rec.Code, rec.Body)
	}
	rec = call(g, http.MethodGet, "/api/v1/policies/meeting_book", "user-key", "", "")
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &one) != nil || !one.Removed || one.Version != 2 || len(one.History) != 2 {
		t.Errorf("get removed: HTTP %d %s", rec.Code, rec.Body)
	}
	if rec := call(g, http.MethodDelete, "/api/v1/policies/wire_money", "admin-key", "", ""); rec.Code != http.StatusNotFound {
		t.Errorf("a contract's policy is not removed here: HTTP %d %s", rec.Code, rec.Body)
	}
}

// A gateway that asks for no key lets nobody change policies.
func TestPoliciesNeedAKeyToChange(t *testing.T) {
	t.Parallel()
	g, _ := policyGateway(t, nil)
	rec := call(g, http.MethodPost, "/api/v1/policies", "", "application/yaml", "policies:\n  notify_send: {rate_limit: 10}\n")
	if rec.Code != http.StatusForbidden || !strings.Contains(apiErr(t, rec).Error.Message, "tools:admin") {
		t.Errorf("HTTP %d %s", rec.Code, rec.Body)
	}
	if rec := call(g, http.MethodGet, "/api/v1/policies", "", "", ""); rec.Code != http.StatusOK {
		t.Errorf("read: HTTP %d %s", rec.Code, rec.Body)
	}
}

// GET /api/v1/tools leaves out the tools whose policy does not allow the caller's role, as it
// changes (the gateway follows the applied policies while it listens); a caller who may change
// tools sees every one.
func TestToolsListedByPolicy(t *testing.T) {
	t.Parallel()
	g, _ := policyGateway(t, adminVerifier{})
	// Not ready until the policies are followed: till then the listings offer nobody a tool.
	if rec := call(g, http.MethodGet, "/readyz", "", "", ""); rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "policies") {
		t.Errorf("readyz before Listen: HTTP %d %s", rec.Code, rec.Body)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Listen(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	listed := func(key string) []string {
		t.Helper()
		rec := call(g, http.MethodGet, "/api/v1/tools", key, "", "")
		if rec.Code == http.StatusServiceUnavailable {
			return nil // the policies are not followed yet
		}
		var out struct{ Tools []ToolView }
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &out) != nil {
			t.Fatalf("%s: HTTP %d %s", key, rec.Code, rec.Body)
		}
		names := []string{}
		for _, v := range out.Tools {
			names = append(names, v.Name)
		}
		return names
	}
	waitFor := func(key, want string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for got := listed(key); fmt.Sprint(got) != want; got = listed(key) {
			if time.Now().After(deadline) {
				t.Fatalf("%s is listed %v, want %s", key, got, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// wire_money's contract allows operators only.
	waitFor("user-key", "[meeting_book notify_send]")
	if rec := call(g, http.MethodGet, "/readyz", "", "", ""); rec.Code != http.StatusOK {
		t.Errorf("readyz: HTTP %d %s", rec.Code, rec.Body)
	}
	waitFor("operator-key", "[meeting_book notify_send wire_money]")
	if rec := call(g, http.MethodPost, "/api/v1/policies", "admin-key", "application/yaml",
		"policies:\n  meeting_book: {allowed_roles: [admin], confirm_required: true}\n  wire_money: {allowed_roles: [user]}\n"); rec.Code != http.StatusCreated {
		t.Fatalf("apply: HTTP %d %s", rec.Code, rec.Body)
	}
	waitFor("user-key", "[notify_send wire_money]")
	waitFor("operator-key", "[notify_send]")
	waitFor("admin-key", "[meeting_book notify_send wire_money]")
	if g.Offers("meeting_book", nil, "user") || !g.Offers("meeting_book", nil, "admin") || !g.Offers("echo", nil, "") {
		t.Error("Offers disagrees with the listing")
	}
	if rec := call(g, http.MethodDelete, "/api/v1/policies/meeting_book", "admin-key", "", ""); rec.Code != http.StatusOK {
		t.Fatalf("remove: HTTP %d %s", rec.Code, rec.Body)
	}
	waitFor("user-key", "[meeting_book notify_send wire_money]")
	if !slices.Contains(listed("operator-key"), "meeting_book") {
		t.Error("the removed policy still hides meeting_book")
	}
}
