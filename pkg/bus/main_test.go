package bus_test

import (
	"os"
	"testing"

	"github.com/hermesbus/hermes/pkg/bus/bustest"
)

func TestMain(m *testing.M) { os.Exit(bustest.Main(m)) }
