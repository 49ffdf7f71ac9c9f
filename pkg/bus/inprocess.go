package bus

import (
	"net"
	"runtime"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// inProcessServer hands nats.go in-process connections to an embedded server whose writes do
// not wait for the server to read them (decoupledConn).
type inProcessServer struct {
	s nats.InProcessConnProvider
}

func (p inProcessServer) InProcessConn() (net.Conn, error) {
	c, err := p.s.InProcessConn()
	if err != nil {
		return nil, err
	}
	return newDecoupledConn(c), nil
}

// decoupledWriteBuffer bounds what one connection may have written that the server has not
// yet read; a write beyond it waits, as a full socket buffer makes a TCP write wait.
const decoupledWriteBuffer = 4 << 20

// decoupledDrain bounds how long Close waits for what was written before it to reach the server.
const decoupledDrain = 2 * time.Second

// decoupledConn is an in-process connection (a synchronous net.Pipe) whose writes return once
// queued, as a write to a TCP socket returns once the kernel holds it: a goroutine of its own
// hands them to the server. On a bare pipe a write returns only when the server's read loop
// has read all of it, and that loop reads the next bytes only after handling those before —
// while nats.go's flusher holds the connection's lock, so every goroutine publishing on that
// connection waits for the server's handling of earlier messages (BENCHMARKS.md, "Throughput
// and cores"). Bytes are written in order, whole, and at most decoupledWriteBuffer of them wait
// at a time. Close hands the server what was written before it (within decoupledDrain), as a
// socket's close still sends what the kernel holds. Reads, deadlines and addresses are the
// pipe's.
type decoupledConn struct {
	*pipeWriter
}

// pipeWriter is a decoupledConn's state, which its sender goroutine holds: a decoupledConn that
// nats.go drops without closing (it replaces a connection whose handshake failed) is closed
// when collected, and its sender ends, as a dropped socket's file is closed.
type pipeWriter struct {
	net.Conn

	mu      sync.Mutex
	cond    *sync.Cond // signalled when queued grows or shrinks, or the conn closes
	queued  []byte     // written, not yet handed to the pipe
	sending int        // bytes the writer goroutine holds, handed to the pipe
	closing bool       // no more writes: the sender stops once queued is empty
	err     error      // why there are no more writes: the pipe's write error, or net.ErrClosed
	sent    chan struct{}
}

func newDecoupledConn(c net.Conn) *decoupledConn {
	w := &pipeWriter{Conn: c, sent: make(chan struct{})}
	w.cond = sync.NewCond(&w.mu)
	go w.send()
	d := &decoupledConn{w}
	runtime.AddCleanup(d, (*pipeWriter).abort, w)
	return d
}

// Write queues b and returns, waiting first while the queue holds decoupledWriteBuffer bytes.
// It returns the error of an earlier write that failed, or net.ErrClosed after Close.
func (d *pipeWriter) Write(b []byte) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for d.err == nil && len(d.queued)+d.sending > 0 && len(d.queued)+d.sending+len(b) > decoupledWriteBuffer {
		d.cond.Wait()
	}
	if d.err != nil {
		return 0, d.err
	}
	d.queued = append(d.queued, b...)
	d.cond.Broadcast()
	return len(b), nil
}

// send hands what is queued to the pipe, in order, until the conn is closing and nothing is
// left. A failed write closes the pipe: the reader sees the connection end, and nats.go
// reconnects, as after a broken socket.
func (d *pipeWriter) send() {
	defer close(d.sent)
	var buf []byte
	for {
		d.mu.Lock()
		d.sending = 0
		d.cond.Broadcast()
		for !d.closing && len(d.queued) == 0 {
			d.cond.Wait()
		}
		if len(d.queued) == 0 {
			d.mu.Unlock()
			return
		}
		buf, d.queued = d.queued, buf[:0]
		d.sending = len(buf)
		d.mu.Unlock()
		if _, err := d.Conn.Write(buf); err != nil {
			d.end(err, true)
			_ = d.Conn.Close()
			return
		}
	}
}

// end refuses further writes (with err, unless an earlier one was given) and wakes the sender
// and the writers waiting; drop also drops what is queued.
func (d *pipeWriter) end(err error, drop bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closing = true
	if d.err == nil {
		d.err = err
	}
	if drop {
		d.queued = nil
	}
	d.cond.Broadcast()
}

// Close refuses further writes, waits (at most decoupledDrain) until what was written before
// reached the server, and closes the pipe.
func (d *pipeWriter) Close() error {
	d.end(net.ErrClosed, false)
	t := time.NewTimer(decoupledDrain)
	defer t.Stop()
	select {
	case <-d.sent:
	case <-t.C: // the server reads no more: what is left is dropped
	}
	return d.Conn.Close()
}

// abort closes the pipe without handing over what is queued: nobody holds the connection.
func (d *pipeWriter) abort() {
	d.end(net.ErrClosed, true)
	_ = d.Conn.Close()
}
