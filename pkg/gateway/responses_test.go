package gateway

import (
	"errors"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

type countingResponses struct {
	mu sync.Mutex
	by map[int]int
}

func (c *countingResponses) Count(status int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.by == nil {
		c.by = map[int]int{}
	}
	c.by[status]++
}

func TestMiddlewareCountsEveryResponse(t *testing.T) {
	counts := &countingResponses{}
	serve(t, Options{Checker: &fakeChecker{allow: true}, Responses: counts}, "203.0.113.7:1", nil)                               // 204 from the handler
	serve(t, Options{Checker: &fakeChecker{}, Responses: counts}, "203.0.113.7:1", nil)                                          // 429 from the limiter
	serve(t, Options{Checker: &fakeChecker{err: errors.New("down")}, FailClosed: true, Responses: counts}, "203.0.113.7:1", nil) // 503
	require.Equal(t, map[int]int{http.StatusNoContent: 1, http.StatusTooManyRequests: 1, http.StatusServiceUnavailable: 1}, counts.by)
}
