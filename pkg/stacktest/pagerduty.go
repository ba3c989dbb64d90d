package stacktest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// PagerDuty is a PagerDuty Events API v2 receiver on loopback: services
// point FLOODGATE_PAGERDUTY_URL at URL and it records each event posted to
// /v2/enqueue, answering 202. It can be set down, or fail the next n
// requests, answering 500 and recording nothing.
type PagerDuty struct {
	URL      string
	srv      *httptest.Server
	down     atomic.Bool
	failed   atomic.Int64
	mu       sync.Mutex
	failNext int
	events   []map[string]any
}

// NewPagerDuty starts a receiver, up; Close stops it.
func NewPagerDuty() *PagerDuty {
	p := &PagerDuty{}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	p.URL = p.srv.URL
	return p
}

// PagerDutyFor starts a receiver closed at the end of the test.
func PagerDutyFor(t testing.TB) *PagerDuty {
	p := NewPagerDuty()
	t.Cleanup(p.Close)
	return p
}

func (p *PagerDuty) serve(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	fail := p.down.Load() || p.failNext > 0
	if p.failNext > 0 {
		p.failNext--
	}
	p.mu.Unlock()
	if fail {
		p.failed.Add(1)
		http.Error(w, `{"status":"error","message":"injected outage"}`, http.StatusInternalServerError)
		return
	}
	if r.URL.Path != "/v2/enqueue" {
		http.NotFound(w, r)
		return
	}
	var ev map[string]any
	if err := json.NewDecoder(r.Body).Decode(&ev); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	p.events = append(p.events, ev)
	p.mu.Unlock()
	w.WriteHeader(http.StatusAccepted)
	_, _ = io.WriteString(w, `{"status":"success","message":"Event processed","dedup_key":"x"}`)
}

// SetDown makes the receiver answer 500 (true) or accept events (false).
func (p *PagerDuty) SetDown(down bool) { p.down.Store(down) }

// FailNext makes the receiver answer 500 to the next n requests.
func (p *PagerDuty) FailNext(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failNext = n
}

// All are the accepted events, oldest first.
func (p *PagerDuty) All() []map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]map[string]any(nil), p.events...)
}

// Failed is the number of requests answered 500.
func (p *PagerDuty) Failed() int64 { return p.failed.Load() }

// Events are the accepted events with this dedup key, oldest first.
func (p *PagerDuty) Events(dedup string) []map[string]any {
	var out []map[string]any
	for _, ev := range p.All() {
		if ev["dedup_key"] == dedup {
			out = append(out, ev)
		}
	}
	return out
}

// Actions are the event_action of each accepted event with this dedup key
// (trigger, acknowledge, resolve), oldest first.
func (p *PagerDuty) Actions(dedup string) []string {
	var out []string
	for _, ev := range p.Events(dedup) {
		out = append(out, fmt.Sprint(ev["event_action"]))
	}
	return out
}

// Triggered reports whether a trigger with this dedup key was accepted.
func (p *PagerDuty) Triggered(dedup string) bool {
	for _, a := range p.Actions(dedup) {
		if a == "trigger" {
			return true
		}
	}
	return false
}

// WaitFor returns the first event with this dedup key, failing t when none
// came within timeout.
func (p *PagerDuty) WaitFor(t testing.TB, dedup string, timeout time.Duration) map[string]any {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if evs := p.Events(dedup); len(evs) > 0 {
			return evs[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no PagerDuty event with dedup key %s within %s", dedup, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Close stops the receiver.
func (p *PagerDuty) Close() { p.srv.Close() }
