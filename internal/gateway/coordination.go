package gateway

import (
	"net/http"

	"github.com/hermesbus/hermes/internal/auth"
	"github.com/hermesbus/hermes/internal/coordination"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// State coordination's state over HTTP: GET /debug/coordination lists every resource that is
// held or waited for — who holds it (request, call, transaction id, fencing token) and who
// waits, in order. It names other callers' requests, so it needs sessions:read_all.
// ?resource=KEY shows that resource only.

func (g *Gateway) registerCoordination() {
	if g.cfg.Bus == nil {
		return
	}
	kv := g.cfg.Bus.Bucket(coordination.Bucket)
	if kv == nil {
		return
	}
	store := &coordination.Store{KV: kv, JS: g.cfg.Bus.JS}
	g.mux.HandleFunc("GET /debug/coordination", g.require(auth.PermReadAll, func(w http.ResponseWriter, r *http.Request) {
		only := r.URL.Query().Get("resource")
		if only != "" {
			if err := protocol.CheckResourceKey("resource", only); err != nil {
				writeError(w, http.StatusBadRequest, protocol.CodeInvalidRequest, err.Error(), nil)
				return
			}
		}
		states, err := store.List(r.Context())
		if err != nil {
			g.log.Warn("read the coordination state", "err", err)
			writeError(w, http.StatusServiceUnavailable, protocol.CodeBusUnavailable, "the coordination state cannot be read now; try again", nil)
			return
		}
		out := make([]coordination.State, 0, len(states))
		for _, st := range states {
			if only == "" || st.Resource == only {
				out = append(out, st)
			}
		}
		held, waiting := 0, 0
		for _, st := range out {
			waiting += len(st.Waiting)
			if st.Holder != nil {
				held++
			}
		}
		writeJSON(w, http.StatusOK, map[string]any{"resources": out, "held": held, "waiting": waiting})
	}))
}
