package app

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"text/tabwriter"
	"time"

	"github.com/hermesbus/hermes/internal/erasure"
	"github.com/hermesbus/hermes/internal/memory"
)

const memoryUsage = `hermes memory ls|get KEY|rm KEY|forget|erasure [flags]
What Hermes remembers about a user (fragments {type, key, value, lifespan, semantic_tag}),
through a gateway: the caller's own memory; with --user U, the memory of end user U of an
application whose key may act for its users; with --owner O, any owner's (needs memory:admin).
  ls      list the live fragments, most relevant first (--session, --type, --key, --tag narrow)
  get     one fragment (--session S: the session's own, else the owner's)
  rm      forget one fragment (--session S for a session fragment)
  forget  forget everything kept about the owner (asks for --yes): its fragments at once, and
          the eraser erases its history on the record (every value it had, its archived
          intents' contexts), with --with-history every session of the owner too; with --nats,
          as an operator on the bus, all of it here and now, without a gateway
  erasure the owner's last erasure: asked, or done and what it erased
Exit status: 0 done, 1 no such fragment, 2 bad usage or trouble reaching the gateway`

// memoryFragment is a fragment as the gateway shows it.
type memoryFragment struct {
	Owner string `json:"owner"`
	memory.Fragment
}

// RunMemory reads and forgets what Hermes remembers, through a gateway: hermes memory.
func RunMemory(ctx context.Context, args []string, env Env) error {
	usage := func(format string, a ...any) error {
		return &ExitError{Code: 2, Err: fmt.Errorf("memory: "+format, a...)}
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintf(env.Stderr, "Usage: %s\n", memoryUsage)
		if len(args) == 0 {
			return usage("say ls, get, rm, forget or erasure")
		}
		return flag.ErrHelp
	}
	sub, args := args[0], args[1:]
	switch sub {
	case "ls", "get", "rm", "forget", "erasure":
	default:
		return usage("unknown subcommand %q; say ls, get, rm, forget or erasure", sub)
	}
	fset := newFlagSet("memory "+sub, memoryUsage, env.Stderr)
	var api gatewayAPI
	api.register(fset)
	user := fset.String("user", "", "the end user whose memory it is (a key that may act for its users)")
	owner := fset.String("owner", "", "any owner's memory, as ls names it (needs memory:admin)")
	session := fset.String("session", "", "the session (ls: its fragments and the owner's; get, rm: a session fragment)")
	typ := fset.String("type", "", "ls: only fragments of this type")
	key := fset.String("key", "", "ls: only this key")
	tag := fset.String("tag", "", "ls: only fragments with this semantic tag")
	yes := fset.Bool("yes", false, "forget: yes, forget everything kept about the owner")
	bus := natsFlags(fset, "", "forget: erase on the bus itself, as an operator (the NATS server's URL; admin credentials): the fragments, their history on the record, and with --with-history the owner's sessions (needs --owner)")
	withHistory := fset.Bool("with-history", false, "forget: also erase every session of the owner from the record")
	asJSON := fset.Bool("json", false, "print the gateway's JSON")
	// The key comes first (get KEY --session S) or after the flags.
	var pos []string
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		pos, args = args[:1], args[1:]
	}
	if err := fset.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usage("%v", err)
	}
	pos = append(pos, fset.Args()...)
	wantKey := sub == "get" || sub == "rm"
	switch {
	case wantKey && len(pos) != 1:
		return usage("%s takes one KEY", sub)
	case !wantKey && len(pos) > 0:
		return usage("%s: unexpected argument %q", sub, pos[0])
	case sub == "forget" && !*yes:
		return usage("forget removes everything kept about the owner: say --yes")
	case *user != "" && *owner != "":
		return usage("say --user or --owner, not both")
	case bus.url != "" && (sub != "forget" || *owner == ""):
		return usage("--nats erases as an operator: say forget --owner O --yes (O as ls names it)")
	case *withHistory && sub != "forget":
		return usage("--with-history is forget's")
	}
	if bus.url != "" {
		return eraseMemory(ctx, env, bus, *owner, *withHistory, *asJSON)
	}
	q := url.Values{}
	for name, v := range map[string]string{"user": *user, "owner": *owner, "session_id": *session} {
		if v != "" {
			q.Set(name, v)
		}
	}
	if *withHistory {
		q.Set("with_history", "true")
	}
	if sub == "ls" {
		for name, v := range map[string]string{"type": *typ, "key": *key, "tag": *tag} {
			if v != "" {
				q.Set(name, v)
			}
		}
	}
	path := "/v1/memory"
	if sub == "erasure" {
		path = "/v1/erasure"
	}
	if wantKey {
		path += "/" + url.PathEscape(pos[0])
	}
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	method := http.MethodGet
	if sub == "rm" || sub == "forget" {
		method = http.MethodDelete
	}
	var out json.RawMessage
	if err := api.do(ctx, method, path, "", nil, &out); err != nil {
		var ae *apiError
		if errors.As(err, &ae) && ae.Status == http.StatusNotFound && wantKey {
			return &ExitError{Code: 1, Err: fmt.Errorf("memory %s: no fragment %q", sub, pos[0])}
		}
		if errors.As(err, &ae) && ae.Status == http.StatusNotFound && sub == "erasure" {
			return &ExitError{Code: 1, Err: errors.New("memory erasure: none was asked for the owner")}
		}
		return &ExitError{Code: 2, Err: fmt.Errorf("memory %s: %w", sub, err)}
	}
	if *asJSON {
		_, err := env.Stdout.Write(append(out, '\n'))
		return err
	}
	switch sub {
	case "ls":
		var list struct {
			Owner     string           `json:"owner"`
			Fragments []memoryFragment `json:"fragments"`
		}
		if err := json.Unmarshal(out, &list); err != nil {
			return &ExitError{Code: 2, Err: fmt.Errorf("memory ls: the gateway's answer: %w", err)}
		}
		printFragments(env, list.Owner, list.Fragments)
	case "get":
		var f memoryFragment
		if err := json.Unmarshal(out, &f); err != nil {
			return &ExitError{Code: 2, Err: fmt.Errorf("memory get: the gateway's answer: %w", err)}
		}
		printFragments(env, f.Owner, []memoryFragment{f})
	case "rm":
		fmt.Fprintf(env.Stdout, "forgot %s\n", pos[0])
	case "forget":
		var r struct {
			Owner     string       `json:"owner"`
			Forgotten int          `json:"forgotten"`
			Erasure   *erasure.Ask `json:"erasure"`
		}
		_ = json.Unmarshal(out, &r)
		fmt.Fprintf(env.Stdout, "forgot %d fragments of %s", r.Forgotten, r.Owner)
		if r.Erasure != nil {
			what := "its history on the record"
			if r.Erasure.WithHistory {
				what += " and its sessions"
			}
			fmt.Fprintf(env.Stdout, "; the eraser erases %s (hermes memory erasure shows when)", what)
		}
		fmt.Fprintln(env.Stdout)
	case "erasure":
		var a erasure.Ask
		if err := json.Unmarshal(out, &a); err != nil {
			return &ExitError{Code: 2, Err: fmt.Errorf("memory erasure: the gateway's answer: %w", err)}
		}
		printErasure(env, &a)
	}
	return nil
}

