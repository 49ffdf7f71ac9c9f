package httpexec

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
)

// ErrDestinationRefused is wrapped by the error of a dial to an address a worker does not call:
// link-local (where clouds serve instance metadata and credentials), unspecified, multicast, or
// loopback reached through a name rather than written in the route.
var ErrDestinationRefused = errors.New("destination refused")

// metadataAddrs are cloud metadata services outside the link-local ranges.
var metadataAddrs = []netip.Addr{
	netip.MustParseAddr("fd00:ec2::254"),   // AWS IMDS over IPv6
	netip.MustParseAddr("100.100.100.200"), // Alibaba Cloud
}

// checkDestination says whether a worker may connect to ip, for a URL whose host is
// explicitLoopback (written as localhost or a loopback address).
func checkDestination(ip netip.Addr, explicitLoopback bool) error {
	ip = ip.Unmap()
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
