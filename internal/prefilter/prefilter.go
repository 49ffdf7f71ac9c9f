// Package prefilter narrows the tools offered to a model to the few a message is about (seed
// 001 §2.2: coarse, then fine): a lexical ranking — BM25 over each tool's name, description
// and argument names and descriptions — cheap enough to run on every message. Latin text is
// split into words (snake_case names into their parts too), Chinese, Japanese
// and Korean text into character bigrams; everything is NFKC-normalized and lower-cased first.
// Pure Go, nothing downloaded or loaded at run time.
//
// An Index is built once per tool set (its Version names the set) and is safe for concurrent
// use; Rank results are remembered per normalized message in a bounded cache.
package prefilter

import (
	"crypto/sha256"
	"encoding/hex"
	"math"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Tool is what the prefilter reads of a tool.
type Tool struct {
	Name        string
	Description string
	// Args are its arguments' names and descriptions.
	Args []Arg
}

// Arg is one argument of a tool.
type Arg struct{ Name, Description string }

// Candidate is a tool ranked for a message, with its scores (higher is closer): Score the
// lexical one (BM25), Similarity the semantic one (the cosine of the two embeddings, when the
// semantic ranker ranked it).
type Candidate struct {
	Name       string
	Score      float64
	Similarity float64
}

// maxDocBytes bounds a tool's text as the semantic ranker embeds it: within the 512 tokens
// embedding models commonly take, Chinese text included.
const maxDocBytes = 1 << 10

// doc is the tool as one text: its name, description and arguments (the first maxDocBytes,
// whole characters).
func (t Tool) doc() string {
	var b strings.Builder
	b.WriteString(t.Name)
	if t.Description != "" {
		b.WriteString(": " + t.Description)
	}
	for i, a := range t.Args {
		if i == 0 {
			b.WriteString("\nArguments: ")
		} else {
			b.WriteString("; ")
		}
		b.WriteString(a.Name)
		if a.Description != "" {
			b.WriteString(" (" + a.Description + ")")
		}
	}
	return cutBytes(b.String(), maxDocBytes)
}

// cutBytes is s's first n bytes at most, ending on a whole character.
func cutBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Field weights: a word in a tool's name counts three times, in an argument's name twice.
const (
	nameWeight = 3
	argWeight  = 2
	// BM25's parameters, the usual ones.
	k1 = 1.2
	b  = 0.75
)

// CacheSize bounds the messages whose ranking an Index remembers, CacheTop the candidates it
// remembers of each.
const (
	CacheSize = 4096
	CacheTop  = 64
)

// MaxQueryBytes bounds how much of a message is read (its start).
const MaxQueryBytes = 8 << 10

// Index ranks one set of tools.
type Index struct {
	version  string
	names    []string
	docs     []string   // each tool as the semantic ranker embeds it
	digests  [][32]byte // of each doc: the semantic ranker's key for its vector
	lengths  []float64
	avgLen   float64
	postings map[string][]posting

	cache *lru[[]Candidate] // by normalized message: every tool that matched at all, best first (CacheTop)
}

type posting struct {
	doc int
	tf  float64
}

// New indexes tools.
func New(tools []Tool) *Index {
	ix := &Index{postings: map[string][]posting{}, cache: newLRU[[]Candidate](CacheSize)}
	h := sha256.New()
	sorted := slices.Clone(tools)
	slices.SortFunc(sorted, func(a, b Tool) int { return strings.Compare(a.Name, b.Name) })
	total := 0.0
	for i, t := range sorted {
		h.Write([]byte(t.Name + "\x00" + t.Description + "\x00"))
		counts := map[string]float64{}
		add := func(text string, weight float64) {
			for _, tok := range Tokens(text) {
				counts[tok] += weight
			}
		}
		add(t.Name, nameWeight)
		add(t.Description, 1)
		for _, a := range t.Args {
			h.Write([]byte(a.Name + "\x00" + a.Description + "\x00"))
			add(a.Name, argWeight)
			add(a.Description, 1)
		}
		length := 0.0
		for tok, n := range counts {
			ix.postings[tok] = append(ix.postings[tok], posting{doc: i, tf: n})
			length += n
		}
		ix.names = append(ix.names, t.Name)
		ix.docs = append(ix.docs, t.doc())
		ix.digests = append(ix.digests, sha256.Sum256([]byte(ix.docs[i])))
		ix.lengths = append(ix.lengths, length)
		total += length
	}
	if len(sorted) > 0 {
		ix.avgLen = total / float64(len(sorted))
	}
	ix.version = hex.EncodeToString(h.Sum(nil)[:12])
	return ix
}

// Version names the tool set the index was built from: the same tools, the same version.
func (ix *Index) Version() string { return ix.version }

// Len is how many tools it ranks.
func (ix *Index) Len() int { return len(ix.names) }

// Rank returns the tools message is about, best first: at most k (k <= 0: all) whose score is
// at least threshold (and above 0). Empty when nothing qualifies. The best CacheTop of each
// message are remembered; a Rank for more ranks again.
func (ix *Index) Rank(message string, k int, threshold float64) []Candidate {
	key := Normalize(message)
	top, ok := ix.cache.get(key)
	if !ok || (k <= 0 || k > CacheTop) && len(top) == CacheTop {
		top = ix.score(key)
		if !ok {
			ix.cache.put(key, top[:min(len(top), CacheTop):min(len(top), CacheTop)])
		}
	}
	out := make([]Candidate, 0, min(len(top), max(k, 0)))
	for _, c := range top {
		if (k > 0 && len(out) == k) || c.Score < threshold {
			break
		}
		out = append(out, c)
	}
	return out
}

// score ranks every tool that matches normalized query at all.
func (ix *Index) score(query string) []Candidate {
	n := float64(len(ix.names))
	if n == 0 {
		return nil
	}
	scores := make([]float64, len(ix.names))
	seen := map[string]bool{}
	for _, tok := range tokens(query) {
		if seen[tok] {
			continue
		}
		seen[tok] = true
		ps := ix.postings[tok]
		if len(ps) == 0 {
			continue
		}
		df := float64(len(ps))
		idf := math.Log(1 + (n-df+0.5)/(df+0.5))
		for _, p := range ps {
			norm := k1 * (1 - b + b*ix.lengths[p.doc]/ix.avgLen)
			scores[p.doc] += idf * p.tf * (k1 + 1) / (p.tf + norm)
		}
	}
	var out []Candidate
	for i, s := range scores {
		if s > 0 {
			out = append(out, Candidate{Name: ix.names[i], Score: math.Round(s*1000) / 1000})
		}
	}
	bestFirst(out, func(c Candidate) (float64, string) { return c.Score, c.Name })
	return out
}

// bestFirst sorts s by score, highest first, ties by name: the same ranking every time.
func bestFirst[T any](s []T, key func(T) (score float64, name string)) {
	slices.SortStableFunc(s, func(a, b T) int {
		sa, na := key(a)
		sb, nb := key(b)
		switch {
		case sa > sb:
			return -1
		case sa < sb:
			return 1
		}
		return strings.Compare(na, nb)
	})
}

// Normalize is message as the prefilter reads it: its first MaxQueryBytes, NFKC, lower case,
// runs of space as one.
func Normalize(message string) string {
	message = cutBytes(message, MaxQueryBytes)
	return strings.Join(strings.Fields(strings.ToLower(norm.NFKC.String(message))), " ")
}

// Tokens are text's terms: Normalize, then tokens.
func Tokens(text string) []string { return tokens(Normalize(text)) }

// tokens splits normalized text: words of letters and digits (and each part of a snake_case
// word, beside the word), and CJK runs into character bigrams (a lone character as
// itself).
func tokens(text string) []string {
	var out []string
	var word []rune
	var cjk []rune
	flushWord := func() {
		if len(word) == 0 {
			return
		}
		w := string(word)
		out = append(out, w)
		if parts := splitWord(w); len(parts) > 1 {
			out = append(out, parts...)
		}
		word = word[:0]
	}
	flushCJK := func() {
		switch len(cjk) {
		case 0:
		case 1:
			out = append(out, string(cjk))
		default:
			for i := 0; i+1 < len(cjk); i++ {
				out = append(out, string(cjk[i:i+2]))
			}
		}
		cjk = cjk[:0]
	}
	for _, r := range text {
		switch {
		case isCJK(r):
			flushWord()
			cjk = append(cjk, r)
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '_':
			flushCJK()
			word = append(word, r)
		default:
			flushWord()
			flushCJK()
		}
	}
	flushWord()
	flushCJK()
	return out
}

// splitWord splits a snake_case word into its parts.
func splitWord(w string) []string {
	var parts []string
	for p := range strings.SplitSeq(w, "_") {
		if p != "" {
			parts = append(parts, p)
		}
	}
	return parts
}

func isCJK(r rune) bool {
	return unicode.Is(unicode.Han, r) || unicode.Is(unicode.Hiragana, r) || unicode.Is(unicode.Katakana, r) || unicode.Is(unicode.Hangul, r)
}
