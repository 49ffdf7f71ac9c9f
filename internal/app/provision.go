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
// refuses while routers run or requests wait to be routed.
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
	// An existing record keeps its partitions while the bus is opened (a service configured
	// otherwise must not move sessions); --partitions is applied below, as a migration.
	cfg.Partitions = 0
	opts, err := c.natsAuth.options()
	if err != nil {
		return err
	}
	nc, b, err := Connect(ctx, c.natsURL, c.instance, cfg, log, opts...)
	if err != nil {
		return err
	}
	defer nc.Close()
	if c.streams != 0 && c.streams != b.Layout().Streams() {
		return fmt.Errorf("provision: the record is kept in %d streams; --streams %d applies to a record not yet created (moving sessions between the streams of a record that exists is not done by hermes provision)",
			b.Layout().Streams(), c.streams)
	}
	partitions := fmt.Sprint(b.Partitions())
	var notes []string
	if c.partitions != 0 {
		done, err := b.Repartition(ctx, c.partitions)
		if err != nil {
			return err
		}
		if done.Before != done.After {
			partitions = fmt.Sprintf("%d (were %d)", done.After, done.Before)
		}
		if len(done.Raced) > 0 {
			notes = append(notes, fmt.Sprintf("partitions %v were sent requests while the number changed (a gateway still ran): they are routed, but their sessions' order against the requests sent since is not guaranteed", done.Raced))
		}
		if len(done.Kept) > 0 {
			notes = append(notes, fmt.Sprintf("partitions %v, beyond the %d, still hold requests or are read by a router: kept, routers read them until they are empty; run hermes provision --partitions %d again, with the routers stopped, to delete them",
				done.Kept, done.After, done.After))
		}
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
