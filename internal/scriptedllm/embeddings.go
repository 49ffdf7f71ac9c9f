package scriptedllm

import (
	"encoding/json"
	"hash/fnv"
	"io"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/hermesbus/hermes/internal/prefilter"
)

// maxEmbedInputs bounds the texts of one embeddings request.
const maxEmbedInputs = 2048

// embeddings answers POST /v1/embeddings: one vector per input, in the OpenAI shape.
func (s *Server) embeddings(w http.ResponseWriter, r *http.Request) {
	e := s.script.Embeddings
	if e == nil {
		apiError(w, http.StatusNotFound, "not_found", "invalid_request_error", "", "this server has no embeddings")
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBodyBytes+1))
	if err != nil || len(body) > maxBodyBytes {
		apiError(w, http.StatusRequestEntityTooLarge, "body_too_large", "invalid_request_error", "", "the body is missing or larger than 8 MiB")
		return
	}
	var req struct {
		Model          string          `json:"model"`
		Input          json.RawMessage `json:"input"`
		EncodingFormat string          `json:"encoding_format"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		apiError(w, http.StatusBadRequest, "invalid_json", "invalid_request_error", "", "the body is not an embeddings request: "+err.Error())
		return
	}
	if req.Model == "" {
		apiError(w, http.StatusBadRequest, "missing_required_parameter", "invalid_request_error", "model", "you must provide a model parameter")
		return
	}
	if req.EncodingFormat != "" && req.EncodingFormat != "float" {
		apiError(w, http.StatusBadRequest, "invalid_value", "invalid_request_error", "encoding_format", "only float is served")
		return
	}
	var inputs []string
	if json.Unmarshal(req.Input, &inputs) != nil {
		var one string
		if json.Unmarshal(req.Input, &one) != nil {
			apiError(w, http.StatusBadRequest, "invalid_value", "invalid_request_error", "input", "input must be a string or an array of strings")
			return
		}
		inputs = []string{one}
	}
	if len(inputs) == 0 || len(inputs) > maxEmbedInputs {
		apiError(w, http.StatusBadRequest, "invalid_value", "invalid_request_error", "input", "input must hold 1 to 2048 texts")
		return
	}
	if e.BatchDelayMS > 0 && len(inputs) > 1 {
		select {
		case <-r.Context().Done():
			return
		case <-time.After(time.Duration(e.BatchDelayMS) * time.Millisecond):
		}
	}
	s.mu.Lock()
	fail := e.Status != 0 && (e.Times == 0 || s.embedFailed < e.Times)
	if fail {
		s.embedFailed++
	} else {
		s.embedded += len(inputs)
	}
	s.mu.Unlock()
	if fail {
		apiError(w, e.Status, "scripted_failure", "server_error", "", "the script fails embeddings")
		return
	}
	type datum struct {
		Object    string    `json:"object"`
		Index     int       `json:"index"`
		Embedding []float64 `json:"embedding"`
	}
	out := struct {
		Object string  `json:"object"`
		Data   []datum `json:"data"`
		Model  string  `json:"model"`
		Usage  struct {
			PromptTokens int `json:"prompt_tokens"`
			TotalTokens  int `json:"total_tokens"`
		} `json:"usage"`
	}{Object: "list", Model: req.Model}
	for i, text := range inputs {
		out.Data = append(out.Data, datum{Object: "embedding", Index: i, Embedding: e.vector(text)})
		out.Usage.PromptTokens += len(text)/4 + 1
	}
	out.Usage.TotalTokens = out.Usage.PromptTokens
	writeJSON(w, http.StatusOK, out)
}

// Embedded counts the texts the server embedded, and the embeddings requests it failed.
func (s *Server) Embedded() (texts, failed int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.embedded, s.embedFailed
}

// vector is text's deterministic vector: its concepts' dimensions, its other words hashed.
func (e *Embeddings) vector(text string) []float64 {
	dims := e.Dimensions
	if dims == 0 {
		dims = 64
	}
	v := make([]float64, dims)
	lower := strings.ToLower(text)
	for i, group := range e.Concepts {
		for _, word := range group {
			if word != "" && strings.Contains(lower, strings.ToLower(word)) {
				v[i] += 3
			}
		}
	}
	if rest := dims - len(e.Concepts); rest > 0 {
		for _, tok := range prefilter.Tokens(text) {
			h := fnv.New32a()
			h.Write([]byte(tok))
			v[len(e.Concepts)+int(h.Sum32()%uint32(rest))] += 0.25
		}
	}
	var n float64
	for _, x := range v {
		n += x * x
	}
	if n > 0 {
		n = math.Sqrt(n)
		for i := range v {
			v[i] = math.Round(v[i]/n*1e6) / 1e6
		}
	}
	return v
}
