package blueprints

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermesbus/hermes/pkg/protocol"
)

// Status is where a run stands.
type Status string

// A run's statuses. Pending, Running and Waiting go on (a run waits on an approval); the
// others are final.
const (
	Pending     Status = "pending"
	Running     Status = "running"
	Waiting     Status = "waiting_approval"
	Succeeded   Status = "succeeded"
	Failed      Status = "failed"
	Transferred Status = "transferred"
)

// Final reports whether s is a final status.
func (s Status) Final() bool { return s == Succeeded || s == Failed || s == Transferred }

// StepStatus is where one step stands.
type StepStatus string

// A step's statuses.
const (
	StepPending   StepStatus = "pending"
	StepRunning   StepStatus = "running"
	StepParked    StepStatus = "waiting_approval"
	StepSucceeded StepStatus = "succeeded"
	StepFailed    StepStatus = "failed"
	StepSkipped   StepStatus = "skipped"
	// StepNotRun: the run ended (a fallback) before the step's turn.
	StepNotRun StepStatus = "not_run"
)

// done reports whether a step has ended (succeeded, failed or skipped, or not run).
func (s StepStatus) done() bool {
	return s == StepSucceeded || s == StepFailed || s == StepSkipped || s == StepNotRun
}

// Run is a blueprint run as the runs' bucket keeps it: what was asked, and each step's state.
// Everything in it but the lease is also what a crash resumes from: a step that has an output
// is never run again.
type Run struct {
	RunID     string `json:"run_id"`
	Blueprint string `json:"blueprint"`
	Version   int    `json:"version"`
	SessionID string `json:"session_id"`
	// Caller made the run (its steps run as this caller); Owner names whom the run's session
	// belongs to.
	Caller    *protocol.Caller      `json:"caller,omitempty"`
	Owner     string                `json:"owner,omitempty"`
	Trace     protocol.TraceContext `json:"trace"`
	UserInput json.RawMessage       `json:"user_input"`
	// Fingerprint tells the same run asked again (idempotent by run_id) from another.
	Fingerprint string    `json:"fingerprint"`
	Status      Status    `json:"status"`
	Steps       []StepRun `json:"steps"`
	// Fallback is the blueprint's (or a step's) fallback, once taken.
	Fallback *FallbackTaken `json:"fallback,omitempty"`
	// Error says why the run failed, naming the step.
	Error      *RunError  `json:"error,omitempty"`
	CreatedAt  time.Time  `json:"created_at"`
	UpdatedAt  time.Time  `json:"updated_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	// Holder runs it until LeaseUntil; past it, any runner may take it over.
	Holder     string    `json:"holder,omitempty"`
	LeaseUntil time.Time `json:"lease_until"`
}

// StepRun is one step of a run.
type StepRun struct {
	// ID is the step's place ("1", "2.0" for the first member of group 2, "fallback").
	ID         string     `json:"id"`
	Tool       string     `json:"tool"`
	OutputKey  string     `json:"output_key,omitempty"`
	Status     StepStatus `json:"status"`
	RequestID  string     `json:"request_id,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
	ApprovalID string     `json:"approval_id,omitempty"`
	// Attempts counts the step's attempts past the first one's (its retry), when it had any.
	Attempts int `json:"attempts,omitempty"`
	// Condition is the step's condition as evaluated: its result and the values it read.
	Condition *Condition      `json:"condition,omitempty"`
	Input     json.RawMessage `json:"input,omitempty"`
	Output    json.RawMessage `json:"output,omitempty"`
	Error     *StepError      `json:"error,omitempty"`
	StartedAt *time.Time      `json:"started_at,omitempty"`
	EndedAt   *time.Time      `json:"ended_at,omitempty"`
	// DurationMS is how long the step took, approval waits included.
	DurationMS int64 `json:"duration_ms,omitempty"`
	// Fallback marks a fallback step.
	Fallback bool `json:"fallback,omitempty"`
}

// Condition is a step's condition, evaluated.
type Condition struct {
	Expr   string         `json:"expr"`
	Result bool           `json:"result"`
	Values map[string]any `json:"values,omitempty"`
}

// StepError is why a step failed.
type StepError struct {
	Code    string `json:"code"`
	Origin  string `json:"origin,omitempty"`
	Message string `json:"message"`
}

