package bustest

import (
	"flag"
	"runtime"
	"strconv"
	"testing"
)

// Main runs a package's tests (call it from TestMain and pass its result to os.Exit). Under
// -short — the daily loop — tests that call t.Parallel run four at once per CPU, unless
// -parallel is given: a test on an embedded server mostly waits (on the bus, on the delays and
// deadlines under test, on its services' shutdown) rather than computes, and the default of one
// per CPU leaves the CPUs idle most of the time. The full suite keeps Go's default.
func Main(m *testing.M) int {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if testing.Short() && !given {
		if err := flag.Set("test.parallel", strconv.Itoa(4*runtime.GOMAXPROCS(0))); err != nil {
			panic(err)
		}
	}
	return m.Run()
}
