package gateway

import (
	"net/http"

	"github.com/hermesbus/hermes/internal/admission"
	"github.com/hermesbus/hermes/internal/httpapi"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// apiError is the JSON body of every error answer.
type apiError = httpapi.Error

func writeError(w http.ResponseWriter, status int, code, msg string, err error) {
	httpapi.WriteError(w, status, code, msg, err)
}

func writeJSON(w http.ResponseWriter, status int, v any) { httpapi.WriteJSON(w, status, v) }

// writeRefusal answers an admission's refusal (httpapi.WriteRefusal).
func writeRefusal(w http.ResponseWriter, r *admission.Refusal) { httpapi.WriteRefusal(w, r) }

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
