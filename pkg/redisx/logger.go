package redisx

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/tick"
)

// LogEvery is how often a Logger lets a line of one cause through: the
// service's own Redis lines are bounded the same way (limiter.Config.LogEvery).
const LogEvery = 10 * time.Second

// Logger is go-redis's internal logger (redis.SetLogger) as the service's
// own structured log: one voice, not go-redis's plain stderr lines beside the
// service's JSON. Lines are rate-limited per cause — go-redis's message
// template, such as "redis: connection pool: failed to dial after %d
// attempts: %v" — to one per interval, the next one saying how many were held
// back: a dead master made go-redis print ≈ 18 dial failures a second
// (issue 38). Safe for concurrent use.
type Logger struct {
	log   *slog.Logger
	every time.Duration
	now   func() time.Time

	mu     sync.Mutex
	causes map[string]*tick.Throttle
}

// NewLogger returns a Logger writing to log, one line per cause per every
// (LogEvery when ≤ 0), on the wall clock when now is nil.
func NewLogger(log *slog.Logger, every time.Duration, now func() time.Time) *Logger {
	if every <= 0 {
		every = LogEvery
	}
	if now == nil {
		now = time.Now
	}
	return &Logger{log: log.With("source", "go-redis"), every: every, now: now, causes: map[string]*tick.Throttle{}}
}

// maxCauses bounds the causes remembered; go-redis has a few hundred
// templates, so a full map is cleared rather than grown.
const maxCauses = 1024

// Printf is go-redis's logging call (internal.Logging).
func (l *Logger) Printf(ctx context.Context, format string, v ...any) {
	now := l.now()
	l.mu.Lock()
	c := l.causes[format]
	if c == nil {
		if len(l.causes) >= maxCauses {
			clear(l.causes)
		}
		c = &tick.Throttle{}
		l.causes[format] = c
	}
	ok, held := c.Pass(now, l.every)
	l.mu.Unlock()
	if !ok {
		return
	}

	msg := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	level := slog.LevelWarn
	if informational(format) {
		level = slog.LevelInfo
	}
	l.log.Log(ctx, level, "redis client", "detail", msg, "cause", format, "lines_not_logged", held)
}

// informational reports go-redis lines that are news, not trouble.
func informational(format string) bool {
	for _, p := range []string{"sentinel: new master", "sentinel: selected", "sentinel: discovered"} {
		if strings.HasPrefix(format, p) {
			return true
		}
	}
	return false
}

var _ interface {
	Printf(ctx context.Context, format string, v ...any)
} = (*Logger)(nil)
