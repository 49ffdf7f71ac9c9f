package app

import (
	"context"
	"fmt"
	"strings"

	"github.com/hermesbus/hermes/pkg/bus"
)

// RunProvision sets Hermes up on a NATS server and exits: hermes provision. It creates the
// record and dead-letter streams, the timers stream, every bucket and the fixed consumers, with
// the settings its flags give (as a service starting without --no-provision would), and reports
// where what exists differs from them, and what earlier versions left that hermes migrate
// removes. Run it once per deployment with a user that may manage streams; the services can
// then run with --no-provision and without that right. With --partitions it also changes how
// many partitions an existing record spreads requests over (bus.Bus.Repartition), which it
// refuses while routers run or requests wait to be routed; with --streams, how many streams it
// is kept in (bus.Bus.Restream), which it refuses while any service runs or anything waits.
func RunProvision(ctx context.Context, args []string, env Env) error {
	fs := newFlagSet("provision", "hermes provision [flags]", env.Stderr)
	var c common
	c.register(fs, "provision")
	log, err := parse(fs, args, env, &c.logLevel)
	if err != nil {
		return err
	}
	cfg := c.busConfig()
	cfg.NoProvision = false // provisioning is what this command is for
	// An existing record keeps its partitions and streams while the bus is opened (a service
	// configured otherwise must not move sessions); --partitions and --streams are applied
	// below, as migrations.
	cfg.Partitions, cfg.Streams = 0, 0
	opts, err := c.natsAuth.options()
	if err != nil {
		return err
	}
	nc, b, err := Connect(ctx, c.natsURL, c.instance, cfg, log, opts...)
	if err != nil {
		return err
	}
	defer nc.Close()
	before := b.Partitions()
	var notes []string
	pending, err := b.Restreaming(ctx)
	if err != nil {
		return err
	}
	// Checked before anything changes: a refusal leaves the record as it was. A change of the
	// streams left unfinished is finished first, and only by --streams naming its number.
	if pending != nil && (c.streams == 0 && c.partitions != 0 || c.streams != 0 && c.streams != pending.After) {
		return fmt.Errorf("provision: the record's streams are being changed from %d to %d, unfinished: run hermes provision --streams %d to finish that first", pending.Before, pending.After, pending.After)
	}
	restream := c.streams != 0 && (c.streams != b.Layout().Streams() || pending != nil)
	want := c.partitions
	if restream {
		if want != 0 && want%c.streams != 0 {
			return fmt.Errorf("provision: %d partitions do not divide among %d streams: each partition lies in one stream, so give a multiple of %d", want, c.streams, c.streams)
		}
		if want == 0 && before%c.streams != 0 {
			want = bus.WithDefaults(bus.Config{Streams: c.streams}).Partitions
			notes = append(notes, fmt.Sprintf("%d partitions do not divide among %d streams: the default for them, %d, instead", before, c.streams, want))
		}
		if err := b.Quiet(ctx); err != nil {
			return err
		}
	}
	repartition := func(b *bus.Bus, n int) error {
		done, err := b.Repartition(ctx, n)
		if err != nil {
			return err
		}
		if len(done.Raced) > 0 {
			notes = append(notes, fmt.Sprintf("partitions %v were sent requests while the number changed (a gateway still ran): they are routed, but their sessions' order against the requests sent since is not guaranteed", done.Raced))
		}
		if len(done.Kept) > 0 {
			notes = append(notes, fmt.Sprintf("partitions %v, beyond the %d, still hold requests or are read by a router: kept, routers read them until they are empty; run hermes provision --partitions %d again, with the routers stopped, to delete them",
				done.Kept, done.After, done.After))
		}
		return nil
	}
	// The partitions change first where the new number fits the streams the record has now,
	// after the streams otherwise (each partition must lie in one stream, before and after),
	// and through a number that fits both where neither fits the other's.
	first := want != 0 && want%b.Layout().Streams() == 0 && pending == nil
	switch {
	case first:
		if err := repartition(b, want); err != nil {
			return err
		}
	case restream && pending == nil && before%c.streams != 0:
		if err := repartition(b, lcm(b.Layout().Streams(), c.streams)); err != nil {
			return err
		}
	}
	if restream {
		done, err := b.Restream(ctx, c.streams)
		if err != nil {
			return err
		}
		notes = append(notes, fmt.Sprintf("the record is now kept in %d streams (was %d): %d sessions moved, %d messages copied, %d removed from where they were; their sequences changed",
			done.After, done.Before, done.Sessions, done.Messages, done.Removed))
		if b, err = bus.Provision(ctx, b.JS, cfg); err != nil { // the record as it is now
			return err
		}
	}
	if want != 0 && !first {
		if err := repartition(b, want); err != nil {
			return err
		}
	}
	partitions := fmt.Sprint(b.Partitions())
	if b.Partitions() != before {
		partitions = fmt.Sprintf("%d (were %d)", b.Partitions(), before)
	}
	si := b.Stream.CachedInfo()
	var out strings.Builder
	fmt.Fprintf(&out, "Hermes is set up on %s.\n", nc.ConnectedUrlRedacted())
	if n := len(b.Streams); n > 1 {
		fmt.Fprintf(&out, "  record       %d streams %s to %s (each session whole in one), %d replica(s), kept %s, %s each\n", n, si.Config.Name,
			b.Streams[n-1].CachedInfo().Config.Name, si.Config.Replicas, si.Config.MaxAge, limitText(si.Config.MaxBytes, "bytes"))
	} else {
		fmt.Fprintf(&out, "  record       stream %s, %d replica(s), kept %s, %s\n", si.Config.Name, si.Config.Replicas, si.Config.MaxAge, limitText(si.Config.MaxBytes, "bytes"))
	}
	fmt.Fprintf(&out, "  partitions   %s: requests routed at once, each session's in order\n", partitions)
	fmt.Fprintf(&out, "  dead letters stream %s\n", b.DLQ.CachedInfo().Config.Name)
	buckets := []string{bus.BucketCalls, bus.BucketClaims, bus.BucketSessions, bus.BucketParked, bus.BucketTools, bus.BucketContracts}
	for _, a := range Buckets(cfg) {
		buckets = append(buckets, a.Name)
	}
	fmt.Fprintf(&out, "  buckets      %s\n", strings.Join(buckets, ", "))
	for _, d := range b.Drift {
		fmt.Fprintf(&out, "  differs: %s\n", d)
	}
	for _, n := range notes {
		fmt.Fprintf(&out, "  note: %s\n", n)
	}
	if left, err := earlierLayouts(ctx, b); err != nil {
		return err
	} else if len(left) > 0 {
		fmt.Fprintf(&out, "  earlier      %s: left by earlier versions and not used by this one: run hermes migrate\n", strings.Join(left, ", "))
	}
	fmt.Fprintf(&out, "Services may now run with --no-provision.\n")
	fmt.Fprint(env.Stdout, out.String())
	return nil
}

func limitText(n int64, unit string) string {
	if n < 0 {
		return "no limit in " + unit
	}
	return fmt.Sprintf("at most %d %s", n, unit)
}

// lcm is the least common multiple of a and b (both positive).
func lcm(a, b int) int {
	x, y := a, b
	for y != 0 {
		x, y = y, x%y
	}
	return a / x * b
}
