package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hermesbus/hermes/internal/gateway"
	"github.com/hermesbus/hermes/internal/sandbox"
)

// gatewayAPI calls a gateway's HTTP API with the CLI's API key.
type gatewayAPI struct {
	base   string
	key    keyFlag
	client *http.Client
}

func (a *gatewayAPI) register(fs *flag.FlagSet) {
	fs.StringVar(&a.base, "url", envOr("HERMES_URL", "http://127.0.0.1:8080"), "gateway base URL (env HERMES_URL)")
	a.key.register(fs)
	// A registration waits for the sandbox, which may take up to its budget.
	a.client = &http.Client{Timeout: sandbox.MaxBudget + 30*time.Second}
}

// apiError is a gateway's error answer.
type apiError struct {
	Status int
	Code   string `json:"code"`
	Msg    string `json:"message"`
	Field  string `json:"field"`
	Line   int    `json:"line"`
	hint   string
	// Sandbox is the sandbox's report, when it refused a tool (SANDBOX_REFUSED).
	Sandbox *sandbox.Report `json:"-"`
}

func (e *apiError) Error() string {
	msg := fmt.Sprintf("gateway answered %d %s: %s", e.Status, e.Code, e.Msg)
	if e.hint != "" {
		msg += " (" + e.hint + ")"
	}
	return msg
}

// do sends method path with body (of contentType) and decodes a 2xx answer into out (when not
// nil); any other answer is an *apiError.
func (a *gatewayAPI) do(ctx context.Context, method, path, contentType string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(a.base, "/")+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if err := a.key.authorize(req); err != nil {
		return err
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return fmt.Errorf("%w (is Hermes running? start it with: go run ./cmd/hermes up)", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("read the answer: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		var body struct {
			Error   apiError        `json:"error"`
			Sandbox *sandbox.Report `json:"sandbox"`
		}
		_ = json.Unmarshal(data, &body)
		e := body.Error
		e.Sandbox = body.Sandbox
		e.Status, e.hint = resp.StatusCode, a.key.refused(resp.StatusCode)
		if e.Code == "" {
			e.Msg = strings.TrimSpace(string(data))
		}
		return &e
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("the gateway's answer is not what hermes expects: %w", err)
		}
	}
	return nil
}

// toolList is GET /api/v1/tools.
type toolList struct {
	Tools   []gateway.ToolView `json:"tools"`
	Damaged []string           `json:"damaged"`
}

const toolsUsage = `hermes tools ls | get NAME [--version N] | register -f FILE [--force] [--allow-side-effects] [--budget D] | check NAME | rm NAME [flags]`

// RunTools manages tools' contracts through a gateway: hermes tools.
func RunTools(ctx context.Context, args []string, env Env) error {
	if len(args) == 0 {
		fmt.Fprintf(env.Stderr, "Usage: %s\n", toolsUsage)
		return errors.New("tools: say ls, get, register, check or rm")
	}
	sub, args := args[0], args[1:]
	fset := newFlagSet("tools "+sub, toolsUsage, env.Stderr)
	var api gatewayAPI
	api.register(fset)
	file := fset.String("f", "", "register: the contract file (YAML or JSON; - reads standard input)")
	version := fset.Int("version", 0, "get: this version (default: the current one)")
	asJSON := fset.Bool("json", false, "print the gateway's JSON")
	var try tryFlags
	try.register(fset)
	name, err := parseNamed(fset, args)
	if err != nil {
		return err
	}
	named := func() error { return needName("tools "+sub, "the tool", name) }
	switch sub {
	case "ls":
		var list toolList
		if err := api.do(ctx, http.MethodGet, "/api/v1/tools", "", nil, &list); err != nil {
			return fmt.Errorf("tools ls: %w", err)
		}
		if *asJSON {
			return printJSON(env, list)
		}
		printTools(env, list)
		return nil
	case "get":
		if err := named(); err != nil {
			return err
		}
		path := "/api/v1/tools/" + url.PathEscape(name)
		if *version > 0 {
			path += fmt.Sprintf("?version=%d", *version)
		}
		var v gateway.ToolView
		if err := api.do(ctx, http.MethodGet, path, "", nil, &v); err != nil {
			return fmt.Errorf("tools get: %w", err)
		}
		if *asJSON {
			return printJSON(env, v)
		}
		printTool(env, v)
		return nil
	case "register":
		if *file == "" {
			return errors.New("tools register: -f FILE is required")
		}
		data, err := readFileOrStdin(*file)
		if err != nil {
			return fmt.Errorf("tools register: %w", err)
		}
		v, err := api.registerContract(ctx, data, *file, try.query(true))
		if err != nil {
			return fmt.Errorf("tools register: %s: %w", *file, refusal(env, err))
		}
		if *asJSON {
			return printJSON(env, v)
		}
		if v.Changed != nil && !*v.Changed {
			fmt.Fprintf(env.Stdout, "%s: unchanged (version %d)\n", v.Name, v.Version)
			return nil
		}
		fmt.Fprintf(env.Stdout, "%s: version %d registered\n", v.Name, v.Version)
		printReport(env, v.Sandbox)
		return nil
	case "check":
		if err := named(); err != nil {
			return err
		}
		var rep sandbox.Report
		if err := api.do(ctx, http.MethodPost, "/api/v1/tools/"+url.PathEscape(name)+"/check"+try.query(false), "", nil, &rep); err != nil {
			return fmt.Errorf("tools check: %w", err)
		}
		if *asJSON {
			if err := printJSON(env, rep); err != nil {
				return err
			}
		} else {
			fmt.Fprint(env.Stdout, rep.Text())
		}
		if rep.Failed() {
			return fmt.Errorf("tools check: %s no longer keeps its contract: %s", name, rep.Reason)
		}
		return nil
	case "rm":
		if err := named(); err != nil {
			return err
		}
		var v gateway.ToolView
		if err := api.do(ctx, http.MethodDelete, "/api/v1/tools/"+url.PathEscape(name), "", nil, &v); err != nil {
			return fmt.Errorf("tools rm: %w", err)
		}
		fmt.Fprintf(env.Stdout, "%s: removed (version %d records the removal)\n", name, v.Version)
		return nil
	}
	return fmt.Errorf("tools: unknown subcommand %q; say ls, get, register, check or rm", sub)
}

