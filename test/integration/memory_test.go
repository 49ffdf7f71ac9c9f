package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/app"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/memory"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Through a real bus: each caller's memory is its own, and an application's memory of one of
// its users is that user's with that application; a key written again replaces its value and
// the record keeps its history; bad input is refused naming the field; forgetting leaves
// nothing; the command line reads and forgets it.
func TestMemoryIsEachOwnersOwn(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1, callers: true})
	keys := callerKeys(t, s, map[string]auth.Role{"alice": auth.RoleUser, "bob": auth.RoleUser, "app-shop": auth.RoleUser, "app-other": auth.RoleUser, "root": auth.RoleAdmin})
	frag := func(key, value, lifespan string, extra string) string {
		return fmt.Sprintf(`{"type":"user_preference","key":%q,"value":%s,"lifespan":%q%s}`, key, value, lifespan, extra)
	}
	post := func(who, body string, want int) string {
		t.Helper()
		code, out := s.call("POST", "/v1/memory", keys[who], body)
		if code != want {
			t.Fatalf("%s POST %s: %d %s", who, body, code, out)
		}
		return out
	}
	post("alice", frag("default_shipping", `"YTO"`, "forever", ""), http.StatusCreated)
	if out := post("alice", frag("default_shipping", `"SF-Express"`, "forever", ""), http.StatusOK); !strings.Contains(out, `"replaced"`) || !strings.Contains(out, `"version":2`) {
		t.Fatalf("the replacement: %s", out)
	}
	post("bob", frag("default_shipping", `"EMS"`, "forever", ""), http.StatusCreated)
	// One application, two users; another application, the same user name.
	post("app-shop", frag("invoice_type", `"personal"`, "30d", `,"user":"carol"`), http.StatusCreated)
	post("app-shop", frag("invoice_type", `"company"`, "30d", `,"user":"dave"`), http.StatusCreated)
	post("app-other", frag("invoice_type", `"other-app"`, "30d", `,"user":"carol"`), http.StatusCreated)
	get := func(who, target string) (int, string) { t.Helper(); return s.call("GET", target, keys[who], "") }
	for who, want := range map[string]string{"alice": `"SF-Express"`, "bob": `"EMS"`} {
		code, out := get(who, "/v1/memory/default_shipping")
		if code != http.StatusOK || !strings.Contains(out, `"value":`+want) {
			t.Errorf("%s: %d %s", who, code, out)
		}
	}
	for _, tc := range []struct{ who, user, want string }{{"app-shop", "carol", `"personal"`}, {"app-shop", "dave", `"company"`}, {"app-other", "carol", `"other-app"`}} {
		code, out := get(tc.who, "/v1/memory?user="+tc.user)
		var list struct {
			Fragments []struct {
				Key   string          `json:"key"`
				Value json.RawMessage `json:"value"`
			} `json:"fragments"`
		}
		if code != http.StatusOK || json.Unmarshal([]byte(out), &list) != nil || len(list.Fragments) != 1 || string(list.Fragments[0].Value) != tc.want {
			t.Errorf("%s for %s: %d %s", tc.who, tc.user, code, out)
		}
	}
	if code, out := get("app-shop", "/v1/memory"); code != http.StatusOK || !strings.Contains(out, `"count":0`) {
		t.Errorf("the application's own memory holds its users': %d %s", code, out)
	}
	// Refused, naming the field; nobody reads another's memory.
	for _, tc := range []struct {
		who, method, target, body string
		status                    int
		field                     string
	}{
		{"alice", "POST", "/v1/memory", frag("k", `1`, "fortnight", ""), 400, "lifespan"},
		{"alice", "POST", "/v1/memory", frag("k", `"`+strings.Repeat("v", memory.MaxValueBytes)+`"`, "30d", ""), 400, "value"},
		{"alice", "POST", "/v1/memory", frag("k", `1`, "30d", `,"semantic_tag":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]`), 400, "semantic_tag"},
		{"alice", "POST", "/v1/memory", frag("k", `1`, "session", ""), 400, "session_id"},
		{"alice", "POST", "/v1/memory", frag("", `1`, "30d", ""), 400, "key"},
		{"alice", "POST", "/v1/memory", `{"type":"t","key":"k","value":1,"lifespan":"1h","colour":"red"}`, 400, ""},
		{"alice", "POST", "/v1/memory", frag("k", `1`, "30d", `,"user":"carol"`), 403, ""},
		{"alice", "GET", "/v1/memory?owner=key:x", "", 403, ""},
		{"alice", "DELETE", "/v1/memory?owner=key:x", "", 403, ""},
		{"alice", "GET", "/v1/memory?session_id=bad%20id", "", 400, "session_id"},
		{"bob", "GET", "/v1/memory/invoice_type", "", 404, ""},
		{"", "GET", "/v1/memory", "", 401, ""},
	} {
		code, out := s.call(tc.method, tc.target, keys[tc.who], tc.body)
		if code != tc.status || tc.field != "" && !strings.Contains(out, `"field":"`+tc.field+`"`) {
			t.Errorf("%s %s %s: %d %s, want %d on %q", tc.who, tc.method, tc.target, code, out, tc.status, tc.field)
		}
	}
	// An admin names any owner, as the listing names it.
	_, out := get("alice", "/v1/memory")
	var mine struct {
		Owner string `json:"owner"`
	}
	if err := json.Unmarshal([]byte(out), &mine); err != nil || !strings.HasPrefix(mine.Owner, "key:") {
		t.Fatalf("alice's listing: %s", out)
	}
	if code, out := get("root", "/v1/memory?owner="+mine.Owner); code != http.StatusOK || !strings.Contains(out, "SF-Express") {
		t.Fatalf("the admin reads alice's memory: %d %s", code, out)
	}
	// Nobody takes an owner's memory history for a session of their own: bob can neither
	// post into alice's memory session nor follow it.
	history := memory.HistorySession(mine.Owner)
	if code, out := s.call("POST", "/v1/route", keys["bob"], fmt.Sprintf(`{"request_id":"steal_1","session_id":%q,"tool_calls":[{"tool_call_id":"c1","name":"echo","arguments":{}}]}`, history)); code != http.StatusBadRequest || !strings.Contains(out, `"field":"session_id"`) {
		t.Errorf("bob posts into alice's memory session: %d %s", code, out)
	}
	if code, out := s.call("GET", "/v1/sessions/"+history+"/events", keys["bob"], ""); code != http.StatusNotFound {
		t.Errorf("bob follows alice's memory session: %d %s", code, out)
	}
	// The command line.
	if code, out, errOut := hermes(t, app.RunMemory, "ls", "--url", s.base, "--key-file", writeTemp(t, keys["app-shop"]), "--user", "carol"); code != 0 || !strings.Contains(out, "invoice_type") || !strings.Contains(out, `"personal"`) || strings.Contains(out, "company") {
		t.Errorf("memory ls: %d %s %s", code, out, errOut)
	}
	if code, _, errOut := hermes(t, app.RunMemory, "get", "nothing", "--url", s.base, "--key-file", writeTemp(t, keys["alice"])); code != 1 {
		t.Errorf("memory get of nothing: %d %s", code, errOut)
	}
	if code, out, errOut := hermes(t, app.RunMemory, "rm", "default_shipping", "--url", s.base, "--key-file", writeTemp(t, keys["bob"])); code != 0 {
		t.Errorf("memory rm: %d %s %s", code, out, errOut)
	}
	if code, _ := get("bob", "/v1/memory/default_shipping"); code != http.StatusNotFound {
		t.Errorf("after rm: %d", code)
	}
	if code, _, _ := hermes(t, app.RunMemory, "forget", "--url", s.base, "--key-file", writeTemp(t, keys["app-shop"]), "--user", "carol"); code != 2 {
		t.Errorf("forget without --yes: %d", code)
	}
	if code, out, errOut := hermes(t, app.RunMemory, "forget", "--yes", "--url", s.base, "--key-file", writeTemp(t, keys["app-shop"]), "--user", "carol"); code != 0 || !strings.Contains(out, "forgot 1 fragments") {
		t.Errorf("memory forget: %d %s %s", code, out, errOut)
	}
	if code, out := get("app-shop", "/v1/memory?user=carol"); code != http.StatusOK || !strings.Contains(out, `"count":0`) {
		t.Errorf("carol's memory after forget: %d %s", code, out)
	}
	if code, out := get("app-other", "/v1/memory?user=carol"); !strings.Contains(out, "other-app") {
		t.Errorf("forgetting carol at one application forgot her at another: %d %s", code, out)
	}
	// The record keeps the key's history, on the owner's memory session.
	code, replay, errOut := hermes(t, app.RunReplay, "--nats", s.srv.URL, "--session", memory.HistorySession(mine.Owner))
	if code != 0 || !strings.Contains(replay, `written user_preference/default_shipping v1`) || !strings.Contains(replay, `"YTO"`) ||
		!strings.Contains(replay, `replaced user_preference/default_shipping v2`) || !strings.Contains(replay, `"SF-Express"`) || !strings.Contains(replay, "by alice") {
		t.Errorf("replay of alice's memory: %d %s %s", code, replay, errOut)
	}
}

