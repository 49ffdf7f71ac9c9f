package chat

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/packages/param"
	"github.com/openai/openai-go/v3/shared/constant"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/httpapi"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// The wire form of POST /v1/chat/completions, as OpenAI's clients send it. Decoding checks
// every field Hermes reads and names the first wrong one (an OpenAI-style 400 with "param");
// fields Hermes does not use are ignored, as OpenAI-compatible servers do.

// Bounds of a chat request.
const (
	maxChatMessages = 1024
	maxChatTools    = 128
	maxChatTurns    = 32
)

// chatRequest is a decoded chat completion request.
type chatRequest struct {
	Model    string
	Messages []chatMessage
	Tools    []clientTool
	// NoTools: tool_choice "none": the model answers without tools.
	NoTools      bool
	Stream       bool
	IncludeUsage bool
	Session      string // metadata.hermes_session_id
	MaxTurns     int    // 0: the server's
	Params       openai.ChatCompletionNewParams
	// fromRecord: the client sent only its new message (POST /v1/chat); the conversation
	// before it is the session's record.
	fromRecord bool
	// User is the end user the request names in its body (POST /v1/chat's user), as
	// X-Hermes-User does.
	User string
}

// chatMessage is one message of the conversation, as the client sent it.
type chatMessage struct {
	Role       string         `json:"role"`
	Content    string         `json:"content,omitempty"`
	Name       string         `json:"name,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
	ToolCalls  []chatToolCall `json:"tool_calls,omitempty"`
}

type chatToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// clientTool is a tool the client declared: the model may call it, the client runs it.
type clientTool struct {
	Name        string
	Description string
	Parameters  map[string]any
}

// chatError is a request refused: its status, and OpenAI's error object.
type chatError struct {
	Status  int
	Type    string // invalid_request_error, …
	Code    string
	Param   string
	Message string
	// RetryAfter, when positive, is sent as Retry-After.
	RetryAfter time.Duration
}

func (e *chatError) Error() string { return e.Message }

// refusalError is an admission's refusal as the chat dialects answer it: its status and
// Hermes' code, the OpenAI error type its status makes, and param the field at fault when the
// refusal names none (the session's, for a session not the caller's). A nil refusal is the bus
// failing.
func refusalError(r *admission.Refusal, param string) *chatError {
	if r == nil {
		return &chatError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: protocol.CodeBusUnavailable,
			Message: "the bus is not reachable; retry", RetryAfter: time.Second}
	}
	e := &chatError{Status: r.Status, Code: r.Code, Param: r.Field, Message: r.Message, RetryAfter: r.RetryAfter}
	switch {
	case r.Status == http.StatusTooManyRequests:
		e.Type = "rate_limit_error"
	case r.Status == http.StatusUnauthorized:
		e.Type = "authentication_error"
	case r.Status == http.StatusForbidden:
		e.Type = "permission_error"
	case r.Status >= 500:
		e.Type = "server_error"
	default:
		e.Type = "invalid_request_error"
	}
	if e.Param == "" && r.Status == http.StatusNotFound {
		e.Param = param
	}
	return e
}

// writeRetryAfter sets Retry-After for an error that says when to retry.
func writeRetryAfter(w http.ResponseWriter, e *chatError) {
	if e.RetryAfter > 0 {
		httpapi.SetRetryAfter(w, e.RetryAfter)
	}
}

func badParam(param, format string, args ...any) *chatError {
	msg := fmt.Sprintf(format, args...)
	if param != "" {
		msg = param + ": " + msg
	}
	return &chatError{Status: 400, Type: "invalid_request_error", Param: param, Message: msg}
}

var functionName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// decodeChatRequest reads body; what is wrong is a *chatError naming the field.
func decodeChatRequest(body []byte) (*chatRequest, error) {
	var raw struct {
		Model         *string           `json:"model"`
		Messages      []json.RawMessage `json:"messages"`
		Tools         []json.RawMessage `json:"tools"`
		ToolChoice    json.RawMessage   `json:"tool_choice"`
		Stream        *bool             `json:"stream"`
		StreamOptions *struct {
			IncludeUsage *bool `json:"include_usage"`
		} `json:"stream_options"`
		Metadata            map[string]string `json:"metadata"`
		N                   *int64            `json:"n"`
		MaxTurns            *int              `json:"max_turns"`
		Temperature         *float64          `json:"temperature"`
		TopP                *float64          `json:"top_p"`
		MaxTokens           *int64            `json:"max_tokens"`
		MaxCompletionTokens *int64            `json:"max_completion_tokens"`
		Seed                *int64            `json:"seed"`
		Stop                json.RawMessage   `json:"stop"`
	}
	if err := decodeBody(body, &raw, ""); err != nil {
		return nil, err
	}
	req := &chatRequest{}
	if err := checkShape(raw.Model, len(raw.Messages), len(raw.Tools), "GET /v1/models"); err != nil {
		return nil, err
	}
	switch {
	case raw.N != nil && *raw.N != 1:
		return nil, badParam("n", "only 1 choice is made")
	case raw.MaxTurns != nil && (*raw.MaxTurns < 1 || *raw.MaxTurns > maxChatTurns):
		return nil, badParam("max_turns", "must be 1 to %d", maxChatTurns)
	}
	req.Model = *raw.Model
	if raw.Stream != nil {
		req.Stream = *raw.Stream
	}
	if raw.StreamOptions != nil && raw.StreamOptions.IncludeUsage != nil {
		req.IncludeUsage = *raw.StreamOptions.IncludeUsage
	}
	if raw.MaxTurns != nil {
		req.MaxTurns = *raw.MaxTurns
	}
	req.Session = raw.Metadata["hermes_session_id"]
	if err := req.decodeConversation(raw.Messages, raw.Tools, func(at string, _ int, m json.RawMessage, _ []chatMessage) (chatMessage, error) {
		return decodeChatMessage(at, m)
	}); err != nil {
		return nil, err
	}
	if len(raw.ToolChoice) > 0 && string(raw.ToolChoice) != "null" {
		var choice string
		if json.Unmarshal(raw.ToolChoice, &choice) != nil || (choice != "auto" && choice != "none") {
			return nil, badParam("tool_choice", `Hermes takes "auto" or "none" (it runs the loop that chooses)`)
		}
		req.NoTools = choice == "none"
	}
	p := &req.Params
	if raw.Temperature != nil {
		if *raw.Temperature < 0 || *raw.Temperature > 2 {
			return nil, badParam("temperature", "must be 0 to 2")
		}
		p.Temperature = param.NewOpt(*raw.Temperature)
	}
	if raw.TopP != nil {
		if *raw.TopP < 0 || *raw.TopP > 1 {
			return nil, badParam("top_p", "must be 0 to 1")
		}
		p.TopP = param.NewOpt(*raw.TopP)
	}
	for _, v := range []struct {
		name string
		n    *int64
		opt  *param.Opt[int64]
	}{{"max_tokens", raw.MaxTokens, &p.MaxTokens}, {"max_completion_tokens", raw.MaxCompletionTokens, &p.MaxCompletionTokens}} {
		if v.n != nil {
			if *v.n < 1 {
				return nil, badParam(v.name, "must be 1 or more")
			}
			*v.opt = param.NewOpt(*v.n)
		}
	}
	if raw.Seed != nil {
		p.Seed = param.NewOpt(*raw.Seed)
	}
	if len(raw.Stop) > 0 && string(raw.Stop) != "null" {
		var one string
		var many []string
		switch {
		case json.Unmarshal(raw.Stop, &one) == nil:
			p.Stop = openai.ChatCompletionNewParamsStopUnion{OfString: param.NewOpt(one)}
		case json.Unmarshal(raw.Stop, &many) == nil && len(many) <= 4:
			p.Stop = openai.ChatCompletionNewParamsStopUnion{OfStringArray: many}
		default:
			return nil, badParam("stop", "must be a string or up to 4 strings")
		}
	}
	return req, nil
}

// decodeConversation reads a dialect's messages, each with decode (given where it is, its
// index and the messages before it), checks that every tool reply answers a call, and reads
// the client's tools: the loop every dialect shares.
func (req *chatRequest) decodeConversation(messages, tools []json.RawMessage,
	decode func(at string, i int, m json.RawMessage, before []chatMessage) (chatMessage, error)) error {
	for i, m := range messages {
		msg, err := decode(fmt.Sprintf("messages[%d]", i), i, m, req.Messages)
		if err != nil {
			return err
		}
		req.Messages = append(req.Messages, msg)
	}
	if err := checkToolReplies(req.Messages); err != nil {
		return err
	}
	var err error
	req.Tools, err = decodeClientTools(tools)
	return err
}

// decodeBody reads body, one JSON object, into v; what is wrong is a *chatError naming the
// field. With known (the fields v has, for people), fields v does not have are refused.
func decodeBody(body []byte, v any, known string) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	if known != "" {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return badParam(te.Field, "must be a JSON %s", jsonKind(te.Type.Kind().String()))
		}
		if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok && known != "" {
			return badParam(strings.Trim(f, `"`), "is not a field of this request (%s)", known)
		}
		return badParam("", "the body is not a JSON object: %v", err)
	}
	if dec.More() {
		return badParam("", "the body holds more than one JSON value")
	}
	return nil
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "string"
	case "bool":
		return "boolean"
	case "slice":
		return "array"
	case "map", "struct", "ptr":
		return "object"
	}
	return "number"
}

