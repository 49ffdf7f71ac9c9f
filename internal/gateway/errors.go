package gateway

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/hermesbus/hermes/internal/sandbox"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// apiError is the JSON body of every error answer.
type apiError struct {
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

func writeError(w http.ResponseWriter, status int, code, msg string, err error) {
	var body apiError
	body.Error.Code, body.Error.Message = code, msg
	var fe *protocol.FieldError
	if errors.As(err, &fe) {
		body.Error.Field = fe.Field
	}
	writeJSON(w, status, &body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":{"code":"`+protocol.CodeInternal+`","message":"encode answer"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// writeNotConnected answers 503 BUS_UNAVAILABLE for a gateway whose NATS connection is down
// (it reconnects by itself); advice tells the client what to do.
func writeNotConnected(w http.ResponseWriter, advice string) {
	w.Header().Set("Retry-After", "1")
	writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable,
		"the gateway is not connected to NATS (reconnecting); "+advice, nil)
}

// writeResponse answers a HermesResponse; results is always an array, never null.
func writeResponse(w http.ResponseWriter, resp *protocol.Response) {
	if resp.Results == nil {
		resp.Results = []protocol.ToolResult{}
	}
	writeJSON(w, http.StatusOK, resp)
}
