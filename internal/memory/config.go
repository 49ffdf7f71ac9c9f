package memory

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Config is memory's and intents' configuration, as hermes-config.yaml's memory: and intent:
// sections say it (the seed's memory-config.yaml and intent-decay.yaml load unchanged, alone
// or together in one file).
type Config struct {
	Memory MemoryConfig `yaml:"memory"`
	Intent IntentConfig `yaml:"intent"`
}

// MemoryConfig is the memory: section.
type MemoryConfig struct {
	// Filters are what a fragment must pass before it is stored.
	Filters []Filter `yaml:"filters"`
	// Rules draw fragments from a person's messages without the model.
	Rules []Rule `yaml:"rules"`
}

// Rule draws a fragment from a message its Pattern matches: Value is the fragment's value, in
// which $1…$9 stand for the pattern's groups (a string; "$1" alone takes the group as it is),
// then Values maps the whole value to another ({顺丰: SF-Express}).
type Rule struct {
	Pattern  string            `yaml:"pattern"`
	Type     string            `yaml:"type"`
	Key      string            `yaml:"key"`
	Value    string            `yaml:"value"`
	Values   map[string]string `yaml:"values"`
	Lifespan string            `yaml:"lifespan"`
	Tags     []string          `yaml:"semantic_tag"`

	re *regexp.Regexp
}

// MaxRules bounds a configuration's rules.
const MaxRules = 64

// Extract is what the rules draw from message, in the session (for session fragments): each
// rule whose pattern matches gives one write.
func (c *MemoryConfig) Extract(message, session string) []Write {
	if c == nil {
		return nil
	}
	var out []Write
	for _, r := range c.Rules {
		m := r.re.FindStringSubmatchIndex(message)
		if m == nil {
			continue
		}
		v := string(r.re.ExpandString(nil, r.Value, message, m))
		if mapped, ok := r.Values[v]; ok {
			v = mapped
		}
		value, _ := json.Marshal(v)
		w := Write{Type: r.Type, Key: r.Key, Value: value, Lifespan: r.Lifespan, Tags: r.Tags, Source: SourceRule}
		if r.Lifespan == LifespanSession {
			w.Session = session
		}
		out = append(out, w)
	}
	return out
}

// Filter kinds (Filter.Type): which fragments a filter judges.
const (
	// FilterSemantic judges what is kept beyond a session (lifespan a duration or forever):
	// the seed's preference memory.
	FilterSemantic = "semantic"
	// FilterSession judges session fragments (the context of one conversation).
	FilterSession = "session"
	// FilterAll judges every fragment.
	FilterAll = "all"
)

// Filter bounds.
const (
	MaxFilters        = 16
	MaxFilterPatterns = 64
	MaxPatternBytes   = 512
)

// Filter is one memory filter. A fragment it judges passes when its type or one of its tags is
// among IncludeTags (none: any), and the sentence it came from (or its value, when that is a
// string) matches none of ExcludePatterns.
type Filter struct {
	Type            string   `yaml:"type"`
	IncludeTags     []string `yaml:"include_tags"`
	ExcludePatterns []string `yaml:"exclude_patterns"`

	excludes []*regexp.Regexp
}

// IntentConfig is the intent: section (seed 003 §2.1).
type IntentConfig struct {
	// ConfidenceThreshold: below it, Hermes asks a clarifying question instead of calling a
	// tool (default 0.65).
	ConfidenceThreshold *float64 `yaml:"confidence_threshold"`
	// Decay is how long an intent's context lives, by business domain.
	Decay map[string]Duration `yaml:"decay"`
}

// DefaultConfidenceThreshold is the seed's default threshold.
const DefaultConfidenceThreshold = 0.65

// Threshold is the confidence threshold in force.
func (c IntentConfig) Threshold() float64 {
	if c.ConfidenceThreshold == nil {
		return DefaultConfidenceThreshold
	}
	return *c.ConfidenceThreshold
}

// Durations is the decay by domain as durations (Store.Decay).
func (c IntentConfig) Durations() map[string]time.Duration {
	out := make(map[string]time.Duration, len(c.Decay))
	for d, v := range c.Decay {
		out[d] = time.Duration(v)
	}
	return out
}

// Duration is a lifespan duration in a configuration file ("2h", "15m", "30d").
type Duration time.Duration

// UnmarshalYAML reads a duration as ParseLifespan does (a duration only).
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	l, err := ParseLifespan(s)
	if err != nil || l.Forever || l.Session {
		return fmt.Errorf("line %d: %q is not a duration such as 2h, 15m or 30d", n.Line, s)
	}
	*d = Duration(l.For)
	return nil
}

// LoadConfig reads a configuration file: unknown fields, bad durations, thresholds out of
// [0, 1] and patterns that do not compile are errors that name them.
func LoadConfig(data []byte) (*Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("memory config: %w", err)
	}
	if err := c.compile(); err != nil {
		return nil, fmt.Errorf("memory config: %w", err)
	}
	return &c, nil
}

