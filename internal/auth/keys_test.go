package auth

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/bus/bustest"
)

func newKeys(t *testing.T) (*Keys, jetstream.KeyValue) {
	t.Helper()
	js, err := jetstream.New(bustest.NewServer(t).Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	bucket, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "hermes-keys-test"})
	if err != nil {
		t.Fatal(err)
	}
	return NewKeys(bucket), bucket
}

// A key is shown once, kept only as a hash, names its caller until it is revoked, and a key
// with any other secret names nobody.
func TestKeysCreateVerifyRevoke(t *testing.T) {
	keys, bucket := newKeys(t)
	ctx := t.Context()
	key, rec, err := keys.Create(ctx, NewKey{Name: "ci-bot", Role: RoleOperator, CreatedBy: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(key, KeyPrefix) || len(key) != len(KeyPrefix)+16+1+52 {
		t.Fatalf("key %q has not the documented shape", key)
	}
	e, err := bucket.Get(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	_, secret, _ := ParseKey(key)
	if strings.Contains(string(e.Value()), secret) || strings.Contains(string(e.Value()), key) {
		t.Fatalf("the stored record holds the secret: %s", e.Value())
	}
	c, err := keys.Verify(ctx, key)
	if err != nil || c.ID != "key:"+rec.ID || c.Name != "ci-bot" || c.Role != RoleOperator || !c.Can(PermDeadLetters) || c.Can(PermKeys) {
		t.Fatalf("verify: %+v %v", c, err)
	}
	last := "a" // the same key but for its last character
	if strings.HasSuffix(key, last) {
		last = "b"
	}
	other := key[:len(key)-1] + last
	for _, bad := range []string{"", "hk_", key + "x", strings.ToUpper(key), other, KeyPrefix + strings.Repeat("a", 16) + "_" + strings.Repeat("a", 52)} {
		if _, err := keys.Verify(ctx, bad); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("verify %q: %v, want ErrUnauthenticated", bad, err)
		} else if strings.Contains(err.Error(), secret) {
			t.Errorf("the error repeats the secret: %v", err)
		}
	}
	if _, err := keys.Revoke(ctx, "ci-bot"); err != nil {
		t.Fatal(err)
	}
	if _, err := keys.Verify(ctx, key); !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("verify a revoked key: %v", err)
	}
	if k, err := keys.Revoke(ctx, rec.ID); err != nil || !k.Revoked() {
		t.Fatalf("revoke again: %+v %v", k, err)
	}
	if _, err := keys.Revoke(ctx, "nobody"); !errors.Is(err, ErrNoSuchKey) {
		t.Fatalf("revoke an unknown name: %v", err)
	}
	if k, err := keys.Revoke(ctx, "ci-bot"); err != nil || k.ID != rec.ID {
		t.Fatalf("revoke again by name: %+v %v", k, err)
	}
	list, damaged, err := keys.List(ctx)
	if err != nil || len(list) != 1 || !list[0].Revoked() || list[0].Name != "ci-bot" || len(damaged) != 0 {
		t.Fatalf("list: %+v %v %v", list, damaged, err)
	}
	// A name that looks like an id is still revoked by name.
	if _, idLike, err := keys.Create(ctx, NewKey{Name: "billingservice22", Role: RoleUser}); err != nil {
		t.Fatal(err)
	} else if k, err := keys.Revoke(ctx, "billingservice22"); err != nil || k.ID != idLike.ID {
		t.Fatalf("revoke a name shaped like an id: %+v %v", k, err)
	}
}

// Names and roles are checked before anything is kept.
func TestKeysCreateRefusesBadInput(t *testing.T) {
	keys, _ := newKeys(t)
	for _, spec := range []NewKey{{Name: "", Role: RoleUser}, {Name: "a b", Role: RoleUser}, {Name: strings.Repeat("n", 65), Role: RoleUser},
		{Name: "ok", Role: "root"}, {Name: "-x", Role: RoleUser}} {
		if _, _, err := keys.Create(t.Context(), spec); err == nil {
			t.Errorf("created %+v", spec)
		}
	}
	if _, _, err := keys.Create(t.Context(), NewKey{Name: "spaced", Role: " admin"}); err == nil {
		t.Error("created a key with role \" admin\"")
	}
	if list, _, err := keys.List(t.Context()); err != nil || len(list) != 0 {
		t.Fatalf("kept %d keys, %v", len(list), err)
	}
}

// A record that is not a key's (written by someone else, or damaged) names nobody, is listed as
// damaged, and is never taken for the key whose id it claims.
func TestKeysRecordNotAKey(t *testing.T) {
	keys, bucket := newKeys(t)
	ctx := t.Context()
	key, rec, err := keys.Create(ctx, NewKey{Name: "app", Role: RoleUser})
	if err != nil {
		t.Fatal(err)
	}
	victimKey, victim, err := keys.Create(ctx, NewKey{Name: "victim", Role: RoleAdmin})
	if err != nil {
		t.Fatal(err)
	}
	for _, junk := range []string{"{", `{"id":"` + rec.ID + `","name":"app","role":"admin","hash":"00"}`,
		`{"id":"` + rec.ID + `","name":"app","role":"god","hash":"` + rec.Hash + `"}`,
		`{"id":"` + rec.ID + `","name":"app","role":" user","hash":"` + rec.Hash + `"}`,
		`{"id":"` + rec.ID + `","name":"app","role":"user","hash":"` + strings.ToUpper(rec.Hash) + `"}`,
		`{"id":"` + rec.ID + `","name":"\u001b[31mapp","role":"user","hash":"` + rec.Hash + `"}`} {
		if _, err := bucket.Put(ctx, rec.ID, []byte(junk)); err != nil {
			t.Fatal(err)
		}
		if _, err := keys.Verify(ctx, key); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("record %s: %v", junk, err)
		}
	}
	// A decoy stored under another id, copying the victim's record but for its name.
	decoy := `{"id":"` + victim.ID + `","name":"decoy","role":"admin","hash":"` + victim.Hash + `"}`
	decoyID := strings.Repeat("z", 16)
	if _, err := bucket.Put(ctx, decoyID, []byte(decoy)); err != nil {
		t.Fatal(err)
	}
	list, damaged, err := keys.List(ctx)
	if err != nil || len(list) != 1 || list[0].ID != victim.ID || len(damaged) != 2 {
		t.Fatalf("list: %+v, damaged %v, %v", list, damaged, err)
	}
	if _, err := keys.Revoke(ctx, "decoy"); !errors.Is(err, ErrNoSuchKey) {
		t.Fatalf("revoke the decoy: %v", err)
	}
	if _, err := keys.Verify(ctx, victimKey); err != nil {
		t.Fatalf("the victim's key after the decoy: %v", err)
	}
}

