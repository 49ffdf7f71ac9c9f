package demotools

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// toolError is a failure the way every demo tool reports it: an HTTP status and a JSON body
// {"error_code", "recovery_hint", "message"}. The recovery hint says what to change, naming the
// argument at fault.
type toolError struct {
	Status  int    `json:"-"`
	Code    string `json:"error_code"`
	Hint    string `json:"recovery_hint"`
	Message string `json:"message"`
}

var _ error = (*toolError)(nil)

func (e *toolError) Error() string { return e.Code + ": " + e.Message }

// missingArg reports that the required argument field is absent; want describes a good value.
func missingArg(field, want string) *toolError {
	return &toolError{
		Status:  http.StatusBadRequest,
		Code:    "INVALID_ARGUMENT",
		Hint:    fmt.Sprintf("provide %q: %s", field, want),
		Message: fmt.Sprintf("missing required argument %q", field),
	}
}

// badArg reports that argument field holds an unusable value; want describes a good value.
func badArg(field, want, problem string) *toolError {
	return &toolError{
		Status:  http.StatusBadRequest,
		Code:    "INVALID_ARGUMENT",
		Hint:    fmt.Sprintf("set %q to %s", field, want),
		Message: fmt.Sprintf("invalid argument %q: %s", field, problem),
	}
}

// writeJSON writes v as the JSON body of a response with the given status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v) // the client may be gone; there is no one left to tell
}

// writeRaw writes body, which must be JSON, as a response with the given status.
func writeRaw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// writeError writes err as a tool error; an error that is not a *toolError becomes a 500.
func writeError(w http.ResponseWriter, err error) {
	te, ok := err.(*toolError)
	if !ok {
		te = &toolError{Status: http.StatusInternalServerError, Code: "INTERNAL",
			Hint: "retry later", Message: err.Error()}
	}
	writeJSON(w, te.Status, te)
}
