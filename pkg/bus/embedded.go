package bus

import (
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// ServerConfig configures an embedded NATS server with JetStream.
type ServerConfig struct {
	// Name of the server. Default "hermes".
	Name string
	// StoreDir holds JetStream's file store. Required.
	StoreDir string
	// Listen is host:port for client connections; empty means in-process connections only.
	Listen string
	// SyncAlways fsyncs every write before acking it: slower, but an acked message survives a
	// power loss. Without it the store syncs on an interval (a process crash loses nothing).
	SyncAlways bool
	// Logger receives the server's notices and errors; nil discards them.
	Logger *slog.Logger
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
	}
	if opts.ServerName == "" {
		opts.ServerName = "hermes"
	}
	if cfg.Listen == "" {
		opts.DontListen = true
	} else {
		host, port, err := net.SplitHostPort(cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("bus: listen address %q: %w", cfg.Listen, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return nil, fmt.Errorf("bus: listen port %q: %w", port, err)
		}
		if p == 0 {
			p = server.RANDOM_PORT
		}
		opts.Host, opts.Port = host, p
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

// ConnectOption returns the nats.Option that connects in-process to s (no TCP); pass "" as the
// URL to nats.Connect or Connect.
func (s *Server) ConnectOption() nats.Option { return nats.InProcessServer(s.Server) }

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
