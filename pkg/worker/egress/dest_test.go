package egress

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
)

// The addresses a worker never connects to, and loopback only when written.
func TestDestinations(t *testing.T) {
	for _, c := range []struct {
		ip       string
		explicit bool
		ok       bool
	}{
		{"127.0.0.1", true, true}, {"::1", true, true}, {"127.0.0.1", false, false}, {"::ffff:127.0.0.1", false, false},
		{"169.254.169.254", true, false}, {"10.1.2.3", false, true}, {"203.0.113.5", false, true}, {"100.100.100.200", false, false},
		{"224.0.0.1", false, false}, {"64:ff9b::a9fe:a9fe", false, false}, {"2002:a9fe:a9fe::1", false, false},
		{"::a9fe:a9fe", false, false}, {"168.63.129.16", false, false}, {"fd20:ce::254", false, false},
		{"64:ff9b::cb00:7105", false, true}, {"2001:db8::1", false, true},
	} {
		err := checkDestination(netip.MustParseAddr(c.ip), c.explicit)
		if (err == nil) != c.ok {
			t.Errorf("%s (written: %v): %v", c.ip, c.explicit, err)
		}
	}
	for host, want := range map[string]bool{"localhost": true, "LOCALHOST.": true, "127.0.0.1": true, "[::1]": true, "api.localhost": true,
		"evil.example": false, "127.0.0.1.nip.io": false, "10.0.0.1": false} {
		if got := loopbackHost(host); got != want {
			t.Errorf("loopbackHost(%q) = %v", host, got)
		}
	}
}

// Dialer refuses a name that leads to this machine, and dials what --resolve maps as mapped.
func TestDialerRefusesLoopbackThroughAName(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	dial := Dialer(map[string]string{"profile-service:50051": ln.Addr().String()})
	for addr, ok := range map[string]bool{"127.0.0.1:" + port: true, "localhost:" + port: true, "profile-service:50051": true,
		"169.254.169.254:80": false, "0.0.0.0:" + port: false} {
		c, err := dial(context.Background(), "tcp", addr)
		if c != nil {
			c.Close()
		}
		if (err == nil) != ok || (!ok && !errors.Is(err, ErrDestinationRefused)) {
			t.Errorf("%s: %v, want allowed=%v", addr, err, ok)
		}
	}
	name, err := os.Hostname()
	if err != nil {
		return
	}
	if addrs, _ := net.LookupHost(name); len(addrs) > 0 {
		if ip, err := netip.ParseAddr(addrs[0]); err == nil && ip.Unmap().IsLoopback() {
			if _, err := dial(context.Background(), "tcp", net.JoinHostPort(name, port)); !errors.Is(err, ErrDestinationRefused) {
				t.Errorf("%s, a name for this machine: %v, want refused", name, err)
			}
		}
	}
}
