package prefilter

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
)

// Embedder turns texts into vectors, one each and in order: a backend's /v1/embeddings.
type Embedder interface {
	Embed(ctx context.Context, texts []string) ([][]float32, error)
}

// Semantic ranks tools by meaning: the cosine of a message's embedding with each tool's (its
// name, description and arguments as one text). A tool's vector is asked for once per text —
// a contract's new revision with another description is another text — and kept (at most
// MaxToolVectors); a message's is kept per normalized message (at most CacheSize). Safe for
// concurrent use.
type Semantic struct {
	embed Embedder

	mu    sync.Mutex
	tools map[[32]byte][]float32 // by the text's digest

	messages *lru[[]float32]
}

// MaxToolVectors bounds the tool vectors a Semantic keeps; embedBatch how many texts one
// embedding request carries.
const (
	MaxToolVectors = 8192
	embedBatch     = 128
)

// NewSemantic ranks with e's vectors. Vectors of one model only: another model, another
// Semantic.
func NewSemantic(e Embedder) *Semantic {
	return &Semantic{embed: e, tools: map[[32]byte][]float32{}, messages: newLRU[[]float32](CacheSize)}
}

// Rank returns ix's tools by their similarity to message, best first: at most k (k <= 0: all)
// whose similarity is at least minSimilarity. An error when the embedder fails or answers
// vectors that cannot be compared (none, too few, differing lengths, not numbers).
func (s *Semantic) Rank(ctx context.Context, ix *Index, message string, k int, minSimilarity float64) ([]Candidate, error) {
	if ix.Len() == 0 {
		return nil, nil
	}
	tools, err := s.toolVectors(ctx, ix)
	if err != nil {
		return nil, err
	}
	key := Normalize(message)
	q, ok := s.messages.get(key)
	if !ok {
		vs, err := s.embedAll(ctx, []string{key})
		if err != nil {
			return nil, err
		}
		q = vs[0]
		s.messages.put(key, q)
	}
	var out []Candidate
	for i, v := range tools {
		if len(v) != len(q) {
			return nil, fmt.Errorf("the embedding model answered vectors of %d and %d dimensions", len(v), len(q))
		}
		sim := math.Round(cosine(q, v)*1000) / 1000
		if sim >= minSimilarity && sim > 0 {
			out = append(out, Candidate{Name: ix.names[i], Similarity: sim})
		}
	}
	slices.SortStableFunc(out, func(a, b Candidate) int {
		switch {
		case a.Similarity > b.Similarity:
			return -1
		case a.Similarity < b.Similarity:
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	if k > 0 && len(out) > k {
		out = out[:k]
	}
	return out, nil
}

// toolVectors are ix's tools' vectors, in its order: those known, and the rest asked for.
func (s *Semantic) toolVectors(ctx context.Context, ix *Index) ([][]float32, error) {
	keys := make([][32]byte, len(ix.docs))
	out := make([][]float32, len(ix.docs))
	var missing []int
	s.mu.Lock()
	for i, d := range ix.docs {
		keys[i] = sha256.Sum256([]byte(d))
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
	vs, err := s.embedAll(ctx, texts)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if len(s.tools)+len(missing) > MaxToolVectors {
		// Full: keep only this tool set's (tool sets before it are older revisions, mostly).
		keep := map[[32]byte][]float32{}
		for i, v := range out {
			if v != nil {
				keep[keys[i]] = v
			}
		}
		s.tools = keep
	}
	for j, i := range missing {
		out[i] = vs[j]
		s.tools[keys[i]] = vs[j]
	}
	s.mu.Unlock()
	return out, nil
}

// embedAll embeds texts in batches, checking each answer.
func (s *Semantic) embedAll(ctx context.Context, texts []string) ([][]float32, error) {
	var out [][]float32
	for batch := range slices.Chunk(texts, embedBatch) {
		vs, err := s.embed.Embed(ctx, batch)
		if err != nil {
			return nil, err
		}
		if len(vs) != len(batch) {
			return nil, fmt.Errorf("the embedding model answered %d vectors for %d texts", len(vs), len(batch))
		}
		for _, v := range vs {
			if err := checkVector(v); err != nil {
				return nil, err
			}
		}
		out = append(out, vs...)
	}
	return out, nil
}

// MaxDimensions bounds a vector's length.
const MaxDimensions = 16384

func checkVector(v []float32) error {
	if len(v) == 0 || len(v) > MaxDimensions {
		return fmt.Errorf("the embedding model answered a vector of %d dimensions (1 to %d expected)", len(v), MaxDimensions)
	}
	for _, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return errors.New("the embedding model answered a vector that holds a value that is not a number")
		}
	}
	return nil
}

// cosine is the cosine of a and b's angle (0 when either is all zeros).
func cosine(a, b []float32) float64 {
	var dot, na, nb float64
	for i := range a {
		x, y := float64(a[i]), float64(b[i])
		dot += x * y
		na += x * x
		nb += y * y
	}
	if na == 0 || nb == 0 {
		return 0
	}
	return dot / math.Sqrt(na*nb)
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
	slices.SortStableFunc(all, func(a, b *fused) int {
		switch {
		case a.rrf > b.rrf:
			return -1
		case a.rrf < b.rrf:
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	if k > 0 && len(all) > k {
		all = all[:k]
	}
	out := make([]Candidate, len(all))
	for i, f := range all {
		out[i] = f.Candidate
	}
	return out
}