// printErasure prints an erasure's state for people.
func printErasure(env Env, a *erasure.Ask) {
	what := "its history on the record"
	if a.WithHistory {
		what += " and its sessions"
	}
	fmt.Fprintf(env.Stdout, "erasure of %s (%s), asked %s", a.Owner, what, a.AskedAt.Format(time.RFC3339))
	if a.AskedBy != "" {
		fmt.Fprintf(env.Stdout, " by %s", a.AskedBy)
	}
	fmt.Fprintln(env.Stdout)
	switch {
	case a.State == erasure.StateDone && a.Erased != nil:
		fmt.Fprintf(env.Stdout, "done %s: %d history messages", a.DoneAt.Format(time.RFC3339), a.Erased.HistoryMessages)
		if a.WithHistory {
			fmt.Fprintf(env.Stdout, ", %d sessions (%d messages)", a.Erased.Sessions, a.Erased.SessionMessages)
		}
		fmt.Fprintln(env.Stdout, " erased")
	case a.LastError != "":
		fmt.Fprintf(env.Stdout, "waiting: %d tries; the last failed: %s\n", a.Tries, a.LastError)
	default:
		fmt.Fprintln(env.Stdout, "waiting for the eraser")
	}
}

func printFragments(env Env, owner string, fs []memoryFragment) {
	if len(fs) == 0 {
		fmt.Fprintf(env.Stdout, "(nothing is remembered about %s)\n", owner)
		return
	}
	fmt.Fprintf(env.Stdout, "owner %s\n", owner)
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TYPE\tKEY\tVALUE\tLIFESPAN\tSESSION\tTAGS\tEXPIRES\tVERSION")
	for _, f := range fs {
		expires, session := "never", "-"
		if !f.ExpiresAt.IsZero() {
			expires = f.ExpiresAt.Format(time.RFC3339)
		}
		if f.Session != "" {
			session = f.Session
		}
		value := []rune(string(f.Value))
		if len(value) > 60 {
			value = append(value[:57], []rune("...")...)
		}
		tags := "-"
		if len(f.Tags) > 0 {
			b, _ := json.Marshal(f.Tags)
			tags = string(b)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\n", f.Type, f.Key, string(value), f.Lifespan, session, tags, expires, f.Version)
	}
	_ = tw.Flush()
}

// eraseMemory is hermes memory forget --nats: the owner's fragments, history and (withHistory)
// sessions, erased on the bus.
func eraseMemory(ctx context.Context, env Env, target *natsTarget, owner string, withHistory, asJSON bool) error {
	if withHistory && owner == memory.Anonymous {
		return &ExitError{Code: 2, Err: errors.New("memory forget: the anonymous owner's sessions are everybody's: --with-history cannot tell them apart")}
	}
	nc, js, err := dialRecord(ctx, target, "memory")
	if err != nil {
		return &ExitError{Code: 2, Err: err}
	}
	defer nc.Close()
	kv, err := js.KeyValue(ctx, memory.Bucket)
	if err != nil {
		return &ExitError{Code: 2, Err: fmt.Errorf("memory forget: the memory bucket: %w", err)}
	}
	var sessions []string
	if withHistory {
		if sessions, _, err = erasure.OwnerSessions(ctx, js, owner); err != nil {
			return &ExitError{Code: 2, Err: fmt.Errorf("memory forget: %w", err)}
		}
	}
	out, err := memory.Erase(ctx, js, &memory.Store{KV: kv, JS: js}, owner, sessions)
	if err != nil {
		return &ExitError{Code: 2, Err: fmt.Errorf("memory forget: %w (what was erased before: %+v)", err, out)}
	}
	if asJSON {
		return printJSON(env, out)
	}
	fmt.Fprintf(env.Stdout, "forgot %d fragments of %s; erased %d history messages", out.Fragments, owner, out.History)
	if withHistory {
		fmt.Fprintf(env.Stdout, " and %d sessions (%d messages)", len(out.Sessions), out.SessionMessages)
	}
	fmt.Fprintln(env.Stdout)
	return nil
}