// tryFlags say how the sandbox may try a tool.
type tryFlags struct {
	force, sideEffects bool
	budget             time.Duration
}

func (t *tryFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&t.force, "force", false, "register: register even if the sandbox refuses the tool (its report is kept with the version)")
	fs.BoolVar(&t.sideEffects, "allow-side-effects", false, "let the sandbox try a tool with side effects where real calls go (without it, only against the contract's sandbox reach)")
	fs.DurationVar(&t.budget, "budget", 0, fmt.Sprintf("how long the sandbox may take (default %s, at most %s)", sandbox.DefaultBudget, sandbox.MaxBudget))
}

// query is the flags as the gateway takes them (force only where registering).
func (t *tryFlags) query(registering bool) string {
	q := url.Values{}
	if t.force && registering {
		q.Set("force", "true")
	}
	if t.sideEffects {
		q.Set("allow_side_effects", "true")
	}
	if t.budget > 0 {
		q.Set("budget", t.budget.String())
	}
	if len(q) == 0 {
		return ""
	}
	return "?" + q.Encode()
}

// refusal prints the sandbox's report when err is its refusal, and returns err.
func refusal(env Env, err error) error {
	var ae *apiError
	if errors.As(err, &ae) && ae.Sandbox != nil {
		fmt.Fprint(env.Stderr, ae.Sandbox.Text())
		return fmt.Errorf("refused by the sandbox: %s (nothing was registered; --force registers anyway)", ae.Sandbox.Reason)
	}
	return err
}

// printReport prints what the sandbox said of a version registered.
func printReport(env Env, raw json.RawMessage) {
	var rep sandbox.Report
	if len(raw) == 0 || json.Unmarshal(raw, &rep) != nil {
		return
	}
	fmt.Fprint(env.Stdout, rep.Text())
}

// registerContract posts a contract as written: YAML, or JSON when it reads as JSON; query
// (tryFlags.query) says how the sandbox may try it.
func (a *gatewayAPI) registerContract(ctx context.Context, data []byte, name, query string) (*gateway.ToolView, error) {
	var v gateway.ToolView
	if err := a.do(ctx, http.MethodPost, "/api/v1/tools"+query, documentType(data), data, &v); err != nil {
		var ae *apiError
		if errors.As(err, &ae) && ae.Line > 0 {
			// Said by its line, still the gateway's answer (callers tell a refusal by it).
			return nil, &lineError{line: ae.Line, err: ae}
		}
		return nil, err
	}
	return &v, nil
}

// lineError is a gateway's refusal of a contract, said by the line it names.
type lineError struct {
	line int
	err  *apiError
}

func (e *lineError) Error() string {
	return fmt.Sprintf("line %d: %s", e.line, strings.TrimPrefix(e.err.Msg, fmt.Sprintf("line %d: ", e.line)))
}

func (e *lineError) Unwrap() error { return e.err }

