// Package wake wakes the goroutines waiting for something named by a key (a request's
// response, a run's end) when it happens, without blocking whoever says it happened.
package wake

import "sync"

// Waiters are the waits for keys. The zero value is ready to use; it is safe for concurrent
// use.
type Waiters struct {
	mu sync.Mutex
	m  map[string][]chan struct{}
}

// Add registers a wait for key; call the returned func when done waiting. The channel holds
// one wake-up: wakes while the waiter looks elsewhere are coalesced.
func (w *Waiters) Add(key string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	if w.m == nil {
		w.m = map[string][]chan struct{}{}
	}
	w.m[key] = append(w.m[key], ch)
	w.mu.Unlock()
	return ch, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		list := w.m[key]
		for i, c := range list {
			if c == ch {
				list = append(list[:i], list[i+1:]...)
				break
			}
		}
		if len(list) == 0 {
			delete(w.m, key)
		} else {
			w.m[key] = list
		}
	}
}

// Wake tells everyone waiting for key that it happened, without blocking.
func (w *Waiters) Wake(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ch := range w.m[key] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
