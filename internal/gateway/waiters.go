package gateway

import (
	"sync"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// waiters hands responses seen on the bus to the HTTP handlers waiting for them.
type waiters struct {
	mu sync.Mutex
	m  map[string][]chan *protocol.Response
}

// add registers interest in requestID; call the returned func when done waiting.
func (w *waiters) add(requestID string) (<-chan *protocol.Response, func()) {
	ch := make(chan *protocol.Response, 1)
	w.mu.Lock()
	if w.m == nil {
		w.m = map[string][]chan *protocol.Response{}
	}
	w.m[requestID] = append(w.m[requestID], ch)
	w.mu.Unlock()
	return ch, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		list := w.m[requestID]
		for i, c := range list {
			if c == ch {
				list = append(list[:i], list[i+1:]...)
				break
			}
		}
		if len(list) == 0 {
			delete(w.m, requestID)
		} else {
			w.m[requestID] = list
		}
	}
}

// deliver hands r to everyone waiting for it, without blocking.
func (w *waiters) deliver(r *protocol.Response) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ch := range w.m[r.RequestID] {
		select {
		case ch <- r:
		default:
		}
	}
}
