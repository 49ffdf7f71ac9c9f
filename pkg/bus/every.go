package bus

import (
	"sync"
	"time"
)

// Every runs f every d until the returned stop is called. No goroutine exists until f is
// first due, so it costs one timer for work that ends sooner. stop prevents further runs and
// waits for a run in progress; it may be called more than once.
func Every(d time.Duration, f func()) (stop func()) {
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	mu.Lock()
	t = time.AfterFunc(d, func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		f()
		t.Reset(d)
	})
	mu.Unlock()
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}
