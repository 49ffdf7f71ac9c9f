package httpexec

import (
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// A forged or mistaken call to the cloud metadata address, or to this machine through a name,
// is refused at the dial: no request leaves, and the result says why (never retried).
func TestDestinationsWorkersDoNotCall(t *testing.T) {
	for _, target := range []string{
		"http://169.254.169.254/latest/meta-data/iam/security-credentials/?token=s3cret",
		"http://[fe80::1]:80/x",
		"http://0.0.0.0:9/x",
		"http://[fd00:ec2::254]/latest/meta-data/",
	} {
		out := execute(t, newExecutor(t, nil), httpCall("GET", target, `{}`, nil))
		r := out.Result
		if r.ErrorCode != protocol.CodeDestinationRefused || r.ErrorOrigin != protocol.OriginHermes || out.Retryable {
			t.Errorf("%s: %s/%s retryable=%v %s", target, r.ErrorCode, r.ErrorOrigin, out.Retryable, r.Content)
		}
		if strings.Contains(string(r.Content), "s3cret") || strings.Contains(r.RecoveryHint, "s3cret") {
			t.Errorf("%s: the URL's query reached the result: %s", target, r.Content)
		}
	}
}

// A name that resolves to this machine (here: the machine's own name, where /etc/hosts maps it
// to a loopback address) is refused: only a route that writes localhost or the address
// reaches it.
func TestLoopbackThroughANameIsRefused(t *testing.T) {
	name, err := os.Hostname()
	if err != nil {
		t.Skip(err)
	}
	addrs, _ := net.LookupHost(name)
	loop := false
	for _, a := range addrs {
		if ip, err := netip.ParseAddr(a); err == nil && ip.Unmap().IsLoopback() {
			loop = true
		}
	}
	if !loop {
		t.Skipf("%s resolves to %v here, not to a loopback address (checkDestination is tested alone above)", name, addrs)
	}
	srv, reqs := toolServer(t, nil)
	port := srv.URL[strings.LastIndexByte(srv.URL, ':')+1:]
	out := execute(t, newExecutor(t, nil), httpCall("GET", "http://"+name+":"+port+"/x", `{}`, nil))
	if r := out.Result; r.ErrorCode != protocol.CodeDestinationRefused || out.Retryable {
		t.Fatalf("%s, a name for this machine: %s %s", name, r.ErrorCode, r.Content)
	}
	noRequest(t, reqs)
	wantOK(t, execute(t, newExecutor(t, nil), httpCall("GET", "http://localhost:"+port+"/x", `{}`, nil)))
}
