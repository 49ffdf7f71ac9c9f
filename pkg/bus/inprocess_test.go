package bus

import (
	"bytes"
	"errors"
	"io"
	"net"
	"runtime"
	"testing"
	"time"
)

func TestDecoupledConnWritesWithoutAReader(t *testing.T) {
	server, client := net.Pipe()
	d := newDecoupledConn(client)
	defer func() { server.Close(); d.Close() }() // nothing reads: no drain to wait for
	done := make(chan error, 1)
	go func() { // nobody reads yet: a bare pipe would block here
		_, err := d.Write([]byte("PUB a 1\r\nx\r\n"))
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a write waited for the server to read it")
	}
}

func TestDecoupledConnKeepsOrderAndBoundsWhatWaits(t *testing.T) {
	server, client := net.Pipe()
	defer server.Close()
	d := newDecoupledConn(client)
	defer d.Close()
	chunk := bytes.Repeat([]byte{0}, 64<<10)
	total := 2*decoupledWriteBuffer + len(chunk)
	var want bytes.Buffer
	written := make(chan struct{})
	go func() {
		defer close(written)
		for i := 0; want.Len() < total; i++ {
			for j := range chunk {
				chunk[j] = byte(i)
			}
			want.Write(chunk)
			if _, err := d.Write(chunk); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	select {
	case <-written:
		t.Fatalf("%d bytes were taken while nothing read them: more than the %d bytes allowed to wait", total, decoupledWriteBuffer)
	case <-time.After(200 * time.Millisecond):
	}
	d.mu.Lock()
	waiting := len(d.queued) + d.sending
	d.mu.Unlock()
	if waiting > decoupledWriteBuffer {
		t.Fatalf("%d bytes wait, over the bound of %d", waiting, decoupledWriteBuffer)
	}
	got := make([]byte, total)
	if _, err := io.ReadFull(server, got); err != nil {
		t.Fatal(err)
	}
	<-written
	if !bytes.Equal(got, want.Bytes()) {
		t.Fatal("the server read the bytes in another order than they were written")
	}
}

func TestDecoupledConnCloseReleasesAWaitingWriter(t *testing.T) {
	server, client := net.Pipe()
	defer server.Close()
	d := newDecoupledConn(client)
	big := make([]byte, decoupledWriteBuffer)
	if _, err := d.Write(big); err != nil { // queued; the pipe's write then waits for a reader
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := d.Write(big) // over the bound: waits
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	d.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("a writer released by Close got %v, want net.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close left a writer waiting")
	}
	if _, err := d.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("a write after Close got %v, want net.ErrClosed", err)
	}
}

func TestDecoupledConnCloseHandsOverWhatWasWritten(t *testing.T) {
	server, client := net.Pipe()
	defer server.Close()
	d := newDecoupledConn(client)
	want := bytes.Repeat([]byte("PUB a 1\r\nx\r\n"), 10_000)
	if _, err := d.Write(want); err != nil {
		t.Fatal(err)
	}
	read := make(chan []byte)
	go func() {
		got, _ := io.ReadAll(server) // until the pipe closes
		read <- got
	}()
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if got := <-read; !bytes.Equal(got, want) {
		t.Fatalf("the server read %d of the %d bytes written before Close", len(got), len(want))
	}
}

func TestDecoupledConnFailedWriteEndsTheConnection(t *testing.T) {
	server, client := net.Pipe()
	defer server.Close()
	d := newDecoupledConn(client)
	defer d.Close()
	// The server end stays open, but the pipe's next write fails (its deadline has passed).
	if err := d.SetWriteDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Write([]byte("x")); err != nil {
		t.Fatal(err) // queued; the sender finds out
	}
	if err := server.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := server.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("the server's end read %v after a write failed, want the connection ended (EOF)", err)
	}
	if _, err := d.Write([]byte("x")); err == nil {
		t.Fatal("a write was taken after the pipe broke")
	}
}

func TestDecoupledConnDroppedUnclosedIsClosed(t *testing.T) {
	server, client := net.Pipe()
	defer server.Close()
	func() { _ = newDecoupledConn(client) }() // dropped, as nats.go drops a conn whose handshake failed
	for range 100 {
		runtime.GC()
		if err := server.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); errors.Is(err, io.ErrClosedPipe) {
			return // the other end is closed
		} else if err != nil {
			t.Fatal(err)
		}
		if _, err := server.Read(make([]byte, 1)); errors.Is(err, io.EOF) {
			return
		}
	}
	t.Fatal("a connection dropped without Close was never closed: its sender goroutine and buffer stay")
}
