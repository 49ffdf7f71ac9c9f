package prefilter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// concepts embeds a text by the groups of words it holds (words of a group mean alike), plus
// one dimension every text shares a little of.
type concepts struct {
	groups [][]string
	mu     sync.Mutex
	texts  []string // every text asked for
	err    error
	answer func(texts []string) [][]float32 // when set, answers instead
}

func (c *concepts) Embed(_ context.Context, texts []string) ([][]float32, error) {
	c.mu.Lock()
	c.texts = append(c.texts, texts...)
	c.mu.Unlock()
	if c.err != nil {
		return nil, c.err
	}
	if c.answer != nil {
		return c.answer(texts), nil
	}
	var out [][]float32
	for _, t := range texts {
		v := make([]float32, len(c.groups)+1)
		v[len(c.groups)] = 0.1
		for i, g := range c.groups {
			for _, w := range g {
				if strings.Contains(strings.ToLower(t), w) {
					v[i]++
				}
			}
		}
		out = append(out, v)
	}
	return out, nil
}

func (c *concepts) asked() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.texts)
}

var officeConcepts = [][]string{{"天气", "下雨", "气温"}, {"会议", "开会", "碰头"}, {"订单", "快递", "包裹"}}

// A message no word of which names a tool is matched by meaning: lexically nothing
// qualifies, semantically the weather tool does; fused, it leads.
func TestSemanticFindsWhatWordsMiss(t *testing.T) {
	ix := New(office())
	e := &concepts{groups: officeConcepts}
	s := NewSemantic(e)
	if _, err := s.Rank(t.Context(), ix, "会下雨吗", 3, 0); !errors.Is(err, ErrWarming) || len(e.asked()) != 0 {
		t.Fatalf("ranked before the tools' vectors were asked for: %v", err)
	}
	if err := s.Warm(t.Context(), ix); err != nil {
		t.Fatal(err)
	}
	msg := "明早出门要带伞吗，会下雨吗"
	if lex := ix.Rank(msg, 3, 0.5); len(lex) != 0 {
		t.Logf("lexically: %v", lex)
	}
	sem, err := s.Rank(t.Context(), ix, msg, 3, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	if len(sem) != 1 || sem[0].Name != "weather_search" || sem[0].Similarity < 0.9 || sem[0].Score != 0 {
		t.Fatalf("semantically: %+v", sem)
	}
	fused := Fuse(ix.Rank(msg, 3, 0.5), sem, 3)
	if fused[0].Name != "weather_search" || fused[0].Similarity != sem[0].Similarity {
		t.Errorf("fused: %+v", fused)
	}
	// An order: its words and its meaning agree (the two order tools alike); both scores
	// are kept.
	msg = "我的快递到哪了，订单号 A1"
	sem, _ = s.Rank(t.Context(), ix, msg, 3, 0.5)
	fused = Fuse(ix.Rank(msg, 3, 0), sem, 3)
	top := names(fused[:2])
	slices.Sort(top)
	if !slices.Equal(top, []string{"logistics_urge", "order_query"}) || fused[0].Score <= 0 || fused[0].Similarity <= 0.5 {
		t.Errorf("fused: %+v", fused)
	}
}

// A tool's vector is asked for once per text, by Warm: the same tools again ask for nothing,
// a ranking only for its message's; a tool whose description changed (a new contract
// revision) is asked for again, the others not.
func TestToolVectorsAreKeptPerText(t *testing.T) {
	e := &concepts{groups: officeConcepts}
	s := NewSemantic(e)
	tools := office()
	ix := New(tools)
	for range 2 {
		if err := s.Warm(t.Context(), New(tools)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Rank(t.Context(), ix, "会下雨吗", 3, 0); err != nil {
		t.Fatal(err)
	}
	if n := len(e.asked()); n != len(tools)+1 {
		t.Fatalf("asked for %d texts", n)
	}
	tools[0].Description = "预订会议室（新版）"
	changed := New(tools)
	if _, err := s.Rank(t.Context(), changed, "会下雨吗", 3, 0); !errors.Is(err, ErrWarming) || !strings.Contains(err.Error(), "19 of 20") {
		t.Fatalf("%v", err)
	}
	if err := s.Warm(t.Context(), changed); err != nil {
		t.Fatal(err)
	}
	asked := e.asked()
	if len(asked) != len(tools)+2 || !strings.Contains(asked[len(asked)-1], "新版") {
		t.Errorf("asked for %v", asked[len(tools)+1:])
	}
}

// What the embedder answers is checked: a failure, too few vectors, vectors of differing
// lengths or holding what is not a number are errors (the caller ranks lexically instead).
func TestSemanticErrors(t *testing.T) {
	ix := New(office())
	for name, e := range map[string]*concepts{
		"fails":   {err: errors.New("connection refused")},
		"too few": {answer: func(texts []string) [][]float32 { return make([][]float32, len(texts)-1) }},
		"empty":   {answer: func(texts []string) [][]float32 { return make([][]float32, len(texts)) }},
		"not a number": {answer: func(texts []string) [][]float32 {
			out := make([][]float32, len(texts))
			for i := range out {
				out[i] = []float32{float32(math.NaN()), 1}
			}
			return out
		}},
		"lengths differ": {answer: func(texts []string) [][]float32 {
			out := make([][]float32, len(texts))
			for i := range out {
				out[i] = make([]float32, 4+i%2)
				out[i][0] = 1
			}
			return out
		}},
	} {
		if err := NewSemantic(e).Warm(t.Context(), ix); err == nil {
			t.Errorf("%s: no error", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

// A model changed under its name answers vectors of another length: what was kept is dropped,
// to be asked for again (ErrWarming); then the ranking goes on. A message with no text asks
// nothing.
func TestAnotherModelsVectors(t *testing.T) {
	ix := New(office())
	e := &concepts{groups: officeConcepts}
	s := NewSemantic(e)
	if err := s.Warm(t.Context(), ix); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Rank(t.Context(), ix, "会下雨吗", 3, 0.5); err != nil || len(got) != 1 {
		t.Fatal(got, err)
	}
	e.groups = append(slices.Clone(officeConcepts), []string{"酒店"}) // one dimension more
	if _, err := s.Rank(t.Context(), ix, "明天开会吧", 3, 0.5); !errors.Is(err, ErrWarming) {
		t.Fatalf("after the change: %v", err)
	}
	if err := s.Warm(t.Context(), ix); err != nil {
		t.Fatal(err)
	}
	got, err := s.Rank(t.Context(), ix, "明天开会吧", 3, 0.5)
	if err != nil || len(got) == 0 || got[0].Name != "meeting_book" {
		t.Fatalf("warmed again: %+v %v", got, err)
	}
	before := len(e.asked())
	if got, err := s.Rank(t.Context(), ix, "  \n ", 3, 0); err != nil || len(got) != 0 || len(e.asked()) != before {
		t.Errorf("an empty message: %v %v, asked %d", got, err, len(e.asked())-before)
	}
}

// An embedder that hangs fails by the ranking's deadline, and counts as failed: the next
// messages do not wait on it. A caller that leaves is no failure of the embedder's.
func TestAHangingEmbedderRests(t *testing.T) {
	ix := New(office())
	e := &concepts{groups: officeConcepts}
	h := &hanging{concepts: e}
	s := NewSemantic(h)
	if err := s.Warm(t.Context(), ix); err != nil {
		t.Fatal(err)
	}
	h.hang.Store(true)
	gone, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := s.Rank(gone, ix, "会下雨吗", 3, 0); err == nil || errors.Is(err, ErrPaused) {
		t.Fatal(err)
	}
	if err := s.paused(); err != nil {
		t.Fatalf("a caller that left paused the ranking: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if _, err := s.Rank(ctx, ix, "会下雨吗", 3, 0); err == nil {
		t.Fatal("no error")
	}
	if _, err := s.Rank(t.Context(), ix, "开个会", 3, 0); !errors.Is(err, ErrPaused) {
		t.Errorf("after the deadline: %v", err)
	}
}

// hanging waits for its caller to give up once hang is set.
type hanging struct {
	*concepts
	hang atomic.Bool
}

func (h *hanging) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	if h.hang.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return h.concepts.Embed(ctx, texts)
}

// An embedder that fails is not asked again for a while: every message in that time gets
// ErrPaused at once, naming what it said.
func TestAFailedEmbedderRests(t *testing.T) {
	e := &concepts{err: errors.New("connection refused")}
	s := NewSemantic(e)
	ix := New(office())
	if err := s.Warm(t.Context(), ix); err == nil || errors.Is(err, ErrPaused) {
		t.Fatal(err)
	}
	asked := len(e.asked())
	_, err := s.Rank(t.Context(), ix, "开个会", 3, 0)
	if !errors.Is(err, ErrPaused) || !strings.Contains(err.Error(), "connection refused") || len(e.asked()) != asked {
		t.Errorf("%v, asked %d more", err, len(e.asked())-asked)
	}
	if err := s.Warm(t.Context(), ix); !errors.Is(err, ErrPaused) {
		t.Errorf("warm: %v", err)
	}
	s.failedAt = time.Now().Add(-PauseAfterFailure)
	e.err = nil
	if err := s.Warm(t.Context(), ix); err != nil || len(e.asked()) != asked+len(office()) {
		t.Errorf("warm after the pause: %v", err)
	}
}

// The tools' vectors are kept batch by batch: a failure in a later batch keeps the earlier.
func TestBatchesAreKeptAsTheyCome(t *testing.T) {
	var many []Tool
	for i := range embedBatch + 10 {
		many = append(many, Tool{Name: fmt.Sprint("tool_", i), Description: "查询会议"})
	}
	s := NewSemantic(&failSecond{concepts: &concepts{groups: officeConcepts}})
	if err := s.Warm(t.Context(), New(many)); err == nil {
		t.Fatal("no error")
	}
	if n := len(s.tools); n != embedBatch {
		t.Errorf("kept %d vectors", n)
	}
}

// failSecond fails its second request.
type failSecond struct {
	*concepts
	n int
}

func (f *failSecond) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	if f.n++; f.n == 2 {
		return nil, errors.New("boom")
	}
	return f.concepts.Embed(ctx, texts)
}

// Reciprocal rank fusion: a tool high on both lists beats one first on only one; ties go by
// name; k bounds the result.
func TestFuse(t *testing.T) {
	lex := []Candidate{{Name: "a", Score: 9}, {Name: "b", Score: 5}, {Name: "c", Score: 1}}
	sem := []Candidate{{Name: "d", Similarity: 0.9}, {Name: "b", Similarity: 0.8}}
	got := Fuse(lex, sem, 3)
	if names(got)[0] != "b" || len(got) != 3 || got[0].Score != 5 || got[0].Similarity != 0.8 {
		t.Errorf("%+v", got)
	}
	if got := Fuse(nil, nil, 3); len(got) != 0 {
		t.Errorf("%+v", got)
	}
}

// hashed embeds each text as 768 numbers drawn from its digest: the shape of a real model's
// vectors, at no cost.
type hashed struct{}

func (hashed) Embed(_ context.Context, texts []string) ([][]float32, error) {
	out := make([][]float32, len(texts))
	for i, t := range texts {
		v := make([]float32, 768)
		h := uint32(2166136261)
		for _, c := range []byte(t) {
			h = (h ^ uint32(c)) * 16777619
		}
		for j := range v {
			h ^= h << 13
			h ^= h >> 17
			h ^= h << 5
			v[j] = float32(h%2001)/1000 - 1
		}
		out[i] = v
	}
	return out, nil
}

// Ranking 200 tools by meaning once their vectors and the message's are known (768
// dimensions): the cost the semantic half adds to a message beside the embedding request.
func BenchmarkSemanticRankKnown(b *testing.B) {
	ix := New(tools200())
	s := NewSemantic(hashed{})
	if err := s.Warm(b.Context(), ix); err != nil {
		b.Fatal(err)
	}
	if _, err := s.Rank(b.Context(), ix, "帮我定明天下午的会议室", 3, -1); err != nil {
		b.Fatal(err)
	}
	percentiles(b, func(int) {
		if _, err := s.Rank(b.Context(), ix, "帮我定明天下午的会议室", 3, -1); err != nil {
			b.Fatal(err)
		}
	})
}
