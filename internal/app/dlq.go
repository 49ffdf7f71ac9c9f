package app

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/hermesbus/hermes/internal/deadletter"
)

// RunDLQ lists and re-drives dead letters: hermes dlq ls | hermes dlq retry SEQ.
func RunDLQ(ctx context.Context, args []string, env Env) error {
	if len(args) == 0 || (args[0] != "ls" && args[0] != "retry") {
		return errors.New("dlq: use 'hermes dlq ls' or 'hermes dlq retry SEQ' (flags: -h)")
	}
	sub := args[0]
	fs := newFlagSet("dlq "+sub, "hermes dlq "+sub+map[string]string{"ls": " [flags]", "retry": " [flags] SEQ"}[sub], env.Stderr)
	var c common
	c.register(fs, "dlq")
	limit := fs.Int("limit", 100, "list at most this many letters, oldest first")
	asJSON := fs.Bool("json", false, "print JSON lines")
	nc, b, err := c.dialAsCLI(ctx, fs, args[1:], env)
	if err != nil {
		return err
	}
	defer nc.Close()
	if sub == "retry" {
		if fs.NArg() != 1 {
			return errors.New("dlq retry: give the letter's SEQ (from hermes dlq ls)")
		}
		seq, err := strconv.ParseUint(fs.Arg(0), 10, 64)
		if err != nil || seq == 0 {
			return fmt.Errorf("dlq retry: SEQ must be a positive number, got %q", fs.Arg(0))
		}
		l, err := deadletter.Retry(ctx, b, seq)
		if err != nil {
			return err
		}
		fmt.Fprintf(env.Stdout, "re-drove letter %d: %s %s to %s\n", seq, l.Type, l.MsgID, l.Subject)
		return nil
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("dlq ls: unexpected argument %q", fs.Arg(0))
	}
	letters, err := deadletter.List(ctx, b, *limit)
	if err != nil {
		return err
	}
	return writeList(env.Stdout, *asJSON, letters, "no dead letters", "SEQ\tAT\tCONSUMER\tSUBJECT\tDELIVERIES\tREQUEST\tREASON",
		func(l deadletter.Letter) string {
			req := l.RequestID
			if req == "" {
				req = "-"
			}
			return fmt.Sprintf("%d\t%s\t%s\t%s\t%d\t%s\t%s", l.Seq, l.At.Format("2006-01-02 15:04:05"), l.Consumer, l.Subject,
				l.Deliveries, req, strings.ReplaceAll(l.Reason, "\n", " "))
		})
}
