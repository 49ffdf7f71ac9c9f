package service

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sync/errgroup"
)

// Service is one part of a Hermes process: the gateway, a router, a tool worker, the
// dead-letter processor, the summarizer, the bus ingress, the demo tools. Run does its work
// until ctx ends and returns once it has stopped; an error before then stops the process.
type Service interface {
	Name() string
	Run(ctx context.Context) error
}

// Validator is a Service that checks its configuration before any service of its process
// runs: a process with a service configured wrong starts nothing.
type Validator interface {
	Validate() error
}

// Phase says when a service stops.
type Phase int

const (
	// Front services take new work from outside (the gateway's HTTP clients, external NATS
	// clients, the demo tools' callers): on shutdown they stop first and let what they
	// accepted drain, while the back still runs to finish it.
	Front Phase = iota
	// Back services finish what was accepted (routers, tool workers, dead letters, the
	// summarizer, the contracts followed): they stop once every front service has returned.
	Back
)

// Func is a Service of a name and a function.
func Func(name string, run func(context.Context) error) Service { return funcService{name, run} }

type funcService struct {
	name string
	run  func(context.Context) error
}

func (f funcService) Name() string                  { return f.name }
func (f funcService) Run(ctx context.Context) error { return f.run(ctx) }

// List is the services of one process, each in its phase, in the order added. Its zero value
// is empty and ready.
type List struct {
	entries []entry
}

type entry struct {
	phase Phase
	svc   Service
}

// Add adds services in phase.
func (l *List) Add(phase Phase, svcs ...Service) {
	for _, s := range svcs {
		l.entries = append(l.entries, entry{phase, s})
	}
}

// Append adds other's services, each in its phase, after l's.
func (l *List) Append(other *List) { l.entries = append(l.entries, other.entries...) }

// Names are the services' names, in the order added.
func (l *List) Names() []string {
	out := make([]string, 0, len(l.entries))
	for _, e := range l.entries {
		out = append(out, e.svc.Name())
	}
	return out
}

// Validate checks every service that validates its configuration, and says what is wrong
// with each (named).
func (l *List) Validate() error {
	var errs []error
	for _, e := range l.entries {
		if v, ok := e.svc.(Validator); ok {
			if err := v.Validate(); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", e.svc.Name(), err))
			}
		}
	}
	return errors.Join(errs...)
}

// Run validates the services, then runs them until ctx ends, and stops them in two phases:
// the front first (each stops taking work and drains what it accepted while the back still
// runs), then the back. If any service fails, every service stops, front first. It returns
// the first failure, named by its service (nil when they stopped because ctx ended and
// returned nothing but that).
func (l *List) Run(ctx context.Context) error {
	if err := l.Validate(); err != nil {
		return err
	}
	frontCtx, stopFront := context.WithCancelCause(ctx)
	defer stopFront(nil)
	backCtx, stopBack := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBack()
	var front, back errgroup.Group
	for _, e := range l.entries {
		group, ctx := &back, backCtx
		if e.phase == Front {
			group, ctx = &front, frontCtx
		}
		group.Go(func() error {
			err := e.svc.Run(ctx)
			if err == nil || ctx.Err() != nil && errors.Is(err, context.Canceled) {
				return nil
			}
			err = fmt.Errorf("%s: %w", e.svc.Name(), err)
			stopFront(err) // everything stops: the front first
			return err
		})
	}
	err := front.Wait()
	<-frontCtx.Done() // the front phase ends with ctx (or a failure), whether or not any service is in it
	stopBack()
	if berr := back.Wait(); err == nil {
		err = berr
	}
	if err == nil {
		if cause := context.Cause(frontCtx); cause != nil && !errors.Is(cause, context.Canceled) {
			err = cause
		}
	}
	return err
}
