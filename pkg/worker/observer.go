package worker

import (
	"time"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// Observer is told what a worker does, for metrics. Its methods are called concurrently and
// must not block.
type Observer interface {
	// Started: a try of tool begins. waited is how long the call waited for a worker since
	// it was dispatched (first tries only; zero otherwise).
	Started(tool string, attempt int, waited time.Duration)
	// Finished: the try that Started announced ended after took.
	Finished(tool string, took time.Duration)
	// Retrying: a try failed with errorCode and the call will be tried again.
	Retrying(tool, errorCode string)
	// Recorded: r is now the call's one result.
	Recorded(r *protocol.ToolResult)
}

// nopObserver observes nothing.
type nopObserver struct{}

func (nopObserver) Started(string, int, time.Duration) {}
func (nopObserver) Finished(string, time.Duration)     {}
func (nopObserver) Retrying(string, string)            {}
func (nopObserver) Recorded(*protocol.ToolResult)      {}
