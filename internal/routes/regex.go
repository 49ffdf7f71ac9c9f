package routes

import (
	"errors"
	"fmt"
	"regexp"
	"regexp/syntax"
	"strconv"
	"strings"
)

// compileIntentRegex translates a Python-style pattern to Go syntax, anchors it at the start of
// the intent (re.match semantics) and works out the parameter name of every capture group. Its
// errors read as the reason of a LoadError about the intent_regex field.
func compileIntentRegex(pattern string) (*regexp.Regexp, []string, error) {
	goPattern := translatePython(pattern)
	// Compile the pattern alone first: a pattern that compiles is balanced, so wrapping it in a
	// group cannot change its meaning, and the error (if any) is about the user's pattern.
	if _, err := regexp.Compile(goPattern); err != nil {
		hint := ""
		var se *syntax.Error
		if errors.As(err, &se) && (se.Code == syntax.ErrInvalidPerlOp || se.Code == syntax.ErrInvalidEscape) {
			hint = " (RE2 has no lookaround or backreferences)"
		}
		return nil, nil, fmt.Errorf("is not a valid RE2 regexp%s: %w", hint, err)
	}
	re, err := regexp.Compile(`^(?:` + goPattern + `)`)
	if err != nil {
		return nil, nil, fmt.Errorf("does not compile once anchored: %w", err)
	}
	names := re.SubexpNames()
	params := make([]string, len(names))
	seen := make(map[string]int, len(names))
	for g := 1; g < len(names); g++ {
		name := names[g]
		if name == "" {
			name = "match_" + strconv.Itoa(g)
		}
		if prev, dup := seen[name]; dup {
			return nil, nil, fmt.Errorf("groups %d and %d both give parameter %q", prev, g, name)
		}
		seen[name] = g
		params[g] = name
	}
	return re, params, nil
}

// pythonClasses are the Unicode meanings Python 3 gives \d, \w and \s (and their negations) in
// str patterns; Go's are ASCII-only. in is the form used inside a character class, where a
// negated class cannot be spelled: there \W and \S keep Go's ASCII meaning. _ comes first so
// that a following - cannot form a range with it.
var pythonClasses = map[byte]struct{ out, in string }{
	'd': {`\p{Nd}`, `\p{Nd}`},
	'D': {`\P{Nd}`, `\P{Nd}`},
	'w': {`[_\p{L}\p{N}]`, `_\p{L}\p{N}`},
	'W': {`[^_\p{L}\p{N}]`, `\W`},
	's': {`[\t\n\v\f\r\x1c-\x1f\x85\p{Z}]`, `\t\n\v\f\r\x1c-\x1f\x85\p{Z}`},
	'S': {`[^\t\n\v\f\r\x1c-\x1f\x85\p{Z}]`, `\S`},
}

// translatePython rewrites the Python-only parts of a pattern into Go syntax:
//   - \uXXXX and \UXXXXXXXX become \x{…};
//   - \Z becomes \z;
//   - \d, \w, \s and their negations get Python's Unicode meaning (so \w matches 王);
//
// An escaped backslash (\\) is copied as is, so \\u stays a literal backslash followed by u.
// Everything else, including (?P<name>…), is left to Go's parser, which rejects what RE2 cannot
// run (lookaround, backreferences). \b stays ASCII-based.
func translatePython(p string) string {
	if !strings.Contains(p, `\`) {
		return p
	}
	var b strings.Builder
	b.Grow(len(p) + 16)
	inClass := false
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '\\' && i+1 < len(p):
			next := p[i+1]
			class, isClass := pythonClasses[next]
			switch {
			case next == 'u' && isHex(p[i+2:], 4):
				b.WriteString(`\x{` + p[i+2:i+6] + `}`)
				i += 5
			case next == 'U' && isHex(p[i+2:], 8):
				b.WriteString(`\x{` + p[i+2:i+10] + `}`)
				i += 9
			case next == 'Z' && !inClass:
				b.WriteString(`\z`)
				i++
			case isClass && inClass:
				b.WriteString(class.in)
				i++
			case isClass:
				b.WriteString(class.out)
				i++
			default:
				b.WriteByte(c)
				b.WriteByte(next)
				i++
			}
		case c == '[' && !inClass:
			// A ] right after [ or [^ is a member, not the end of the class.
			inClass = true
			j := i + 1
			if j < len(p) && p[j] == '^' {
				j++
			}
			if j < len(p) && p[j] == ']' {
				j++
			}
			b.WriteString(p[i:j])
			i = j - 1
		case c == '[' && strings.HasPrefix(p[i:], "[:"):
			// A POSIX class such as [:alpha:] inside a class (Go syntax) does not end it.
			if end := strings.Index(p[i+2:], ":]"); end >= 0 {
				b.WriteString(p[i : i+2+end+2])
				i += 2 + end + 1
			} else {
				b.WriteByte(c)
			}
		case c == ']' && inClass:
			inClass = false
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// isHex reports whether s starts with n hexadecimal digits.
func isHex(s string, n int) bool {
	if len(s) < n {
		return false
	}
	for i := range n {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}
