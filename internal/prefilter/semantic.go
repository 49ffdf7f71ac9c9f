package prefilter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// Embedder turns texts into vectors, one each and in order: a backend's /v1/embeddings.
type Embedder interface {
	Embed(ctx context.Context, texts []string) ([][]float32, error)
}

// ErrPaused is a Rank refused because the embedder failed moments ago: rather than have every
// message wait on an embedder that is down, the semantic ranking rests for PauseAfterFailure.
var ErrPaused = errors.New("prefilter: the embedding model failed moments ago; ranking by meaning rests")

// ErrWarming is a Rank refused because the tools' vectors are not all known: Warm asks for
// them (a message never waits for them, nor asks for them again while they come).
var ErrWarming = errors.New("prefilter: the tools' vectors are not all known yet")

// Semantic ranks tools by meaning: the cosine of a message's embedding with each tool's (its
// name, description and arguments as one text). A tool's vector is asked for once per text —
// a contract's new revision with another description is another text — and kept (at most
// MaxToolVectors), asked for by Warm; a message's is kept per normalized message (at most
// messageCache). Vectors of differing lengths (the model was changed under its name) empty
// both, to be asked for again. After a failure, Rank and Warm rest for PauseAfterFailure
// (ErrPaused). Safe for concurrent use.
type Semantic struct {
	embed Embedder

	mu       sync.Mutex
	tools    map[[32]byte][]float32 // by the text's digest
	failedAt time.Time
	lastErr  error
	warming  sync.Mutex // held by Warm

	messages *lru[[]float32]
}

// Bounds of a Semantic: the tool vectors it keeps, the messages whose vectors it keeps, how
// many texts one embedding request carries, and how long it rests after a failure.
const (
	MaxToolVectors    = 4096
	messageCache      = 1024
	embedBatch        = 32
	PauseAfterFailure = 30 * time.Second
)

// NewSemantic ranks with e's vectors.
func NewSemantic(e Embedder) *Semantic {
	return &Semantic{embed: e, tools: map[[32]byte][]float32{}, messages: newLRU[[]float32](messageCache)}
}

// Rank returns ix's tools by their similarity to message, best first: at most k (k <= 0: all)
// whose similarity is at least minSimilarity (and above 0). None for a message with no text.
// It asks the embedder for the message's vector only: ErrWarming when a tool's is not known
// (Warm it). An error when the embedder fails — or runs out ctx's deadline — or answers
// vectors that cannot be compared (none, differing lengths, not numbers); ErrPaused when it
// failed less than PauseAfterFailure ago. A caller that cancels ctx is no failure of the
// embedder's.
func (s *Semantic) Rank(ctx context.Context, ix *Index, message string, k int, minSimilarity float64) ([]Candidate, error) {
	key := Normalize(message)
	if ix.Len() == 0 || key == "" {
		return nil, nil
	}
	if err := s.paused(); err != nil {
		return nil, err
	}
	out, err := s.rank(ctx, ix, key, k, minSimilarity)
	if errors.Is(err, errLengths) {
		// The model answers vectors of another length than those kept: it was changed.
		// Everything kept is of the old one: the tools' are to be asked for again.
		s.mu.Lock()
		s.tools = map[[32]byte][]float32{}
		s.mu.Unlock()
		s.messages.clear()
		return nil, fmt.Errorf("%w (the embedding model's vectors changed length)", ErrWarming)
	}
	s.failed(ctx, err)
	return out, err
}

// Warm asks for the vectors of ix's tools not known yet. Calls of one Semantic take turns,
// so a vector is asked for once however many ask.
func (s *Semantic) Warm(ctx context.Context, ix *Index) error {
	if err := s.paused(); err != nil {
		return err
	}
	s.warming.Lock()
	defer s.warming.Unlock()
	_, err := s.toolVectors(ctx, ix)
	s.failed(ctx, err)
	return err
}

// failed remembers err, when it is the embedder's: not ErrWarming, not the caller's leaving.
func (s *Semantic) failed(ctx context.Context, err error) {
	if err == nil || errors.Is(err, ErrWarming) || errors.Is(ctx.Err(), context.Canceled) {
		return
	}
	s.mu.Lock()
	s.failedAt, s.lastErr = time.Now(), err
	s.mu.Unlock()
}

func (s *Semantic) paused() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lastErr != nil && time.Since(s.failedAt) < PauseAfterFailure {
		return fmt.Errorf("%w (for %s more; it said: %v)", ErrPaused, (PauseAfterFailure - time.Since(s.failedAt)).Round(time.Second), s.lastErr)
	}
	return nil
}

var errLengths = errors.New("prefilter: the embedding model answered vectors of differing lengths")

func (s *Semantic) rank(ctx context.Context, ix *Index, key string, k int, minSimilarity float64) ([]Candidate, error) {
	tools := make([][]float32, len(ix.docs))
	known := 0
	s.mu.Lock()
	for i := range ix.docs {
		if v, ok := s.tools[ix.digests[i]]; ok {
			tools[i] = v
			known++
		}
	}
	s.mu.Unlock()
	if known < len(tools) {
		return nil, fmt.Errorf("%w (%d of %d)", ErrWarming, known, len(tools))
	}
	q, ok := s.messages.get(key)
	if !ok {
		vs, err := s.embedAll(ctx, []string{key}, nil)
		if err != nil {
			return nil, err
		}
		q = vs[0]
		s.messages.put(key, q)
	}
	var out []Candidate
	for i, v := range tools {
		if len(v) != len(q) {
			return nil, fmt.Errorf("%w (%d and %d)", errLengths, len(v), len(q))
		}
		sim := math.Round(dot(q, v)*1000) / 1000
		if sim >= minSimilarity && sim > 0 {
			out = append(out, Candidate{Name: ix.names[i], Similarity: sim})
		}
	}
	bestFirst(out, func(c Candidate) (float64, string) { return c.Similarity, c.Name })
	if k > 0 && len(out) > k {
		out = out[:k]
	}
	return out, nil
}

