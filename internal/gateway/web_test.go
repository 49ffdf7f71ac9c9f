package gateway

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func TestWebFiles(t *testing.T) {
	mux := http.NewServeMux()
	registerWeb(mux)
	tests := []struct {
		method, path string
		status       int
		ctype        string
		contains     string
	}{
		{"GET", "/", http.StatusOK, "text/html; charset=utf-8", `<script src="app.js" defer></script>`},
		{"HEAD", "/", http.StatusOK, "text/html; charset=utf-8", ""},
		{"GET", "/app.js", http.StatusOK, "text/javascript; charset=utf-8", "new EventSource("},
		{"GET", "/style.css", http.StatusOK, "text/css; charset=utf-8", ".wf-track"},
		{"GET", "/index.html", http.StatusNotFound, "", ""},
		{"GET", "/nope", http.StatusNotFound, "", ""},
		{"POST", "/", http.StatusMethodNotAllowed, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, httptest.NewRequest(tt.method, tt.path, nil))
			if rec.Code != tt.status {
				t.Fatalf("status %d, want %d", rec.Code, tt.status)
			}
			if tt.status != http.StatusOK {
				return
			}
			h := rec.Header()
			if got := h.Get("Content-Type"); got != tt.ctype {
				t.Errorf("Content-Type %q, want %q", got, tt.ctype)
			}
			if got := h.Get("Content-Security-Policy"); !strings.HasPrefix(got, "default-src 'self'") {
				t.Errorf("Content-Security-Policy %q", got)
			}
			if h.Get("X-Content-Type-Options") != "nosniff" || h.Get("ETag") == "" {
				t.Errorf("headers %v", h)
			}
			if !strings.Contains(rec.Body.String(), tt.contains) {
				t.Errorf("body lacks %q", tt.contains)
			}
		})
	}
}

func TestWebRevalidates(t *testing.T) {
	mux := http.NewServeMux()
	registerWeb(mux)
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest("GET", "/app.js", nil))
	etag := rec.Header().Get("ETag")
	req := httptest.NewRequest("GET", "/app.js", nil)
	req.Header.Set("If-None-Match", etag)
	rec = httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	if rec.Code != http.StatusNotModified {
		t.Fatalf("status %d with If-None-Match %s, want 304", rec.Code, etag)
	}
}

// TestWebFilesStaySafe guards the page's two promises: nothing from the bus is parsed as HTML,
// and nothing is loaded from elsewhere.
func TestWebFilesStaySafe(t *testing.T) {
	for _, name := range []string{"index.html", "app.js", "style.css"} {
		b, err := webFiles.ReadFile("web/" + name)
		if err != nil {
			t.Fatal(err)
		}
		src := string(b)
		for _, bad := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function", "<style", "style=", "@import", "url("} {
			if strings.Contains(src, bad) {
				t.Errorf("%s uses %s", name, bad)
			}
		}
		if m := regexp.MustCompile(`(?i)(src|href)\s*=\s*["']?(https?:)?//`).FindString(src); m != "" {
			t.Errorf("%s loads from another origin: %s", name, m)
		}
		if name == "index.html" && regexp.MustCompile(`<script>|<script [^>]*>[^<]`).MatchString(src) {
			t.Errorf("%s has an inline script", name)
		}
	}
}