// An operator erases everything kept about a user: fragments, their history on the record,
// and with --with-history the user's sessions; another user with the same keys keeps all of
// theirs.
func TestForgettingAUserLeavesNothing(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1, callers: true})
	keys := callerKeys(t, s, map[string]auth.Role{"alice": auth.RoleUser, "bob": auth.RoleUser, "carol": auth.RoleUser})
	owners := map[string]string{}
	for _, who := range []string{"alice", "bob", "carol"} {
		for _, v := range []string{`"YTO"`, `"SF-Express"`} {
			if code, out := s.call("POST", "/v1/memory", keys[who], `{"type":"user_preference","key":"default_shipping","value":`+v+`,"lifespan":"forever"}`); code/100 != 2 {
				t.Fatalf("%s: %d %s", who, code, out)
			}
		}
		for i := range 2 {
			req := fmt.Sprintf(`{"request_id":"forget_%s_%d","session_id":"forget_%s_%d","tool_calls":[{"tool_call_id":"c1","name":"echo","arguments":{"n":1}}]}`, who, i, who, i)
			if code, out := s.call("POST", "/v1/route", keys[who], req); code != http.StatusOK {
				t.Fatalf("%s: %d %s", who, code, out)
			}
		}
		_, out := s.call("GET", "/v1/memory", keys[who], "")
		var list struct {
			Owner string `json:"owner"`
		}
		_ = json.Unmarshal([]byte(out), &list)
		owners[who] = list.Owner
	}
	_, b := s.connect()
	stream, err := b.JS.Stream(context.Background(), protocol.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	held := func(filter string) uint64 {
		t.Helper()
		info, err := stream.Info(context.Background(), jetstream.WithSubjectFilter(filter))
		if err != nil {
			t.Fatal(err)
		}
		var n uint64
		for _, c := range info.State.Subjects {
			n += c
		}
		return n
	}
	history := func(who string) uint64 {
		return held(protocol.SubjectEvent(protocol.EventMemory, memory.HistorySession(owners[who])))
	}
	sessionMessages := func(who string) (n uint64) {
		for i := range 2 {
			for _, f := range protocol.FilterSession(fmt.Sprintf("forget_%s_%d", who, i)) {
				n += held(f)
			}
		}
		return n
	}
	if history("alice") != 2 || sessionMessages("alice") == 0 {
		t.Fatalf("before: %d history, %d session messages", history("alice"), sessionMessages("alice"))
	}
	bobBefore := sessionMessages("bob")
	hot := s.gateway.Memory().Cache
	waitFor(t, "the gateway's hot tier to hold alice", func() bool {
		s.call("GET", "/v1/memory", keys["alice"], "")
		return hot.Holds(owners["alice"])
	})
	// Not without --owner.
	if code, _, _ := hermes(t, app.RunMemory, "forget", "--yes", "--nats", s.srv.URL); code != 2 {
		t.Errorf("forget --nats without --owner: %d", code)
	}
	code, out, errOut := hermes(t, app.RunMemory, "forget", "--yes", "--with-history", "--nats", s.srv.URL, "--owner", owners["alice"])
	if code != 0 || !strings.Contains(out, "forgot 1 fragments") || !strings.Contains(out, "2 history messages") || !strings.Contains(out, "2 sessions") {
		t.Fatalf("forget: %d %s %s", code, out, errOut)
	}
	// The gateway learns of an erasure made elsewhere through its watch of the bucket.
	waitFor(t, "the gateway's hot tier to drop alice", func() bool { return !hot.Holds(owners["alice"]) })
	if code, out := s.call("GET", "/v1/memory", keys["alice"], ""); code != http.StatusOK || !strings.Contains(out, `"count":0`) {
		t.Errorf("alice's fragments: %d %s", code, out)
	}
	if hot.Holds(owners["alice"]) {
		t.Error("the gateway's hot tier holds alice's empty memory")
	}
	if n := history("alice"); n != 0 {
		t.Errorf("alice's memory history: %d messages left", n)
	}
	if n := sessionMessages("alice"); n != 0 {
		t.Errorf("alice's sessions: %d messages left", n)
	}
	if _, err := b.Bucket(memory.Bucket).Get(context.Background(), "o."+memory.Token(owners["alice"])); err == nil {
		t.Error("alice's entry is still in the bucket")
	}
	if code, out := s.call("GET", "/v1/memory/default_shipping", keys["bob"], ""); code != http.StatusOK || !strings.Contains(out, "SF-Express") {
		t.Errorf("bob's fragment: %d %s", code, out)
	}
	if history("bob") != 2 || sessionMessages("bob") != bobBefore {
		t.Errorf("bob's history %d, sessions %d of %d", history("bob"), sessionMessages("bob"), bobBefore)
	}

	// A user erases it all through a gateway: the fragments at once, the record by the eraser
	// (the one service that may purge it), and only that user's.
	carol := []string{"--url", s.base, "--key-file", writeTemp(t, keys["carol"])}
	if code, _, _ := hermes(t, app.RunMemory, append([]string{"erasure"}, carol...)...); code != 1 {
		t.Errorf("an erasure no one asked: exit %d", code)
	}
	if code, out := s.call("DELETE", "/v1/memory?with_history=maybe", keys["carol"], ""); code != http.StatusBadRequest || !strings.Contains(out, "with_history") {
		t.Errorf("with_history=maybe: %d %s", code, out)
	}
	code, out, errOut = hermes(t, app.RunMemory, append([]string{"forget", "--yes", "--with-history"}, carol...)...)
	if code != 0 || !strings.Contains(out, "forgot 1 fragments") || !strings.Contains(out, "erases its history on the record and its sessions") {
		t.Fatalf("forget through the gateway: %d %s %s", code, out, errOut)
	}
	waitFor(t, "carol's erasure done", func() bool {
		_, out, _ := hermes(t, app.RunMemory, append([]string{"erasure"}, carol...)...)
		return strings.Contains(out, "done") && strings.Contains(out, "2 history messages") && strings.Contains(out, "2 sessions")
	})
	if n := history("carol"); n != 0 {
		t.Errorf("carol's memory history: %d messages left", n)
	}
	if n := sessionMessages("carol"); n != 0 {
		t.Errorf("carol's sessions: %d messages left", n)
	}
	if code, out := s.call("GET", "/v1/memory", keys["carol"], ""); code != http.StatusOK || !strings.Contains(out, `"count":0`) {
		t.Errorf("carol's fragments: %d %s", code, out)
	}
	// Bob's erasure is his: carol cannot read it, nor have his erased.
	if code, out := s.call("GET", "/v1/erasure?owner="+url.QueryEscape(owners["bob"]), keys["carol"], ""); code != http.StatusForbidden {
		t.Errorf("carol read bob's erasure: %d %s", code, out)
	}
	if history("bob") != 2 || sessionMessages("bob") != bobBefore {
		t.Errorf("after carol's erasure: bob's history %d, sessions %d of %d", history("bob"), sessionMessages("bob"), bobBefore)
	}
}

