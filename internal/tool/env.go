package tool

import (
	"fmt"
	"os"
	"strings"
)

// EnvResolver resolves ${env.NAME} placeholders for names on an allow-list. A nil resolver
// allows nothing.
type EnvResolver struct {
	// Allowed holds the names that may be resolved.
	Allowed map[string]bool
	// Lookup reads a variable; nil means os.LookupEnv.
	Lookup func(string) (string, bool)
}

// envError explains a placeholder that was refused, naming the variable but never a value.
type envError struct {
	code, name, header string
}

func (e *envError) Error() string {
	if e.code == "ENV_UNSET" {
		return fmt.Sprintf("header %s uses ${env.%s}, which is not set on this worker", e.header, e.name)
	}
	return fmt.Sprintf("header %s uses ${env.%s}, which this worker does not allow (add it to --allow-env)", e.header, e.name)
}

// Resolve replaces every ${env.NAME} in value, the value of header.
func (r *EnvResolver) Resolve(header, value string) (string, error) {
	if !strings.Contains(value, "${") {
		return value, nil
	}
	var b strings.Builder
	rest := value
	for {
		i := strings.Index(rest, "${")
		if i < 0 {
			b.WriteString(rest)
			return b.String(), nil
		}
		b.WriteString(rest[:i])
		end := strings.IndexByte(rest[i:], '}')
		if end < 0 || !strings.HasPrefix(rest[i:], "${env.") {
			return "", fmt.Errorf("header %s holds a malformed placeholder", header)
		}
		name := rest[i+len("${env.") : i+end]
		if r == nil || !r.Allowed[name] {
			return "", &envError{code: "ENV_NOT_ALLOWED", name: name, header: header}
		}
		lookup := r.Lookup
		if lookup == nil {
			lookup = os.LookupEnv
		}
		v, ok := lookup(name)
		if !ok {
			return "", &envError{code: "ENV_UNSET", name: name, header: header}
		}
		b.WriteString(v)
		rest = rest[i+end+1:]
	}
}
