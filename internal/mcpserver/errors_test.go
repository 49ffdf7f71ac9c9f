package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/submit"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// rpc is a JSON-RPC answer: its result, or its error.
type rpc struct {
	Result *struct {
		IsError bool `json:"isError"`
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	} `json:"result"`
	Error *struct {
		Code    int            `json:"code"`
		Message string         `json:"message"`
		Data    map[string]any `json:"data"`
	} `json:"error"`
}

func (h *harness) rpc(session, body string) rpc {
	h.t.Helper()
	r := h.send(http.MethodPost, "alice", session, body)
	var out rpc
	if err := json.Unmarshal([]byte(r.body), &out); err != nil || r.code != http.StatusOK || (out.Result == nil) == (out.Error == nil) {
		h.t.Fatalf("%v: %d %s", err, r.code, r.body)
	}
	return out
}

// Each way a call fails is told as MCP says: what a model can correct or wait out is an error
// result naming the code (and a hint); what is the client's to change or the server's is a
// JSON-RPC error — an admission's refusal with its status and code as the error's data.
func TestToolsCallFailures(t *testing.T) {
	refused := func(err error) func(ask admission.Ask) error {
		return func(ask admission.Ask) error {
			if ask.Session != "" {
				return err
			}
			return nil
		}
	}
	fails := func(err error) func(context.Context, submit.Submission) (*submit.Outcome, error) {
		return func(context.Context, submit.Submission) (*submit.Outcome, error) { return nil, err }
	}
	for _, tc := range []struct {
		name     string
		refuse   func(ask admission.Ask) error
		answer   func(context.Context, submit.Submission) (*submit.Outcome, error)
		tool     string
		args     string
		result   string // an error result beginning so
		rpcCode  int    // or a JSON-RPC error of this code
		data     string // with this data (status code)
		contains string // and a message holding this
	}{
		{name: "a tool's name that is none", tool: "no such tool!", args: `{}`, result: "UNKNOWN_TOOL: no tool no such tool!"},
		{name: "arguments not an object", args: `[1,2]`, result: "BAD_ARGUMENTS: "},
		{name: "over its rate", refuse: refused(&admission.Refusal{Status: http.StatusTooManyRequests, Code: protocol.CodeRateLimited, Message: "slow down"}),
			result: "RATE_LIMITED: slow down\nhint: call again later"},
		{name: "not its session", refuse: refused(admission.NoSuchSession("x")), rpcCode: jsonrpc.CodeInternalError, data: "404 NOT_FOUND"},
		{name: "the store full", refuse: refused(&admission.Refusal{Status: http.StatusServiceUnavailable, Code: protocol.CodeStoreFull, Message: "full"}),
			rpcCode: jsonrpc.CodeInternalError, data: "503 STORE_FULL", contains: "full"},
		{name: "admission away", refuse: refused(errors.New("owners away")), rpcCode: jsonrpc.CodeInternalError, data: "503 BUS_UNAVAILABLE"},
		{name: "an id used for another call", answer: fails(submit.ErrConflict), rpcCode: jsonrpc.CodeInvalidRequest, contains: "JSON-RPC id was used"},
		{name: "over budget", answer: fails(fmt.Errorf("%w: by 10 bytes", submit.ErrOverBudget)), result: "RATE_LIMITED: "},
		{name: "too large", answer: fails(fmt.Errorf("%w: 2 MiB", submit.ErrTooLarge)), result: "BODY_TOO_LARGE: 2 MiB\nhint: send smaller arguments"},
		{name: "still running", answer: func(context.Context, submit.Submission) (*submit.Outcome, error) {
			return &submit.Outcome{Pending: true}, nil
		},
			rpcCode: jsonrpc.CodeInternalError, contains: "still running"},
		{name: "the bus away", answer: fails(submit.ErrUnavailable), rpcCode: jsonrpc.CodeInternalError, contains: "could not be accepted"},
	} {
		h := newHarness(t, nil)
		h.adm.set(tc.refuse)
		h.sub.set(tc.answer)
		body := callBody("5", "book", `{"a":1}`)
		if tc.tool != "" || tc.args != "" {
			tool, args := tc.tool, tc.args
			if tool == "" {
				tool = "book"
			}
			body = callBody("5", tool, args)
		}
		out := h.rpc(h.initialized("alice"), body)
		switch {
		case tc.result != "":
			if out.Result == nil || !out.Result.IsError || !strings.HasPrefix(out.Result.Content[0].Text, tc.result) {
				t.Errorf("%s: %+v %+v", tc.name, out.Result, out.Error)
			}
		default:
			e := out.Error
			data := ""
			if e != nil && e.Data != nil {
				data = fmt.Sprint(e.Data["status"], " ", e.Data["code"])
			}
			if e == nil || e.Code != tc.rpcCode || (tc.data != "" && data != tc.data) || !strings.Contains(e.Message, tc.contains) {
				t.Errorf("%s: %+v %+v", tc.name, out.Result, e)
			}
		}
		if (tc.tool != "" || tc.args != "") && len(h.sub.submitted()) != 0 {
			t.Errorf("%s: submitted", tc.name)
		}
	}
}

// The caller over its waiting requests is refused before the call is read: HTTP, with
// Retry-After.
func TestToolsCallOverTheWaitingRequests(t *testing.T) {
	h := newHarness(t, nil)
	h.adm.set(func(ask admission.Ask) error {
		if ask.Hold == admission.HoldWaiting {
			return &admission.Refusal{Status: http.StatusTooManyRequests, Code: protocol.CodeRateLimited, Message: "too many waiting", RetryAfter: 2 * time.Second}
		}
		return nil
	})
	r := h.send(http.MethodPost, "alice", "", callBody("1", "book", `{}`))
	if e, _ := r.json(t)["error"].(map[string]any); r.code != http.StatusTooManyRequests || r.header.Get("Retry-After") != "2" || e["code"] != protocol.CodeRateLimited {
		t.Errorf("%d %v %s", r.code, r.header, r.body)
	}
	// tools/list holds nothing.
	if r := h.send(http.MethodPost, "alice", "", `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`); r.code != http.StatusOK {
		t.Errorf("tools/list: %d %s", r.code, r.body)
	}
}

// A call whose client went away runs on; the client is told to send it again for its result.
// A call the gateway's handler did not place is refused.
func TestToolsCallOutsideTheHandler(t *testing.T) {
	h := newHarness(t, nil)
	ctx, cancel := context.WithCancel(t.Context())
	h.sub.set(func(ctx context.Context, _ submit.Submission) (*submit.Outcome, error) {
		cancel()
		return nil, ctx.Err()
	})
	_, err := h.srv.call(ctx, &mcpCall{actor: admission.Actor{}, session: "s", rpcID: "1"}, &mcp.CallToolParamsRaw{Name: "book"})
	var e *jsonrpc.Error
	if !errors.As(err, &e) || !strings.Contains(e.Message, "the client went away; the call runs on") {
		t.Errorf("%v", err)
	}
	handler := h.srv.middleware(func(context.Context, string, mcp.Request) (mcp.Result, error) {
		return nil, errors.New("not the SDK's")
	})
	_, err = handler(t.Context(), "tools/call", &mcp.ServerRequest[*mcp.CallToolParamsRaw]{Params: &mcp.CallToolParamsRaw{Name: "book"}})
	if !errors.As(err, &e) || !strings.Contains(e.Message, "could not be placed") {
		t.Errorf("%v", err)
	}
}

func TestNewRequiresWhatItWorksWith(t *testing.T) {
	if _, err := New(Env{}); err == nil {
		t.Error("made without what it works with")
	}
}
