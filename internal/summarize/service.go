package summarize

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/internal/service"
	"github.com/hermesbus/hermes/pkg/bus"
)

// Service runs the summarizer of a process: a Summarizer on the bus's summarizer consumer
// of each record stream (bus.ConsumerSummarizer), found again when it is missing or fails, until ctx ends.
type Service struct {
	Bus       *bus.Bus
	Publisher *bus.Publisher // records the summaries
	LLM       Completer
	// Every, RunTimeout and Summarized are the Summarizer's.
	Every      int
	RunTimeout time.Duration
	Summarized func(ok bool)
	Logger     *slog.Logger
}

// Name names the service.
func (s *Service) Name() string { return "summarizer" }

// Validate says what the summarizer lacks to run.
func (s *Service) Validate() error {
	switch {
	case s.Bus == nil || s.Publisher == nil || s.LLM == nil:
		return errors.New("summarize: Bus, Publisher and LLM are required")
	case s.Every < 0:
		return fmt.Errorf("summarize: Every %d: give 0 (the default, %d) or more messages", s.Every, DefaultEvery)
	}
	return nil
}

// Run summarizes until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	log := s.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// One summarizer per record stream: each session's decisions are all in one.
	var wg sync.WaitGroup
	for k := range s.Bus.Streams {
		get := func(ctx context.Context) (jetstream.Consumer, error) {
			return s.Bus.ConsumerIn(ctx, k, bus.ConsumerSummarizer)
		}
		wg.Go(func() {
			service.Consume(ctx, log, "sessions' decisions (for their summaries)", get, func(ctx context.Context, c jetstream.Consumer) error {
				sum := &Summarizer{JS: s.Bus.JS, Layout: s.Bus.Layout(), Consumer: c, Publisher: s.Publisher, LLM: s.LLM, Every: s.Every, Logger: log,
					RunTimeout: s.RunTimeout, Summarized: s.Summarized}
				return sum.Run(ctx)
			})
		})
	}
	wg.Wait()
	return nil
}
