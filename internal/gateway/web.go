package gateway

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"net/http"
	"time"
)

// webFiles is the web UI: plain HTML, CSS and JavaScript, no build step.
//
//go:embed web/index.html web/app.js web/style.css
var webFiles embed.FS

// pageCSP lets the page load its own files and talk to its own origin, nothing else: no
// inline scripts or styles, no other hosts, no framing.
const pageCSP = "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// registerWeb serves the web UI on mux: the page at GET /, its script and style sheet beside
// it. The files are built into the binary; each answer carries an ETag of its content, so a
// browser revalidates cheaply and never keeps a stale script after an upgrade.
func registerWeb(mux *http.ServeMux) {
	mux.Handle("GET /{$}", webFile("index.html"))
	mux.Handle("GET /app.js", webFile("app.js"))
	mux.Handle("GET /style.css", webFile("style.css"))
}

// webFile serves the embedded file web/name with the page's security headers.
func webFile(name string) http.Handler {
	body, err := webFiles.ReadFile("web/" + name)
	sum := sha256.Sum256(body)
	etag := `"` + hex.EncodeToString(sum[:12]) + `"`
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err != nil { // cannot happen: the embed directive names the file
			http.Error(w, "web UI file missing: "+name, http.StatusInternalServerError)
			return
		}
		h := w.Header()
		h.Set("Content-Security-Policy", pageCSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		h.Set("ETag", etag)
		http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(body))
	})
}
