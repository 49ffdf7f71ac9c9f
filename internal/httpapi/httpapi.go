// Package httpapi holds the conventions every HTTP door of Hermes answers with: the JSON error
// body ({"error":{"code","message","field"}}), JSON answers, and the trace headers a caller may
// send (X-Trace-ID, W3C traceparent and tracestate). The gateway and the front doors it serves
// (package chat, package mcpserver) share them, so that a client reads every door's errors the
// same way.
package httpapi

import (
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/sandbox"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Error is the JSON body of every error answer.
type Error struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Field   string `json:"field,omitempty"`
		// Line is the line of a document (a contract) the error is about.
		Line int `json:"line,omitempty"`
	} `json:"error"`
	RequestID string `json:"request_id,omitempty"`
	StatusURL string `json:"status_url,omitempty"`
	// Response is the request's response, where the error is about a request that has one
	// (ALREADY_FINISHED).
	Response *protocol.Response `json:"response,omitempty"`
	// Sandbox is the sandbox's report, where the error is its refusal (SANDBOX_REFUSED).
	Sandbox *sandbox.Report `json:"sandbox,omitempty"`
}

// WriteError answers status with an Error of code and msg; err, when it is a
// *protocol.FieldError, names the field.
func WriteError(w http.ResponseWriter, status int, code, msg string, err error) {
	var body Error
	body.Error.Code, body.Error.Message = code, msg
	var fe *protocol.FieldError
	if errors.As(err, &fe) {
		body.Error.Field = fe.Field
	}
	WriteJSON(w, status, &body)
}

// WriteRefusal answers an admission's refusal: its status and Hermes' code, the field at
// fault, and Retry-After when waiting helps.
func WriteRefusal(w http.ResponseWriter, r *admission.Refusal) {
	if r.RetryAfter > 0 {
		SetRetryAfter(w, r.RetryAfter)
	}
	var body Error
	body.Error.Code, body.Error.Message, body.Error.Field = r.Code, r.Message, r.Field
	WriteJSON(w, r.Status, &body)
}

// WriteJSON answers status with v as JSON (and a newline).
func WriteJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":{"code":"`+protocol.CodeInternal+`","message":"encode answer"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// SetRetryAfter sets the Retry-After header to wait, in whole seconds, at least one.
func SetRetryAfter(w http.ResponseWriter, wait time.Duration) {
	w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(max(wait, time.Second).Seconds()))))
}

// TraceOf reads the caller's X-Trace-ID and W3C trace context. An X-Trace-ID that is not 1 to
// 128 printable ASCII characters is a *protocol.FieldError; a malformed traceparent or
// tracestate is left out.
func TraceOf(r *http.Request) (protocol.TraceContext, error) {
	t := protocol.TraceContext{TraceID: r.Header.Get("X-Trace-ID")}
	if t.TraceID != "" && !PrintableASCII(t.TraceID, 128) {
		return t, &protocol.FieldError{Field: "X-Trace-ID", Reason: "must be 1 to 128 printable ASCII characters without spaces"}
	}
	if tp := r.Header.Get("traceparent"); PrintableASCII(tp, 128) {
		t.Traceparent = tp
		if ts := r.Header.Get("tracestate"); PrintableASCIIOrSpace(ts, 512) {
			t.Tracestate = ts
		}
	}
	return t, nil
}

// PrintableASCII reports whether s is 1 to max printable ASCII characters without spaces.
func PrintableASCII(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// PrintableASCIIOrSpace is PrintableASCII with spaces allowed.
func PrintableASCIIOrSpace(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// Route is one endpoint a door serves: its pattern as http.ServeMux takes it (e.g. "POST
// /v1/chat"), the permission it needs, and its handler. The gateway serves it behind its
// authentication and browser protections.
type Route struct {
	Pattern string
	Need    auth.Permission
	Handler http.HandlerFunc
}
