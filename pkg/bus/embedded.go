package bus

import (
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// ServerConfig configures an embedded NATS server with JetStream.
type ServerConfig struct {
	// Name of the server. Default "hermes"; required, and unique, for a cluster node.
	Name string
	// StoreDir holds JetStream's file store. Required.
	StoreDir string
	// Listen is host:port for client connections; empty means in-process connections only.
	Listen string
	// SyncAlways fsyncs every write before acking it: slower, but an acked message survives a
	// power loss. Without it the store syncs on an interval (a process crash loses nothing).
	SyncAlways bool
	// Cluster, when set, makes the server one node of a JetStream cluster; Name must then be
	// unique among the nodes.
	Cluster *ClusterConfig
	// MaxFileStore bounds JetStream's file store (max_file_store): the streams' and buckets'
	// byte limits must fit in it (StoreBytes). Default DefaultMaxFileStore.
	MaxFileStore int64
	// Users, when set, are the only ones let in, each with its permissions (User.Access);
	// none lets anyone in to do anything.
	Users []User
	// Passwords are users who authenticate with a password (in the URL: nats://name:pw@host),
	// each with its role's permissions.
	Passwords []PasswordUser
	// Buckets are the application's buckets, whose rights the users' permissions include
	// (Bucket.Watchers, Bucket.Writers).
	Buckets []Bucket
	// Logger receives the server's notices and errors; nil discards them.
	Logger *slog.Logger
}

// DefaultMaxFileStore is the embedded server's file store limit where none is configured: room
// for the default limits of every stream and bucket (StoreBytes), with a margin.
const DefaultMaxFileStore = 16 << 30

// ClusterConfig makes an embedded server a node of a JetStream cluster. Every node has the same
// Name and Routes; JetStream needs routes configured from the start (a node with none does not
// start clustered).
type ClusterConfig struct {
	// Name of the cluster, the same on every node. Required.
	Name string
	// Listen is host:port where this node accepts routes from the others. Required; port 0
	// picks a free one (then no other node can be configured to reach this one in advance).
	Listen string
	// Routes are the nodes' route URLs, nats-route://host:port; listing this node too is
	// harmless, so every node can be given the same list. At least one is required.
	Routes []string
}

// MaxPayload is the largest message the embedded server accepts (NATS' max_payload).
const MaxPayload = 8 << 20

// Server is a running embedded NATS server.
type Server struct {
	*server.Server
}

// StartServer starts an embedded NATS server with JetStream and waits until it accepts
// connections.
func StartServer(cfg ServerConfig) (*Server, error) {
	if cfg.StoreDir == "" {
		return nil, fmt.Errorf("bus: embedded server needs a store directory")
	}
	opts := &server.Options{
		ServerName: cfg.Name,
		JetStream:  true,
		StoreDir:   cfg.StoreDir,
		SyncAlways: cfg.SyncAlways,
		NoSigs:     true,
		NoLog:      cfg.Logger == nil,
		// One bus message carries a whole response; NATS' default of 1 MiB is tight for that.
		MaxPayload: MaxPayload,
		// Set, not left to the server's default (a share of the free disk), so that Hermes'
		// limits fit whatever the machine.
		JetStreamMaxStore: cfg.MaxFileStore,
		// A client cut off silently (its link down, not closed) is dropped after about 15 s of
		// unanswered pings, not the default 4 minutes: until then the server hands it the
		// messages its pull requests ask for, and they wait out their ack deadline unseen.
		PingInterval: 5 * time.Second,
		MaxPingsOut:  3,
	}
	if opts.JetStreamMaxStore <= 0 {
		opts.JetStreamMaxStore = DefaultMaxFileStore
	}
	if len(cfg.Users) > 0 || len(cfg.Passwords) > 0 {
		if cfg.Cluster == nil {
			if err := moveGlobalStore(cfg.StoreDir, cfg.Logger); err != nil {
				return nil, err
			}
		}
		// The same configuration hermes nats-auth writes for a deployment.
		conf, err := AuthConf(cfg.Users, cfg.Buckets, cfg.Passwords...)
		if err != nil {
			return nil, err
		}
		if err := opts.ProcessConfigString(conf); err != nil {
			return nil, fmt.Errorf("bus: embedded server's users: %w", err)
		}
	}
	if opts.ServerName == "" {
		if cfg.Cluster != nil {
			return nil, fmt.Errorf("bus: a cluster node needs a name of its own")
		}
		opts.ServerName = "hermes"
	}
	if cfg.Listen == "" {
		opts.DontListen = true
	} else {
		host, port, err := hostPort(cfg.Listen)
		if err != nil {
			return nil, err
		}
		opts.Host, opts.Port = host, port
	}
	if c := cfg.Cluster; c != nil {
		if c.Name == "" || c.Listen == "" || len(c.Routes) == 0 {
			return nil, fmt.Errorf("bus: a cluster node needs a cluster name, a route listen address and routes")
		}
		host, port, err := hostPort(c.Listen)
		if err != nil {
			return nil, err
		}
		// Links between nodes keep pings of their own, slower than the clients' above:
		// a busy link pings even while it carries replication, and one dropped on a stall
		// costs an election. About 30 s of silence drops it.
		opts.Cluster = server.ClusterOpts{Name: c.Name, Host: host, Port: port, PingInterval: 10 * time.Second, MaxPingsOut: 3}
		for _, r := range c.Routes {
			u, err := url.Parse(r)
			if err != nil || u.Host == "" {
				return nil, fmt.Errorf("bus: cluster route %q: want nats-route://host:port", r)
			}
			opts.Routes = append(opts.Routes, u)
		}
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("bus: embedded server: %w", err)
	}
	if cfg.Logger != nil {
		s.SetLoggerV2(&serverLogger{l: cfg.Logger}, false, false, false)
	}
	s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("bus: embedded server not ready within 30 s")
	}
	return &Server{Server: s}, nil
}

