package server

import (
	"encoding/json"
	"net/http"
)

// Readiness is the body of GET /readyz: whether the limiter takes checks, and
// whether Redis answers them. A limiter whose Redis is failing stays ready —
// it answers from local state and fail policies, which beats no answer — and
// says so: status "degraded" and each shard's breaker state.
type Readiness struct {
	Status    string            `json:"status"` // ok | degraded | not ready
	Redis     map[string]string `json:"redis"`  // shard → breaker state (closed, half-open, open)
	Instances int64             `json:"instances"`
	// Journal is "memory only: <why>" when a configured journal directory
	// could not be used (the status is then degraded too); empty otherwise.
	Journal string `json:"journal,omitempty"`
	// RedisMaster is the address of the master in use (standalone or the
	// one Sentinel names; a Cluster's masters are the shards above).
	RedisMaster string `json:"redis_master,omitempty"`
}

// journalState is what a publisher with a journal reports (journal.DurableProducer).
type journalState interface{ JournalError() error }

// Readiness reports the limiter's state as /readyz does.
func (s *Server) Readiness() (bool, Readiness) {
	healthy, shards := s.engine.Health()
	r := Readiness{Status: "ok", Redis: shards, Instances: s.engine.Instances(), RedisMaster: s.engine.RedisMaster()}
	if js, ok := s.pub.(journalState); ok {
		if err := js.JournalError(); err != nil {
			r.Journal, healthy = "memory only: "+err.Error(), false
		}
	}
	if !healthy {
		r.Status = "degraded"
	}
	if !s.ready.Load() {
		r.Status = "not ready"
		return false, r
	}
	return true, r
}

// ServeReady answers GET /readyz with Readiness as JSON (503 when not ready).
func (s *Server) ServeReady(w http.ResponseWriter, r *http.Request) { s.handleReady(w, r) }

func (s *Server) handleReady(w http.ResponseWriter, _ *http.Request) {
	ok, r := s.Readiness()
	w.Header().Set("Content-Type", "application/json")
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(r)
}
