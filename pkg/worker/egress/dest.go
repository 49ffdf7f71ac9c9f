package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"time"
)

// Dialer returns the dial function tool workers reach tools with. resolve maps host:port as
// written in a route to another host:port to dial (like curl --resolve): where the worker's
// operator says the tool is, dialed as said. Any other address is dialed checking, as each
// connection is made, the address connected to: never link-local (cloud metadata), unspecified
// or multicast, and loopback only when the route writes it (localhost, 127.0.0.1, [::1]).
func Dialer(resolve map[string]string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if to, ok := resolve[addr]; ok {
			return dialer.DialContext(ctx, network, to)
		}
		return guardedDialer(dialer, addr).DialContext(ctx, network, addr)
	}
}

// ErrDestinationRefused is wrapped by the error of a dial to an address a worker does not call:
// link-local (where clouds serve instance metadata and credentials), unspecified, multicast, or
// loopback reached through a name rather than written in the route.
var ErrDestinationRefused = errors.New("destination refused")

// metadataAddrs are cloud metadata services outside the link-local ranges.
var metadataAddrs = []netip.Addr{
	netip.MustParseAddr("fd00:ec2::254"),   // AWS IMDS over IPv6
	netip.MustParseAddr("fd20:ce::254"),    // Google Cloud over IPv6
	netip.MustParseAddr("100.100.100.200"), // Alibaba Cloud
	netip.MustParseAddr("168.63.129.16"),   // Azure's wire server
}

// embeddedIPv4 returns the IPv4 address an IPv6 address carries by a translation scheme
// (NAT64 64:ff9b::/96, 6to4 2002::/16, IPv4-compatible ::/96), so that it is checked too.
func embeddedIPv4(ip netip.Addr) (netip.Addr, bool) {
	if !ip.Is6() || ip.Is4In6() {
		return netip.Addr{}, false
	}
	b := ip.As16()
	switch {
	case b[0] == 0x00 && b[1] == 0x64 && b[2] == 0xff && b[3] == 0x9b && allZero(b[4:12]):
		return netip.AddrFrom4([4]byte(b[12:16])), true
	case b[0] == 0x20 && b[1] == 0x02:
		return netip.AddrFrom4([4]byte(b[2:6])), true
	case allZero(b[0:12]) && !allZero(b[12:16]) && !ip.IsLoopback():
		return netip.AddrFrom4([4]byte(b[12:16])), true
	}
	return netip.Addr{}, false
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// checkDestination says whether a worker may connect to ip, for a URL whose host is
// explicitLoopback (written as localhost or a loopback address).
func checkDestination(ip netip.Addr, explicitLoopback bool) error {
	ip = ip.Unmap()
	if v4, ok := embeddedIPv4(ip); ok {
		if err := checkDestination(v4, false); err != nil {
			return fmt.Errorf("%w (carried by %s)", err, ip)
		}
	}
	switch {
	case ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast():
		return fmt.Errorf("%w: %s is link-local (where instance metadata and its credentials live)", ErrDestinationRefused, ip)
	case ip.IsUnspecified() || ip.IsMulticast() || ip.IsInterfaceLocalMulticast():
		return fmt.Errorf("%w: %s is not an address a tool lives at", ErrDestinationRefused, ip)
	case ip.IsLoopback() && !explicitLoopback:
		return fmt.Errorf("%w: %s is this machine, reached through a name; a route calls it only by writing localhost or the address", ErrDestinationRefused, ip)
	}
	for _, m := range metadataAddrs {
		if ip == m {
			return fmt.Errorf("%w: %s is a cloud metadata service", ErrDestinationRefused, ip)
		}
	}
	return nil
}

// loopbackHost reports whether host (a URL's host, without port) names this machine in
// writing: localhost, or a loopback address.
func loopbackHost(host string) bool {
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// guardedDialer dials addr (host:port as in the URL) checking, as each connection is made, the
// address it connects to (so a name that resolves to a refused address is caught whatever the
// resolver answered, and no second lookup can differ from the one checked).
func guardedDialer(d *net.Dialer, addr string) *net.Dialer {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	explicit := loopbackHost(host)
	g := *d
	g.Control = func(network, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return fmt.Errorf("%w: cannot read the address %q", ErrDestinationRefused, address)
		}
		return checkDestination(ap.Addr(), explicit)
	}
	return &g
}
