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
	other := key[:len(key)-1] + map[bool]string{true: "b", false: "a"}[strings.HasSuffix(key, "a")]
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
	list, err := keys.List(ctx)
	if err != nil || len(list) != 1 || !list[0].Revoked() || list[0].Name != "ci-bot" {
		t.Fatalf("list: %+v %v", list, err)
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
	if list, _ := keys.List(t.Context()); len(list) != 0 {
		t.Fatalf("kept %d keys", len(list))
	}
}

// A record that is not a key's (written by someone else, or damaged) names nobody.
func TestKeysRecordNotAKey(t *testing.T) {
	keys, bucket := newKeys(t)
	ctx := t.Context()
	key, rec, err := keys.Create(ctx, NewKey{Name: "app", Role: RoleUser})
	if err != nil {
		t.Fatal(err)
	}
	for _, junk := range []string{"{", `{"id":"` + rec.ID + `","role":"admin","hash":"00"}`, `{"id":"` + rec.ID + `","role":"god","hash":"` + rec.Hash + `"}`} {
		if _, err := bucket.Put(ctx, rec.ID, []byte(junk)); err != nil {
			t.Fatal(err)
		}
		if _, err := keys.Verify(ctx, key); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("record %s: %v", junk, err)
		}
	}
}

// Roles grant what the permission table says; act_for_users comes with admin or the key.
func TestRolePermissions(t *testing.T) {
	want := map[Role][]Permission{
		RoleAdmin:    Permissions,
		RoleOperator: {PermSubmit, PermReadAll, PermDeadLetters, PermReplay, PermMetrics},
		RoleUser:     {PermSubmit},
	}
	for role, perms := range want {
		for _, p := range Permissions {
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
		k, err := DecodeKey(data)
		if err == nil && (k.Role == "" || len(k.Hash) != 64 || len(k.ID) != 16) {
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