func decodeChatMessage(at string, data json.RawMessage) (chatMessage, error) {
	var raw struct {
		Role       *string         `json:"role"`
		Content    json.RawMessage `json:"content"`
		Name       string          `json:"name"`
		ToolCallID string          `json:"tool_call_id"`
		ToolCalls  []chatToolCall  `json:"tool_calls"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return chatMessage{}, badParam(at+"."+te.Field, "must be a JSON %s", jsonKind(te.Type.Kind().String()))
		}
		return chatMessage{}, badParam(at, "must be a message object")
	}
	m := chatMessage{Name: raw.Name, ToolCallID: raw.ToolCallID}
	if raw.Role == nil {
		return m, badParam(at+".role", "is required (system, developer, user, assistant or tool)")
	}
	m.Role = *raw.Role
	text, err := contentText(at+".content", raw.Content)
	if err != nil {
		return m, err
	}
	m.Content = text
	switch m.Role {
	case "system", "developer", "user":
		if len(raw.Content) == 0 || string(raw.Content) == "null" {
			return m, badParam(at+".content", "is required")
		}
	case "assistant":
		for j, c := range raw.ToolCalls {
			where := fmt.Sprintf("%s.tool_calls[%d]", at, j)
			switch {
			case c.ID == "":
				return m, badParam(where+".id", "is required")
			case c.Type != "" && c.Type != "function":
				return m, badParam(where+".type", "must be \"function\"")
			case !functionName.MatchString(c.Function.Name):
				return m, badParam(where+".function.name", "must be 1 to 64 letters, digits, '_' or '-'")
			}
			m.ToolCalls = append(m.ToolCalls, c)
		}
		if text == "" && len(m.ToolCalls) == 0 && (len(raw.Content) == 0 || string(raw.Content) == "null") {
			return m, badParam(at+".content", "is required unless the message has tool_calls")
		}
	case "tool":
		if m.ToolCallID == "" {
			return m, badParam(at+".tool_call_id", "is required: the id of the call this message answers")
		}
	default:
		return m, badParam(at+".role", "%q is not a role (system, developer, user, assistant, tool)", protocolShort(m.Role))
	}
	return m, nil
}

// contentText reads a message's content: a string, null, or text parts.
func contentText(at string, raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) != nil {
		return "", badParam(at, "must be a string or an array of text parts")
	}
	var b strings.Builder
	for j, p := range parts {
		if p.Type != "text" || p.Text == nil {
			return "", badParam(fmt.Sprintf("%s[%d].type", at, j), "only text parts are taken (got %q)", protocolShort(p.Type))
		}
		b.WriteString(*p.Text)
	}
	return b.String(), nil
}

// checkToolReplies: each tool message answers a call of the assistant message before it, once,
// and every call is answered before the conversation goes on (as OpenAI requires).
func checkToolReplies(msgs []chatMessage) error {
	open := map[string]bool{}
	from := -1 // the assistant message whose calls are open
	unanswered := func(at int) error {
		for _, c := range msgs[from].ToolCalls {
			if open[c.ID] {
				return badParam(fmt.Sprintf("messages[%d]", at), "the tool call %q of messages[%d] has no tool message answering it before this one", protocolShort(c.ID), from)
			}
		}
		return nil
	}
	for i, m := range msgs {
		if m.Role != "tool" && len(open) > 0 {
			return unanswered(i)
		}
		switch m.Role {
		case "assistant":
			from = i
			for j, c := range m.ToolCalls {
				if open[c.ID] {
					return badParam(fmt.Sprintf("messages[%d].tool_calls[%d].id", i, j), "%q is used twice", protocolShort(c.ID))
				}
				open[c.ID] = true
			}
		case "tool":
			if !open[m.ToolCallID] {
				return badParam(fmt.Sprintf("messages[%d].tool_call_id", i), "%q answers no open tool call of the assistant message before it", protocolShort(m.ToolCallID))
			}
			delete(open, m.ToolCallID)
		}
	}
	if len(open) > 0 {
		return unanswered(len(msgs) - 1)
	}
	return nil
}

// decodeClientTools reads the tools a client declared, each name once.
func decodeClientTools(raw []json.RawMessage) ([]clientTool, error) {
	var out []clientTool
	names := map[string]bool{}
	for i, t := range raw {
		ct, err := decodeClientTool(fmt.Sprintf("tools[%d]", i), t)
		if err != nil {
			return nil, err
		}
		if names[ct.Name] {
			return nil, badParam(fmt.Sprintf("tools[%d].function.name", i), "%q is declared twice", ct.Name)
		}
		names[ct.Name] = true
		out = append(out, ct)
	}
	return out, nil
}

func decodeClientTool(at string, data json.RawMessage) (clientTool, error) {
	var raw struct {
		Type     string `json:"type"`
		Function *struct {
			Name        string         `json:"name"`
			Description string         `json:"description"`
			Parameters  map[string]any `json:"parameters"`
		} `json:"function"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return clientTool{}, badParam(at, "must be {\"type\":\"function\",\"function\":{\"name\":…}}")
	}
	switch {
	case raw.Type != "function":
		return clientTool{}, badParam(at+".type", "must be \"function\"")
	case raw.Function == nil:
		return clientTool{}, badParam(at+".function", "is required")
	case !functionName.MatchString(raw.Function.Name):
		return clientTool{}, badParam(at+".function.name", "must be 1 to 64 letters, digits, '_' or '-'")
	}
	return clientTool{Name: raw.Function.Name, Description: raw.Function.Description, Parameters: raw.Function.Parameters}, nil
}

