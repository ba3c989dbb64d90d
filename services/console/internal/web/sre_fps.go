package web

import (
	"net/http"

	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

type fpView struct {
	Title  string
	Counts []store.FalsePositiveCount
	Error  string
}

func (s *Server) fps(w http.ResponseWriter, r *http.Request) {
	v := fpView{Title: "False positives"}
	var err error
	if v.Counts, err = s.cfg.Store.FalsePositives(r.Context()); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		v.Error = "False-positive counts could not be read: " + err.Error()
	}
	s.render(w, r, "fps", v)
}