// Roles grant what the permission table says; act_for_users comes with admin or the key.
func TestRolePermissions(t *testing.T) {
	want := map[Role][]Permission{
		RoleAdmin: {PermSubmit, PermReadAll, PermDeadLetters, PermReplay, PermMetrics, PermKeys,
			PermApprove, PermToolsAdmin, PermActForUsers, PermMemoryAdmin},
		RoleOperator: {PermSubmit, PermReadAll, PermDeadLetters, PermReplay, PermMetrics},
		RoleUser:     {PermSubmit},
	}
	for role, perms := range want {
		for _, p := range Permissions() {
			has := false
			for _, q := range perms {
				has = has || q == p
			}
			if (&Caller{Role: role}).Can(p) != has {
				t.Errorf("%s can %s: %v", role, p, !has)
			}
		}
	}
	if !(&Caller{Role: RoleUser, ActForUsers: true}).Can(PermActForUsers) || (&Caller{Role: RoleUser, ActForUsers: true}).Can(PermKeys) {
		t.Error("act_for_users on a user key")
	}
	if (*Caller)(nil).Can(PermSubmit) {
		t.Error("no caller can do something")
	}
	if _, err := ParseRole("superuser"); err == nil || !strings.Contains(err.Error(), "admin, operator, user") {
		t.Errorf("parse an unknown role: %v", err)
	}
}

func FuzzDecodeKey(f *testing.F) {
	f.Add([]byte(`{"id":"abcdefghijklmnop","name":"x","role":"user","hash":"` + strings.Repeat("0", 64) + `","created_at":"` + time.Now().Format(time.RFC3339) + `"}`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, data []byte) {
		k, err := DecodeKey("abcdefghijklmnop", data)
		if err != nil {
			return
		}
		if r, err := ParseRole(string(k.Role)); err != nil || r != k.Role || k.ID != "abcdefghijklmnop" ||
			len(k.Hash) != 64 || strings.ToLower(k.Hash) != k.Hash || !namePattern.MatchString(k.Name) {
			t.Fatalf("accepted %+v", k)
		}
	})
}

