package metric

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Series is one series of a vector, resolved at its first use and kept: a
// hot path counts into it without hashing label values on every call (a
// series still appears on /metrics only once counted). The zero value is
// ready. Safe for concurrent use; two first uses at once resolve the same
// series twice, which is harmless.
type Series struct {
	c atomic.Pointer[prometheus.Counter]
}

// Get returns the series, calling resolve (vec.WithLabelValues(…)) the first
// time.
func (s *Series) Get(resolve func() prometheus.Counter) prometheus.Counter {
	if c := s.c.Load(); c != nil {
		return *c
	}
	c := resolve()
	s.c.Store(&c)
	return c
}
