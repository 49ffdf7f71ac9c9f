package app

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/record"
	"github.com/hermesbus/hermes/pkg/bus"
)

// RunTail prints the live message flow of every session, or of one, until Ctrl-C: hermes tail.
func RunTail(ctx context.Context, args []string, env Env) error {
	fs := newFlagSet("tail", "hermes tail [--session S] [--json] [--nats URL]", env.Stderr)
	natsURL := natsFlag(fs)
	session := fs.String("session", "", "follow this session only (default: every session)")
	asJSON := fs.Bool("json", false, "print one JSON object per message")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var filters []string
	what := "every session"
	if *session != "" {
		var err error
		if filters, err = record.SessionFilters("--session", *session); err != nil {
			return &ExitError{Code: 2, Err: fmt.Errorf("tail: %w", err)}
		}
		what = "session " + *session
	}
	nc, js, err := dialRecord(ctx, natsURL, "tail")
	if err != nil {
		return err
	}
	defer nc.Close()
	p := newPrinter(env.Stdout, *asJSON, false, colorFor(env.Stdout))
	ready := func() {
		fmt.Fprintf(env.Stderr, "following %s on %s (Ctrl-C stops)\n", what, bus.Redact(natsURL.url))
	}
	if err := record.Follow(ctx, js, filters, ready, p.print); err != nil {
		return fmt.Errorf("tail: %w", err)
	}
	return nil
}

// natsFlag registers --nats as every command has it, and the credential flags.
func natsFlag(fs *flag.FlagSet) *natsTarget {
	return natsFlags(fs, bus.DefaultURL, "NATS server URL (env "+bus.EnvURL+")")
}

// parseFlags parses flags only; a bad flag or a stray argument is a usage error (exit 2).
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &ExitError{Code: 2, Err: fmt.Errorf("%s: %w", fs.Name(), err)}
	}
	if fs.NArg() > 0 {
		return &ExitError{Code: 2, Err: fmt.Errorf("%s: unexpected argument %q (flags only; see -h)", fs.Name(), fs.Arg(0))}
	}
	return nil
}

// dialRecord connects a reader of the record. Unlike the services it provisions nothing: a
// reader must not create streams on a server that is not Hermes'.
func dialRecord(ctx context.Context, t *natsTarget, role string) (*nats.Conn, jetstream.JetStream, error) {
	opts, err := t.auth.cliOptions()
	if err != nil {
		return nil, nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	nc, err := bus.Connect(cctx, t.url, defaultInstance(role), nil, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w (is Hermes running? hermes up serves NATS at %s; elsewhere pass --nats or set %s)",
			role, err, bus.DefaultURL, bus.EnvURL)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("%s: jetstream: %w", role, err)
	}
	return nc, js, nil
}

// printer writes entries as lines of text or JSON.
type printer struct {
	w    io.Writer
	json bool
	f    record.Formatter
}

func newPrinter(w io.Writer, asJSON, date, color bool) *printer {
	p := &printer{w: w, json: asJSON}
	p.f.Date, p.f.Color = date, color
	return p
}

// colorFor reports whether lines written to w may be coloured: w is a terminal and NO_COLOR is
// not set.
func colorFor(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && isTerminal(f) && os.Getenv("NO_COLOR") == ""
}

func (p *printer) print(e *record.Entry) error {
	var line []byte
	if p.json {
		b, err := record.JSON(e)
		if err != nil {
			return err
		}
		line = append(b, '\n')
	} else {
		line = append([]byte(p.f.Format(e)), '\n')
	}
	_, err := p.w.Write(line)
	return err
}

// buffered returns w buffered, and how to flush it.
func buffered(w io.Writer) (io.Writer, func() error) {
	bw := bufio.NewWriter(w)
	return bw, bw.Flush
}
