package bus_test

import (
	"fmt"
	"slices"

	"github.com/hermesbus/hermes/pkg/bus"
)

// What a tool worker's NATS user may do, as hermes nats-auth writes it into the server's
// configuration: replies under its own inbox, cancellations; results, but no get of any
// message of the record.
func ExampleAccessOf() {
	a, err := bus.AccessOf(bus.RoleWorker, "toolworker")
	if err != nil {
		panic(err)
	}
	fmt.Println(a.Inbox)
	fmt.Println(a.Subscribe)
	fmt.Println(slices.Contains(a.Publish, "hermes.result.>"), slices.Contains(a.Publish, "$JS.API.STREAM.MSG.GET.HERMES"))
	// Output:
	// _INBOX_toolworker
	// [_INBOX_toolworker.> hermes.event.cancel.* hermes_1.event.cancel.* hermes_2.event.cancel.* hermes_3.event.cancel.* hermes_4.event.cancel.* hermes_5.event.cancel.* hermes_6.event.cancel.* hermes_7.event.cancel.* $SRV.> hermes.svc.toolworker.> hermes.fast.call.>]
	// true false
}