// moveGlobalStore moves the JetStream data a server without users kept in the global account
// ($G) to Hermes' account, where the services are once they have users: without it, a store
// made before would look empty (and be provisioned anew beside the old one). It moves nothing
// when Hermes' account has data already.
func moveGlobalStore(storeDir string, log *slog.Logger) error {
	global := filepath.Join(storeDir, server.JetStreamStoreDir, "$G")
	hermes := filepath.Join(storeDir, server.JetStreamStoreDir, AccountHermes)
	if _, err := os.Stat(global); err != nil {
		return nil
	}
	if _, err := os.Stat(hermes); err == nil {
		orDiscard(log).Warn("the store holds JetStream data of the global account, from before Hermes' services had users, beside the account's own: left where it is", "dir", global)
		return nil
	}
	if err := os.Rename(global, hermes); err != nil {
		return fmt.Errorf("bus: move the store's data to account %s: %w", AccountHermes, err)
	}
	orDiscard(log).Warn("moved the JetStream data of the global account to Hermes' account: its services now have users", "from", global, "to", hermes)
	return nil
}

// hostPort splits a listen address; port 0 becomes the server's "pick a free port".
func hostPort(addr string) (string, int, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("bus: listen address %q: %w", addr, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return "", 0, fmt.Errorf("bus: listen port %q: %w", port, err)
	}
	if p == 0 {
		p = server.RANDOM_PORT
	}
	return host, p, nil
}

// ConnectOption returns the nats.Option that connects in-process to s (no TCP); pass "" as the
// URL to nats.Connect or Connect. The connection's writes are queued, not handed to the server
// while the writer waits (decoupledConn).
func (s *Server) ConnectOption() nats.Option { return nats.InProcessServer(inProcessServer{s.Server}) }

// Close shuts the server down and waits until it has stopped.
func (s *Server) Close() {
	s.Shutdown()
	s.WaitForShutdown()
}

// serverLogger adapts slog to the server's logger interface.
type serverLogger struct{ l *slog.Logger }

func (s *serverLogger) Noticef(format string, v ...any) { s.l.Debug(fmt.Sprintf(format, v...)) }
func (s *serverLogger) Warnf(format string, v ...any)   { s.l.Warn(fmt.Sprintf(format, v...)) }
func (s *serverLogger) Fatalf(format string, v ...any)  { s.l.Error(fmt.Sprintf(format, v...)) }
func (s *serverLogger) Errorf(format string, v ...any)  { s.l.Error(fmt.Sprintf(format, v...)) }
func (s *serverLogger) Debugf(format string, v ...any)  { s.l.Debug(fmt.Sprintf(format, v...)) }
func (s *serverLogger) Tracef(format string, v ...any)  {}