func (c *Config) compile() error {
	if len(c.Memory.Filters) > MaxFilters {
		return fmt.Errorf("memory.filters: %d filters; the limit is %d", len(c.Memory.Filters), MaxFilters)
	}
	for i := range c.Memory.Filters {
		f := &c.Memory.Filters[i]
		at := fmt.Sprintf("memory.filters[%d]", i)
		switch f.Type {
		case "":
			f.Type = FilterSemantic
		case FilterSemantic, FilterSession, FilterAll:
		default:
			return fmt.Errorf("%s.type: %q is not a filter type (semantic, session or all)", at, f.Type)
		}
		if len(f.IncludeTags) > MaxFilterPatterns || len(f.ExcludePatterns) > MaxFilterPatterns {
			return fmt.Errorf("%s: at most %d tags and %d patterns", at, MaxFilterPatterns, MaxFilterPatterns)
		}
		for j, t := range f.IncludeTags {
			if err := checkText(fmt.Sprintf("%s.include_tags[%d]", at, j), t, MaxTagBytes); err != nil {
				return err
			}
		}
		f.excludes = nil
		for j, p := range f.ExcludePatterns {
			if len(p) > MaxPatternBytes {
				return fmt.Errorf("%s.exclude_patterns[%d]: %d bytes; the limit is %d", at, j, len(p), MaxPatternBytes)
			}
			re, err := regexp.Compile(p)
			if err != nil {
				return fmt.Errorf("%s.exclude_patterns[%d]: %q does not compile: %v", at, j, p, err)
			}
			f.excludes = append(f.excludes, re)
		}
	}
	if len(c.Memory.Rules) > MaxRules {
		return fmt.Errorf("memory.rules: %d rules; the limit is %d", len(c.Memory.Rules), MaxRules)
	}
	for i := range c.Memory.Rules {
		r := &c.Memory.Rules[i]
		at := fmt.Sprintf("memory.rules[%d]", i)
		if r.Pattern == "" || len(r.Pattern) > MaxPatternBytes {
			return fmt.Errorf("%s.pattern: 1 to %d bytes", at, MaxPatternBytes)
		}
		re, err := regexp.Compile(r.Pattern)
		if err != nil {
			return fmt.Errorf("%s.pattern: %q does not compile: %v", at, r.Pattern, err)
		}
		r.re = re
		if r.Value == "" || len(r.Value) > MaxPatternBytes || len(r.Values) > MaxFilterPatterns {
			return fmt.Errorf("%s.value: 1 to %d bytes, and at most %d values", at, MaxPatternBytes, MaxFilterPatterns)
		}
		// The rule's fragment, as it would be written, must be one (its value aside).
		w := Write{Type: r.Type, Key: r.Key, Value: json.RawMessage(`""`), Lifespan: r.Lifespan, Tags: r.Tags}
		if r.Lifespan == LifespanSession {
			w.Session = "s"
		}
		if _, err := w.Check(); err != nil {
			return fmt.Errorf("%s: %w", at, err)
		}
	}
	if t := c.Intent.ConfidenceThreshold; t != nil && (*t < 0 || *t > 1) {
		return fmt.Errorf("intent.confidence_threshold: %v must be between 0 and 1", *t)
	}
	for domain, d := range c.Intent.Decay {
		if err := checkText("intent.decay key", domain, MaxTypeBytes); err != nil {
			return err
		}
		if d <= 0 {
			return fmt.Errorf("intent.decay.%s: must be a positive duration", domain)
		}
	}
	return nil
}

// Refusal is why a filter kept a fragment out.
type Refusal struct {
	Filter int
	Reason string
}

func (r *Refusal) Error() string {
	return fmt.Sprintf("memory.filters[%d] keeps it out: %s", r.Filter, r.Reason)
}

// Admit says whether w passes every filter that judges it; sentence is what the person said
// that it was drawn from ("" when it was not drawn from a sentence). A fragment kept out gets a
// *Refusal.
func (c *MemoryConfig) Admit(w *Write, sentence string) error {
	if c == nil {
		return nil
	}
	session := w.Lifespan == LifespanSession
	// What it was drawn from, and its value when that is text: a model told by a tool's answer
	// to keep a pleasantry is judged as the person saying it.
	texts := []string{strings.TrimSpace(sentence)}
	var v string
	if json.Unmarshal(w.Value, &v) == nil {
		texts = append(texts, strings.TrimSpace(v))
	}
	for i := range c.Filters {
		f := &c.Filters[i]
		if f.Type == FilterSemantic && session || f.Type == FilterSession && !session {
			continue
		}
		if len(f.IncludeTags) > 0 && !slices.Contains(f.IncludeTags, w.Type) && !slices.ContainsFunc(w.Tags, func(t string) bool { return slices.Contains(f.IncludeTags, t) }) {
			return &Refusal{Filter: i, Reason: fmt.Sprintf("its type %s and tags %v are none of include_tags %v", w.Type, w.Tags, f.IncludeTags)}
		}
		for j, re := range f.excludes {
			for k, text := range texts {
				if text != "" && re.MatchString(text) {
					what := "what it was drawn from"
					if k > 0 {
						what = "its value"
					}
					return &Refusal{Filter: i, Reason: fmt.Sprintf("%s matches exclude_patterns[%d] %q", what, j, f.ExcludePatterns[j])}
				}
			}
		}
	}
	return nil
}
