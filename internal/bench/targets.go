package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// NewClient returns an HTTP client that keeps enough idle connections for conc clients.
func NewClient(conc int) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		MaxIdleConns: conc * 4, MaxIdleConnsPerHost: conc * 4, IdleConnTimeout: time.Minute, DisableCompression: true}}
}

// Hermes sends requests of Calls calls of Tool with Args to a gateway.
type Hermes struct {
	Client *http.Client
	// URL is the gateway base URL.
	URL string
	// Key is the API key sent with each request.
	Key   string
	Tool  string
	Calls int
	// Args is each call's arguments (a JSON object).
	Args string
	// RunID makes request ids unique across runs.
	RunID string
	// SessionPerClient sends each client's requests in one session of its own (as a chat
	// would), instead of each request in a session of its own.
	SessionPerClient bool
	// Keep, when set, is given the id, session and number of calls of each request answered.
	Keep func(requestID, session string, calls int)
}

// Do posts one request and checks it succeeded.
func (h *Hermes) Do(ctx context.Context, client, seq int) error {
	var b strings.Builder
	rid, session := fmt.Sprintf("%s-%d-%d", h.RunID, client, seq), ""
	fmt.Fprintf(&b, `{"request_id":"%s",`, rid)
	if h.SessionPerClient {
		session = fmt.Sprintf("%s-s%d", h.RunID, client)
		fmt.Fprintf(&b, `"session_id":"%s",`, session)
	}
	b.WriteString(`"tool_calls":[`)
	for i := range h.Calls {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"tool_call_id":"c%d","name":%q,"arguments":%s}`, i, h.Tool, h.Args)
	}
	b.WriteString("]}")
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.URL+"/v1/route", strings.NewReader(b.String()))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if h.Key != "" {
		req.Header.Set("Authorization", "Bearer "+h.Key)
	}
	resp, err := h.Client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d: %.200s", resp.StatusCode, body)
	}
	var r struct {
		Status  string            `json:"status"`
		Results []json.RawMessage `json:"results"`
	}
	if err := json.Unmarshal(body, &r); err != nil || r.Status != "success" || len(r.Results) != h.Calls {
		return fmt.Errorf("unexpected response: %.200s", body)
	}
	if h.Keep != nil {
		if session == "" {
			session = rid // a request without a session is its own
		}
		h.Keep(rid, session, h.Calls)
	}
	return nil
}

// Direct calls a tool's URL Calls times in parallel, as Hermes would, without Hermes.
type Direct struct {
	Client *http.Client
	URL    string
	Calls  int
	Args   string
}

// Do makes the calls of one request.
func (d *Direct) Do(ctx context.Context, client, seq int) error {
	if d.Calls == 1 {
		return d.one(ctx, client, seq, 0)
	}
	var wg sync.WaitGroup
	errs := make([]error, d.Calls)
	for i := range d.Calls {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = d.one(ctx, client, seq, i) }()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func (d *Direct) one(ctx context.Context, client, seq, call int) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.URL, bytes.NewReader([]byte(d.Args)))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", fmt.Sprintf("direct-%d-%d/c%d", client, seq, call))
	resp, err := d.Client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return nil
}