// RunError is why a run failed.
type RunError struct {
	Step    string `json:"step,omitempty"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// FallbackTaken is a fallback as taken.
type FallbackTaken struct {
	// Step names the step whose failure took it.
	Step       string    `json:"step"`
	Message    string    `json:"message,omitempty"`
	TransferTo string    `json:"transfer_to,omitempty"`
	At         time.Time `json:"at"`
}

// Context is the run's context as its steps read it: user_input and each output so far.
func (r *Run) Context() (map[string]any, error) {
	ctx := map[string]any{}
	in, err := decodeValue(r.UserInput)
	if err != nil {
		return nil, fmt.Errorf("user_input: %w", err)
	}
	ctx["user_input"] = in
	for i := range r.Steps {
		s := &r.Steps[i]
		if s.OutputKey == "" || (s.Status != StepSucceeded && s.Status != StepSkipped) {
			continue
		}
		var v any
		if len(s.Output) > 0 {
			var err error
			if v, err = decodeValue(s.Output); err != nil {
				return nil, fmt.Errorf("step %s: output: %w", s.ID, err)
			}
		}
		ctx[s.OutputKey] = v
	}
	return ctx, nil
}

// decodeValue decodes a JSON value with its numbers kept as written (json.Number): an id of
// 19 digits reaches the next step's arguments as it came, not rounded to a float64.
func decodeValue(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

// Step returns the run's step id, nil when it has none.
func (r *Run) Step(id string) *StepRun {
	for i := range r.Steps {
		if r.Steps[i].ID == id {
			return &r.Steps[i]
		}
	}
	return nil
}

// Fingerprint is what tells one run from another under the same id.
func Fingerprint(blueprint string, userInput json.RawMessage) string {
	h := sha256.New()
	h.Write([]byte(blueprint))
	h.Write([]byte{0})
	h.Write(userInput)
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// Errors of the runs' store.
var (
	ErrRunNotFound = errors.New("no such run")
	// ErrFull: the runs' bucket holds as much as it may; no run can begin until runs age out.
	ErrFull = errors.New("the runs' bucket is full")
	// ErrRunConflict: the run id names another run.
	ErrRunConflict = errors.New("the run_id names another run")
	errRunChanged  = errors.New("the run changed meanwhile")
)

// KV is what the runs' store needs of its bucket.
type KV interface {
	Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error)
	Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error)
	Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error)
}

// Runs keeps runs in the runs' bucket, key the run id.
type Runs struct {
	KV KV
	// MaxBytes bounds a run as kept.
	MaxBytes int
}

// Create keeps r unless its id is taken: then the run kept under it is returned, with
// created false (ErrRunConflict when it is another caller's, or another run).
func (s *Runs) Create(ctx context.Context, r *Run) (got *Run, rev uint64, created bool, err error) {
	data, err := s.encodeWithin(r, createRoom)
	if err != nil {
		return nil, 0, false, err
	}
	rev, err = s.KV.Create(ctx, r.RunID, data)
	if err == nil {
		return r, rev, true, nil
	}
	if strings.Contains(err.Error(), "maximum bytes exceeded") {
		return nil, 0, false, fmt.Errorf("%w: keep the run: %v", ErrFull, err)
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return nil, 0, false, fmt.Errorf("keep the run: %w", err)
	}
	got, rev, err = s.Get(ctx, r.RunID)
	if err != nil {
		return nil, 0, false, err
	}
	if got.Owner != r.Owner || got.Fingerprint != r.Fingerprint {
		return nil, 0, false, fmt.Errorf("%w: run_id %s was used for another run; choose another", ErrRunConflict, r.RunID)
	}
	return got, rev, false, nil
}

// Get reads run id.
func (s *Runs) Get(ctx context.Context, id string) (*Run, uint64, error) {
	if !protocol.ValidToken(id, protocol.MaxRunIDLen) {
		return nil, 0, fmt.Errorf("%w: %s", ErrRunNotFound, protocol.Shorten(id, 40))
	}
	e, err := s.KV.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, fmt.Errorf("%w: %s", ErrRunNotFound, id)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read the run %s: %w", id, err)
	}
	r, err := DecodeRun(id, e.Value())
	if err != nil {
		return nil, 0, err
	}
	return r, e.Revision(), nil
}

// Update writes r over revision rev: errRunChanged when someone wrote it since.
func (s *Runs) Update(ctx context.Context, r *Run, rev uint64) (uint64, error) {
	data, err := s.encode(r)
	if err != nil {
		return 0, err
	}
	rev, err = s.KV.Update(ctx, r.RunID, data, rev)
	switch {
	case err == nil:
		return rev, nil
	case errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		return 0, errRunChanged
	}
	return 0, fmt.Errorf("keep the run %s: %w", r.RunID, err)
}

func (s *Runs) encode(r *Run) ([]byte, error) {
	return s.encodeWithin(r, 0)
}

// createRoom is what a run's record must leave free when it is kept first: its holder, lease,
// and the error it may end with.
const createRoom = 8 << 10

// encodeWithin encodes r, refusing it unless it leaves room bytes free under MaxBytes.
func (s *Runs) encodeWithin(r *Run, room int) ([]byte, error) {
	data, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	if s.MaxBytes > 0 && len(data)+room > s.MaxBytes {
		return nil, &BoundError{What: "the run's record (its input, steps and outputs)", Size: len(data) + room, Limit: s.MaxBytes}
	}
	return data, nil
}

// BoundError: something a run grows passed its bound.
type BoundError struct {
	What        string
	Size, Limit int
}

func (e *BoundError) Error() string {
	return fmt.Sprintf("%s takes %d bytes; at most %d", e.What, e.Size, e.Limit)
}

// DecodeRun reads a run kept under id, refusing what is not one.
func DecodeRun(id string, data []byte) (*Run, error) {
	var r Run
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("the run %s: %w", id, err)
	}
	if r.RunID != id || r.Blueprint == "" || r.Version < 1 || !strings.HasPrefix(r.SessionID, protocol.RunPrefix) {
		return nil, fmt.Errorf("the run kept under %s is not its own", id)
	}
	return &r, nil
}
