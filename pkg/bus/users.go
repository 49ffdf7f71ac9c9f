package bus

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// User is a NATS user of a Hermes deployment: a name (for people, and an external client's
// identity), its role, and the public half of its nkey. The seed, the secret half, stays with
// whoever connects as the user.
type User struct {
	Name string
	Role Role
	// NKey is the user's public nkey (U…).
	NKey string
}

// PasswordUser is a NATS user who authenticates with a password.
type PasswordUser struct {
	Name, Password string
	Role           Role
}

// NewUser makes a user with a fresh nkey pair and returns it with its seed.
func NewUser(name string, role Role) (User, []byte, error) {
	if _, err := AccessOf(role, name); err != nil {
		return User{}, nil, err
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return User{}, nil, fmt.Errorf("bus: make an nkey: %w", err)
	}
	return userOf(name, role, kp)
}

func userOf(name string, role Role, kp nkeys.KeyPair) (User, []byte, error) {
	pub, err := kp.PublicKey()
	if err != nil {
		return User{}, nil, fmt.Errorf("bus: nkey: %w", err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return User{}, nil, fmt.Errorf("bus: nkey: %w", err)
	}
	return User{Name: name, Role: role, NKey: pub}, seed, nil
}

// LoadOrNewUser reads the seed of user name from dir/<name>.nk, or makes one and writes it
// there (mode 0600) when there is none: how hermes up keeps its users across restarts.
func LoadOrNewUser(dir, name string, role Role) (User, string, error) {
	path := filepath.Join(dir, name+".nk")
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		u, seed, err := NewUser(name, role)
		if err != nil {
			return User{}, "", err
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return User{}, "", fmt.Errorf("bus: %w", err)
		}
		if err := os.WriteFile(path, append(seed, '\n'), 0o600); err != nil {
			return User{}, "", fmt.Errorf("bus: keep the seed of NATS user %s: %w", name, err)
		}
		return u, path, nil
	}
	if err != nil {
		return User{}, "", fmt.Errorf("bus: read the seed of NATS user %s: %w", name, err)
	}
	kp, err := nkeys.ParseDecoratedNKey(data)
	if err != nil {
		return User{}, "", fmt.Errorf("bus: %s holds no nkey seed: %w", path, err)
	}
	u, _, err := userOf(name, role, kp)
	return u, path, err
}

// SeedOption authenticates a connection with an nkey seed held in memory.
func SeedOption(seed []byte) (nats.Option, error) {
	kp, err := nkeys.FromSeed(seed)
	if err != nil {
		return nil, fmt.Errorf("bus: nkey seed: %w", err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("bus: nkey seed: %w", err)
	}
	return nats.Nkey(pub, kp.Sign), nil
}

// serverUsers turns users into the embedded server's nkey users, each with its role's
// permissions.
func serverUsers(users []User) ([]*server.NkeyUser, error) {
	var out []*server.NkeyUser
	seen := map[string]bool{}
	for _, u := range users {
		if seen[u.NKey] {
			return nil, fmt.Errorf("bus: NATS user %s: its nkey is another user's", u.Name)
		}
		seen[u.NKey] = true
		a, err := AccessOf(u.Role, u.Name)
		if err != nil {
			return nil, fmt.Errorf("bus: NATS user %s: %w", u.Name, err)
		}
		out = append(out, &server.NkeyUser{Nkey: u.NKey, Permissions: a.ServerPermissions()})
	}
	return out, nil
}

// AuthConf renders users as the authorization block of a nats-server configuration file:
// each user's nkey and its role's permissions.
func AuthConf(users []User) (string, error) {
	var b strings.Builder
	b.WriteString("# Hermes' NATS users: one per service role, each allowed only what the role needs\n")
	b.WriteString("# (made by hermes nats-auth; the seeds stay beside this file, one per user).\n")
	b.WriteString("authorization {\n  users: [\n")
	for _, u := range users {
		a, err := AccessOf(u.Role, u.Name)
		if err != nil {
			return "", fmt.Errorf("bus: NATS user %s: %w", u.Name, err)
		}
		fmt.Fprintf(&b, "    # %s (role %s)\n    {\n      nkey: %q\n", u.Name, u.Role, u.NKey)
		b.WriteString(a.Conf("      "))
		b.WriteString("    }\n")
	}
	b.WriteString("  ]\n}\n")
	return b.String(), nil
}

// Credentials say how a service authenticates to NATS: at most one of an nkey seed file and a
// creds file (a user JWT with its seed, for servers in operator mode), or user and password in
// the URL; and TLS settings. The zero value connects as the URL says.
type Credentials struct {
	// NKeyFile holds the user's nkey seed (hermes nats-auth writes one per user).
	NKeyFile string
	// CredsFile is a user credentials file (JWT and seed).
	CredsFile string
	// CAFile verifies the server's certificate; CertFile and KeyFile are the client's own
	// (for servers that verify clients).
	CAFile, CertFile, KeyFile string
	// Inbox is the reply-subject prefix, for users whose permissions name one (external
	// clients: ClientInbox); empty keeps _INBOX.
	Inbox string
}

// Options returns the connection options c describes.
func (c Credentials) Options() ([]nats.Option, error) {
	var opts []nats.Option
	if c.NKeyFile != "" && c.CredsFile != "" {
		return nil, errors.New("bus: give an nkey seed file or a creds file, not both")
	}
	if c.NKeyFile != "" {
		o, err := nats.NkeyOptionFromSeed(c.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("bus: nkey seed file %s: %w", c.NKeyFile, err)
		}
		opts = append(opts, o)
	}
	if c.CredsFile != "" {
		if _, err := os.Stat(c.CredsFile); err != nil {
			return nil, fmt.Errorf("bus: creds file: %w", err)
		}
		opts = append(opts, nats.UserCredentials(c.CredsFile))
	}
	if c.CAFile != "" {
		opts = append(opts, nats.RootCAs(c.CAFile))
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return nil, errors.New("bus: a client certificate needs both its file and its key's")
	}
	if c.CertFile != "" {
		opts = append(opts, nats.ClientCert(c.CertFile, c.KeyFile))
	}
	if c.Inbox != "" {
		opts = append(opts, nats.CustomInboxPrefix(c.Inbox))
	}
	return opts, nil
}