// Without callers every request is the anonymous owner's: its fragments may be forgotten, but
// its sessions are every caller's, so no one may have them erased as its own; and with no
// caller to hold memory:admin, no named owner's memory is erased.
func TestTheAnonymousOwnersSessionsAreNotErased(t *testing.T) {
	t.Parallel()
	s := start(t, options{workers: 1})
	if code, out := s.call("DELETE", "/v1/memory?with_history=true", "", ""); code != http.StatusBadRequest || !strings.Contains(out, "anonymous") {
		t.Fatalf("with_history for the anonymous owner: %d %s", code, out)
	}
	// A NATS client's requests are its own even here: no one erases them through this gateway.
	for _, q := range []string{"owner=nats:crm&with_history=true", "owner=nats:crm"} {
		if code, out := s.call("DELETE", "/v1/memory?"+q, "", ""); code != http.StatusForbidden {
			t.Fatalf("%s on a gateway without callers: %d %s", q, code, out)
		}
	}
	code, out := s.call("DELETE", "/v1/memory", "", "")
	if code != http.StatusOK || !strings.Contains(out, `"owner":"anonymous"`) || !strings.Contains(out, `"with_history":false`) {
		t.Fatalf("forget: %d %s", code, out)
	}
	waitFor(t, "the anonymous owner's history erased", func() bool {
		_, out := s.call("GET", "/v1/erasure", "", "")
		return strings.Contains(out, `"state":"done"`)
	})
}