// applyFile posts the document in file (- reads standard input) to path as command cmd, and
// decodes the answer into out. A 400 is the file's fault: said with its field (and line),
// nothing applied.
func (a *gatewayAPI) applyFile(ctx context.Context, cmd, file, path string, out any) error {
	if file == "" {
		return fmt.Errorf("%s: -f FILE is required", cmd)
	}
	data, err := readFileOrStdin(file)
	if err != nil {
		return fmt.Errorf("%s: %w", cmd, err)
	}
	if err := a.do(ctx, http.MethodPost, path, documentType(data), data, out); err != nil {
		var ae *apiError
		if errors.As(err, &ae) && ae.Status == http.StatusBadRequest {
			return fmt.Errorf("%s: %s: %s (nothing was applied)", cmd, file, ae.Msg)
		}
		return fmt.Errorf("%s: %s: %w", cmd, file, err)
	}
	return nil
}

// documentType is the content type a document is posted as: JSON when it reads as a JSON
// object, YAML otherwise.
func documentType(data []byte) string {
	if trimmed := bytes.TrimSpace(data); len(trimmed) > 0 && trimmed[0] == '{' && json.Valid(trimmed) {
		return "application/json"
	}
	return "application/yaml"
}

// parseNamed parses a subcommand's flags, its one name given before them or after them.
func parseNamed(fset *flag.FlagSet, args []string) (name string, err error) {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	if err := fset.Parse(args); err != nil {
		return "", err
	}
	if name == "" && fset.NArg() > 0 {
		name = fset.Arg(0)
	}
	return name, nil
}

// needName says that command sub needs what named, when name is empty.
func needName(command, what, name string) error {
	if name == "" {
		return fmt.Errorf("%s: name %s", command, what)
	}
	return nil
}

func readFileOrStdin(path string) ([]byte, error) {
	if path == "-" {
		return io.ReadAll(io.LimitReader(os.Stdin, 1<<20))
	}
	return os.ReadFile(path)
}

func printJSON(env Env, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = env.Stdout.Write(append(data, '\n'))
	return err
}

func printTools(env Env, list toolList) {
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOOL\tVERSION\tEFFECTS\tLEVEL\tREACH\tREGISTERED\tBY\tDESCRIPTION")
	for _, t := range list.Tools {
		c := t.Contract
		effects, level, reach := "idempotent", "-", "routes"
		if c != nil {
			effects = string(c.EffectsOrDefault())
			if c.ExecutionPolicy != nil && c.ExecutionPolicy.ResourceLevel != "" {
				level = c.ExecutionPolicy.ResourceLevel
			}
			if c.Reach != nil {
				reach = c.Reach.Kind
			}
		}
		desc := ""
		if c != nil {
			desc = truncateRunes(c.Description, 40)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", t.Name, t.Version, effects, level, reach,
			t.RegisteredAt.Local().Format("2006-01-02 15:04"), t.By, desc)
	}
	_ = tw.Flush()
	for _, d := range list.Damaged {
		fmt.Fprintf(env.Stdout, "%s: its record cannot be read (calls to it are refused); register it again\n", d)
	}
	if len(list.Tools) == 0 && len(list.Damaged) == 0 {
		fmt.Fprintln(env.Stdout, "(no contracts registered: tools are reached by the routes file alone)")
	}
}

func printTool(env Env, v gateway.ToolView) {
	what := "registered"
	if v.Removed {
		what = "removed: the tool has no contract"
	}
	fmt.Fprintf(env.Stdout, "# %s, version %d (%s %s by %s)\n", v.Name, v.Version, what, v.RegisteredAt.Local().Format(time.RFC3339), v.By)
	if v.Damaged {
		fmt.Fprintf(env.Stdout, "# what the registry holds last for %s cannot be read; this version stays in use until it is registered again\n", v.Name)
	}
	switch {
	case v.Source != "":
		src := v.Source
		if !strings.HasSuffix(src, "\n") {
			src += "\n"
		}
		fmt.Fprint(env.Stdout, src)
	case v.Contract != nil:
		data, _ := json.MarshalIndent(v.Contract, "", "  ")
		fmt.Fprintf(env.Stdout, "%s\n", data)
	}
	if len(v.Sandbox) > 0 {
		var rep sandbox.Report
		if json.Unmarshal(v.Sandbox, &rep) == nil {
			for _, line := range strings.Split(strings.TrimRight(rep.Text(), "\n"), "\n") {
				fmt.Fprintf(env.Stdout, "# %s\n", line)
			}
		}
	}
	fmt.Fprintln(env.Stdout, "# history:")
	for _, h := range v.History {
		what := "registered"
		if h.Removed {
			what = "removed"
		}
		fmt.Fprintf(env.Stdout, "#   v%d  %s  %s by %s\n", h.Version, h.RegisteredAt.Local().Format("2006-01-02 15:04:05"), what, h.By)
	}
}

func truncateRunes(s string, n int) string {
	r := []rune(strings.Join(strings.Fields(s), " "))
	if len(r) <= n {
		return string(r)
	}
	return string(r[:n-1]) + "…"
}
