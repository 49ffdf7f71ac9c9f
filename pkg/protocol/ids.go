package protocol

import (
	"fmt"
	"unicode/utf8"
)

// MaxIDLen bounds every id that becomes a subject token or a KV key part.
const MaxIDLen = 128

// MaxToolNameLen bounds tool names (the same bound LLM tool-calling APIs use).
const MaxToolNameLen = 64

// ValidToken reports whether s is a non-empty run of at most max letters, digits, '-' and '_':
// the only ids Hermes puts into a subject, a consumer name or a KV key.
func ValidToken(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
		default:
			return false
		}
	}
	return true
}

// CheckID returns a FieldError naming field when id is not a valid token of at most MaxIDLen.
func CheckID(field, id string) error { return checkToken(field, id, MaxIDLen) }

// CheckToolName returns a FieldError naming field when name is not a valid tool name.
func CheckToolName(field, name string) error { return checkToken(field, name, MaxToolNameLen) }

func checkToken(field, s string, max int) error {
	if s == "" {
		return fieldErr(field, "is required")
	}
	if ValidToken(s, max) {
		return nil
	}
	if len(s) > max {
		return fieldErr(field, fmt.Sprintf("is %d bytes long; the limit is %d", len(s), max))
	}
	return fieldErr(field, fmt.Sprintf("must hold only letters, digits, '-' and '_' (got %s)", quoteShort(s)))
}

// quoteShort quotes s for an error message, cut to a readable length.
func quoteShort(s string) string {
	const max = 40
	if len(s) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		return fmt.Sprintf("%q…", s[:cut])
	}
	return fmt.Sprintf("%q", s)
}