// protocolShort is s as an error quotes it: at most 64 bytes, on a character boundary, a cut
// marked.
func protocolShort(s string) string {
	if len(s) <= 64 {
		return s
	}
	return protocol.Shorten(s, 64) + "…"
}

// checkShape checks what every front door's request has: a model (models names where they are
// listed), messages and tools within their bounds.
func checkShape(model *string, messages, tools int, models string) error {
	switch {
	case model == nil || strings.TrimSpace(*model) == "":
		return badParam("model", "is required: name the model (%s lists them)", models)
	case messages == 0:
		return badParam("messages", "is required: at least one message")
	case messages > maxChatMessages:
		return badParam("messages", "holds %d messages; at most %d are taken", messages, maxChatMessages)
	case tools > maxChatTools:
		return badParam("tools", "holds %d tools; at most %d are taken", tools, maxChatTools)
	}
	return nil
}

// param is the message as the model reads it.
func (m chatMessage) param() openai.ChatCompletionMessageParamUnion {
	calls := make([]protocol.LLMCall, len(m.ToolCalls))
	for i, c := range m.ToolCalls {
		calls[i] = protocol.LLMCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments}
	}
	return messageParam(m.Role, m.Content, m.ToolCallID, calls)
}

// messageParam is a message of role as the model reads it: its text, the call it answers (a
// tool's), the calls it makes (an assistant's). An unknown role reads as the user's.
func messageParam(role, content, toolCallID string, calls []protocol.LLMCall) openai.ChatCompletionMessageParamUnion {
	switch role {
	case "system":
		return openai.SystemMessage(content)
	case "developer":
		return openai.DeveloperMessage(content)
	case "tool":
		return openai.ToolMessage(content, toolCallID)
	case "assistant":
		return assistantParam(content, calls)
	}
	return openai.UserMessage(content)
}

// assistantParam is an assistant message with text and calls, as the model reads it.
func assistantParam(content string, calls []protocol.LLMCall) openai.ChatCompletionMessageParamUnion {
	a := openai.ChatCompletionAssistantMessageParam{}
	if content != "" || len(calls) == 0 {
		a.Content.OfString = param.NewOpt(content)
	}
	for _, c := range calls {
		a.ToolCalls = append(a.ToolCalls, openai.ChatCompletionMessageToolCallUnionParam{OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
			ID: c.ID, Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: c.Name, Arguments: c.Arguments},
			Type: constant.Function("function")}})
	}
	return openai.ChatCompletionMessageParamUnion{OfAssistant: &a}
}

// digest identifies m as the client sees it, for matching a resent history to the record.
func (m chatMessage) digest() string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00", m.Role, m.Content, m.ToolCallID)
	for _, c := range m.ToolCalls {
		fmt.Fprintf(h, "%s\x00%s\x00%s\x00", c.ID, c.Function.Name, c.Function.Arguments)
	}
	return hex.EncodeToString(h.Sum(nil)[:12])
}
