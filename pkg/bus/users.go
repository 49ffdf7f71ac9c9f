package bus

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// User is a NATS user of a Hermes deployment: a name (for people, and an external client's
// identity), its role, and the public half of its nkey. The seed, the secret half, stays with
// whoever connects as the user.
type User struct {
	Name string
	Role Role
	// NKey is the user's public nkey (U…).
	NKey string
	// Tools, for a tool worker's user, are the only tools it serves (WorkerAccessFor); empty,
	// it serves every tool (the role's permissions). Users of other roles have none.
	Tools []string
}

// Access returns the user's permissions: its role's (AccessOf), or, for a tool worker's user
// with Tools, those of a worker of these tools only (WorkerAccessFor); with what the
// application's buckets let its role do.
func (u User) Access(buckets ...Bucket) (Access, error) {
	if len(u.Tools) == 0 {
		return AccessOf(u.Role, u.Name, buckets...)
	}
	if u.Role != RoleWorker {
		return Access{}, fmt.Errorf("NATS user %s: only a %s user serves some tools only, not a %s", u.Name, RoleWorker, u.Role)
	}
	return WorkerAccessFor(u.Name, u.Tools, buckets...)
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
	if st, err := os.Stat(path); err == nil && st.Mode().Perm()&0o077 != 0 {
		return User{}, "", fmt.Errorf("bus: %s, the seed of NATS user %s, may be read by others (mode %v): chmod 600 it, or make a new one", path, name, st.Mode().Perm())
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

// Accounts of a Hermes deployment's NATS server. Hermes' services share one; external clients
// are in another, which reaches Hermes' only through the import of their request subjects (a
// service import: the stream's acknowledgement goes back to the publisher, whatever reply
// subject it named, so a client cannot direct the server to publish anywhere in Hermes'
// account).
const (
	AccountHermes  = "HERMES"
	AccountClients = "CLIENTS"
)

// AuthConf renders users and passwords as the accounts block of a nats-server configuration
// file: Hermes' account with JetStream and the services' users, the clients' account with
// theirs, each user with its permissions (User.Access: its role's, or a worker's of some tools,
// with what the application's buckets let it do).
func AuthConf(users []User, buckets []Bucket, passwords ...PasswordUser) (string, error) {
	if err := checkBuckets(buckets); err != nil {
		return "", err
	}
	var services, clients strings.Builder
	seen := map[string]string{}
	for _, u := range users {
		if err := protocol.CheckID("NATS user", u.Name); err != nil {
			return "", fmt.Errorf("bus: %w", err)
		}
		if other, dup := seen[u.NKey]; dup {
			return "", fmt.Errorf("bus: NATS users %s and %s have the same nkey", other, u.Name)
		}
		seen[u.NKey] = u.Name
		if !strings.HasPrefix(u.NKey, "U") || len(u.NKey) != 56 {
			return "", fmt.Errorf("bus: NATS user %s: %q is no user nkey", u.Name, u.NKey)
		}
		a, err := u.Access(buckets...)
		if err != nil {
			return "", fmt.Errorf("bus: NATS user %s: %w", u.Name, err)
		}
		b := &services
		if u.Role == RoleClient {
			b = &clients
		}
		what := "role " + string(u.Role)
		if len(u.Tools) > 0 {
			what += ", tools " + strings.Join(u.Tools, ",")
		}
		fmt.Fprintf(b, "      # %s (%s)\n      {\n        nkey: %q\n", u.Name, what, u.NKey)
		b.WriteString(a.Conf("        "))
		b.WriteString("      }\n")
	}
	for _, u := range passwords {
		if err := protocol.CheckID("NATS user", u.Name); err != nil {
			return "", fmt.Errorf("bus: %w", err)
		}
		if u.Role == RoleClient || !plainPassword(u.Password) {
			return "", fmt.Errorf("bus: NATS user %s: a password user must be of a service role, with a password of plain characters", u.Name)
		}
		a, err := AccessOf(u.Role, u.Name, buckets...)
		if err != nil {
			return "", fmt.Errorf("bus: NATS user %s: %w", u.Name, err)
		}
		fmt.Fprintf(&services, "      # %s (role %s)\n      {\n        user: %q\n        password: %q\n", u.Name, u.Role, u.Name, u.Password)
		services.WriteString(a.Conf("        "))
		services.WriteString("      }\n")
	}
	var b strings.Builder
	b.WriteString("# Hermes' NATS users: one per service role, each allowed only what the role needs, and\n")
	b.WriteString("# external clients, in an account of their own, that may publish their requests only\n")
	b.WriteString("# (made by hermes nats-auth; the seeds stay beside this file, one per user).\n")
	b.WriteString("accounts {\n")
	fmt.Fprintf(&b, "  %s {\n    jetstream: enabled\n    users: [\n%s    ]\n", AccountHermes, services.String())
	fmt.Fprintf(&b, "    exports: [ { service: %q, response_threshold: %q, accounts: [%q] }, { stream: %q, accounts: [%q] } ]\n  }\n",
		FilterClientSubjects, ClientReplyWithin.String(), AccountClients, protocol.FilterClientOut, AccountClients)
	fmt.Fprintf(&b, "  %s {\n    users: [\n%s    ]\n", AccountClients, clients.String())
	fmt.Fprintf(&b, "    imports: [ { service: { account: %s, subject: %q } }, { stream: { account: %s, subject: %q } } ]\n  }\n}\n",
		AccountHermes, FilterClientSubjects, AccountHermes, protocol.FilterClientOut)
	return b.String(), nil
}

// plainPassword reports whether p is a password AuthConf can write as it is: printable ASCII
// without quotes, backslashes or spaces, 8 to 128 characters.
func plainPassword(p string) bool {
	if len(p) < 8 || len(p) > 128 {
		return false
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; c <= ' ' || c > '~' || c == '"' || c == '\\' || c == '\'' {
			return false
		}
	}
	return true
}

// FilterClientSubjects is what the clients' account imports from Hermes': the subjects of
// external clients' requests.
const FilterClientSubjects = "hermes.client.>"

// ClientReplyWithin is how long Hermes may take to answer a client's call of its micro service
// (the export's response threshold): a reply later than that never reaches the client.
const ClientReplyWithin = 6 * time.Minute

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
	// Inbox is the reply-subject prefix the user's permissions name (Access.Inbox: a service
	// role's RoleInbox, an external client's ClientInbox); empty keeps _INBOX, which only admin
	// may use. Connect refuses a connection that may not receive replies under it
	// (ErrInboxRefused).
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