// toolVectors are ix's tools' vectors, in its order: those known, and the rest asked for (each
// batch kept as it comes).
func (s *Semantic) toolVectors(ctx context.Context, ix *Index) ([][]float32, error) {
	keys := ix.digests
	out := make([][]float32, len(ix.docs))
	var missing []int
	s.mu.Lock()
	for i := range ix.docs {
		if v, ok := s.tools[keys[i]]; ok {
			out[i] = v
		} else {
			missing = append(missing, i)
		}
	}
	s.mu.Unlock()
	if len(missing) == 0 {
		return out, nil
	}
	texts := make([]string, len(missing))
	for j, i := range missing {
		texts[j] = ix.docs[i]
	}
	keep := func(from int, vs [][]float32) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.tools)+len(vs) > MaxToolVectors {
			// Full: keep only this tool set's (tool sets before it are older revisions, mostly).
			mine := map[[32]byte][]float32{}
			for i, v := range out {
				if v != nil {
					mine[keys[i]] = v
				}
			}
			s.tools = mine
		}
		for j, v := range vs {
			i := missing[from+j]
			out[i] = v
			s.tools[keys[i]] = v
		}
	}
	if _, err := s.embedAll(ctx, texts, keep); err != nil {
		return nil, err
	}
	return out, nil
}

// embedAll embeds texts in batches, checking each answer; keep, when set, is given each
// batch's vectors as they come (from: the index of its first text).
func (s *Semantic) embedAll(ctx context.Context, texts []string, keep func(from int, vs [][]float32)) ([][]float32, error) {
	var out [][]float32
	for from := 0; from < len(texts); from += embedBatch {
		batch := texts[from:min(from+embedBatch, len(texts))]
		vs, err := s.embed.Embed(ctx, batch)
		if err != nil {
			return nil, err
		}
		if len(vs) != len(batch) {
			return nil, fmt.Errorf("prefilter: the embedding model answered %d vectors for %d texts", len(vs), len(batch))
		}
		for _, v := range vs {
			if err := checkVector(v); err != nil {
				return nil, err
			}
			if len(v) != len(vs[0]) || len(out) > 0 && len(v) != len(out[0]) {
				return nil, fmt.Errorf("%w (%d and %d)", errLengths, len(v), len(vs[0]))
			}
		}
		for _, v := range vs {
			unit(v)
		}
		if keep != nil {
			keep(from, vs)
		}
		out = append(out, vs...)
	}
	return out, nil
}

// MaxDimensions bounds a vector's length.
const MaxDimensions = 8192

func checkVector(v []float32) error {
	if len(v) == 0 || len(v) > MaxDimensions {
		return fmt.Errorf("prefilter: the embedding model answered a vector of %d dimensions (1 to %d expected)", len(v), MaxDimensions)
	}
	for _, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return errors.New("prefilter: the embedding model answered a vector that holds a value that is not a number")
		}
	}
	return nil
}

// unit scales v to length 1 (all zeros stay so): the dot product of two such is the cosine
// of their angle.
func unit(v []float32) {
	var n float64
	for _, x := range v {
		n += float64(x) * float64(x)
	}
	if n == 0 {
		return
	}
	n = math.Sqrt(n)
	for i := range v {
		v[i] = float32(float64(v[i]) / n)
	}
}

// dot is a·b (four sums at once: the loop is the semantic ranking's cost).
func dot(a, b []float32) float64 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return float64(s0 + s1 + s2 + s3)
}

// Fuse merges a lexical and a semantic ranking into one (reciprocal rank fusion: each tool
// scores 1/(60+rank) in each list it is on), best first, at most k (k <= 0: all); each
// candidate keeps its scores from both.
func Fuse(lexical, semantic []Candidate, k int) []Candidate {
	const c = 60
	type fused struct {
		Candidate
		rrf float64
	}
	byName := map[string]*fused{}
	var all []*fused
	at := func(name string) *fused {
		f, ok := byName[name]
		if !ok {
			f = &fused{Candidate: Candidate{Name: name}}
			byName[name] = f
			all = append(all, f)
		}
		return f
	}
	for i, l := range lexical {
		f := at(l.Name)
		f.Score, f.rrf = l.Score, f.rrf+1/float64(c+i+1)
	}
	for i, s := range semantic {
		f := at(s.Name)
		f.Similarity, f.rrf = s.Similarity, f.rrf+1/float64(c+i+1)
	}
	bestFirst(all, func(f *fused) (float64, string) { return f.rrf, f.Name })
	if k > 0 && len(all) > k {
		all = all[:k]
	}
	out := make([]Candidate, len(all))
	for i, f := range all {
		out[i] = f.Candidate
	}
	return out
}