func FuzzParseKey(f *testing.F) {
	f.Add(KeyPrefix + strings.Repeat("a", 16) + "_" + strings.Repeat("b", 52))
	f.Add("hk_")
	f.Fuzz(func(t *testing.T, s string) {
		id, secret, err := ParseKey(s)
		if err == nil && (len(id) != 16 || len(secret) != 52 || s != KeyPrefix+id+"_"+secret) {
			t.Fatalf("parsed %q as %q %q", s, id, secret)
		}
		if err != nil && !errors.Is(err, ErrUnauthenticated) {
			t.Fatalf("error %v does not wrap ErrUnauthenticated", err)
		}
	})
}

// A sign-in stands for its caller until it expires, is signed out, or its key is revoked; its
// token is never kept, and a wrong or malformed one names nobody.
func TestSignins(t *testing.T) {
	js, err := jetstream.New(bustest.NewServer(t).Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	kb, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "hermes-keys-test"})
	if err != nil {
		t.Fatal(err)
	}
	keys := NewKeys(kb)
	bucket, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "hermes-signins-test"})
	if err != nil {
		t.Fatal(err)
	}
	signins := NewSignins(bucket, keys)
	key, _, err := keys.Create(t.Context(), NewKey{Name: "alice", Role: RoleUser})
	if err != nil {
		t.Fatal(err)
	}
	alice, err := keys.Verify(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	token, until, err := signins.Create(t.Context(), alice, time.Time{})
	if err != nil || !strings.HasPrefix(token, SigninPrefix) || time.Until(until) > SigninTTL {
		t.Fatalf("create: %q %v %v", token, until, err)
	}
	if c, err := signins.Verify(t.Context(), token); err != nil || c.ID != alice.ID || c.Role != RoleUser {
		t.Fatalf("verify: %+v %v", c, err)
	}
	e, _ := bucket.Get(t.Context(), token[3:19])
	_, secret, _ := strings.Cut(token[3:], "_")
	if strings.Contains(string(e.Value()), secret) {
		t.Fatal("the token's secret is kept")
	}
	other := "a"
	if strings.HasSuffix(token, "a") {
		other = "b"
	}
	for _, bad := range []string{"", token + "x", token[:len(token)-1] + other, "hs_" + strings.Repeat("a", 16) + "_" + strings.Repeat("b", 52), key} {
		if _, err := signins.Verify(t.Context(), bad); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("%q: %v", bad, err)
		}
	}
	// Expired.
	signins.now = func() time.Time { return time.Now().Add(SigninTTL + time.Minute) }
	if _, err := signins.Verify(t.Context(), token); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("expired: %v", err)
	}
	signins.now = time.Now
	// The key revoked.
	if _, err := keys.Revoke(t.Context(), "alice"); err != nil {
		t.Fatal(err)
	}
	if _, err := signins.Verify(t.Context(), token); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("key revoked: %v", err)
	}
	// Signed out.
	bob := &Caller{ID: "oidc:https://idp#bob", Name: "bob", Role: RoleOperator}
	token, _, err = signins.Create(t.Context(), bob, time.Now().Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if c, err := signins.Verify(t.Context(), token); err != nil || c.Name != "bob" {
		t.Fatalf("bob: %+v %v", c, err)
	}
	if err := signins.Delete(t.Context(), token); err != nil {
		t.Fatal(err)
	}
	if _, err := signins.Verify(t.Context(), token); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("signed out: %v", err)
	}
	if err := signins.Delete(t.Context(), token); err != nil {
		t.Errorf("signing out twice: %v", err)
	}
}

func FuzzDecodeSignin(f *testing.F) {
	f.Add("aaaaaaaaaaaaaaaa", []byte(`{"id":"aaaaaaaaaaaaaaaa","hash":"`+strings.Repeat("0", 64)+`","caller":{"id":"key:x","role":"user"},"expires":"2030-01-01T00:00:00Z"}`))
	f.Add("aaaaaaaaaaaaaaaa", []byte(`{}`))
	f.Fuzz(func(t *testing.T, id string, data []byte) {
		s, err := decodeSignin(id, data)
		if err == nil && (s.ID != id || s.Caller.ID == "") {
			t.Fatalf("%q under %q: %+v", data, id, s)
		}
	})
}
