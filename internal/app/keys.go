package app

import (
	"context"
	"errors"
	"fmt"

	"github.com/hermesbus/hermes/internal/auth"
)

// RunKeys manages API keys: hermes keys create | ls | revoke ID-or-NAME. It talks to the bus
// directly, so it needs what the bus asks of an operator, not a key.
func RunKeys(ctx context.Context, args []string, env Env) error {
	usage := map[string]string{"create": " --name NAME --role ROLE [flags]", "ls": " [flags]", "revoke": " [flags] ID-or-NAME"}
	if len(args) == 0 || usage[args[0]] == "" {
		return errors.New("keys: use 'hermes keys create --name NAME --role ROLE', 'hermes keys ls' or 'hermes keys revoke ID-or-NAME' (flags: -h)")
	}
	sub := args[0]
	fs := newFlagSet("keys "+sub, "hermes keys "+sub+usage[sub], env.Stderr)
	var c common
	c.register(fs, "keys")
	name := fs.String("name", "", "create: what the key is for (letters, digits, '.', '_', '-'; at most 64)")
	role := fs.String("role", "", "create: admin, operator or user")
	actFor := fs.Bool("act-for-users", false, "create: the key may name the end user a request is made for")
	asJSON := fs.Bool("json", false, "ls: print JSON lines")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	log, err := newLogger(env.Stderr, c.logLevel)
	if err != nil {
		return err
	}
	var target string
	switch {
	case sub == "revoke" && fs.NArg() == 1:
		target = fs.Arg(0)
	case sub == "revoke":
		return errors.New("keys revoke: give the key's id or name (from hermes keys ls)")
	case fs.NArg() != 0:
		return fmt.Errorf("keys %s: unexpected argument %q", sub, fs.Arg(0))
	}
	var r auth.Role
	if sub == "create" {
		if *name == "" {
			return errors.New("keys create: --name is required")
		}
		if r, err = auth.ParseRole(*role); err != nil {
			return fmt.Errorf("keys create: --role: %w", err)
		}
	}
	c.cli = true
	nc, b, err := c.dial(ctx, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	keys := apiKeys(b)
	switch sub {
	case "create":
		key, k, err := keys.Create(ctx, auth.NewKey{Name: *name, Role: r, ActForUsers: *actFor, CreatedBy: "hermes keys"})
		if err != nil {
			return err
		}
		fmt.Fprintf(env.Stderr, "created key %s (%s, role %s); it is shown this once:\n", k.ID, k.Name, k.Role)
		fmt.Fprintln(env.Stdout, key)
		return nil
	case "revoke":
		k, err := keys.Revoke(ctx, target)
		if err != nil {
			return err
		}
		fmt.Fprintf(env.Stdout, "revoked key %s (%s) at %s\n", k.ID, k.Name, k.RevokedAt.Format("2006-01-02 15:04:05Z"))
		return nil
	}
	list, damaged, err := keys.List(ctx)
	if err != nil {
		return err
	}
	for _, id := range damaged {
		fmt.Fprintf(env.Stderr, "warning: the record under key id %s is not a key's (damaged, or written by something else); it names no caller\n", id)
	}
	for _, k := range list {
		k.Hash = "" // not needed to manage keys (omitted)
	}
	return writeList(env.Stdout, *asJSON, list, "no keys", "ID\tNAME\tROLE\tACT FOR USERS\tCREATED\tREVOKED", func(k *auth.Key) string {
		revoked := "-"
		if k.Revoked() {
			revoked = k.RevokedAt.Format("2006-01-02 15:04:05")
		}
		return fmt.Sprintf("%s\t%s\t%s\t%v\t%s\t%s", k.ID, k.Name, k.Role, k.ActForUsers, k.CreatedAt.Format("2006-01-02 15:04:05"), revoked)
	})
}
