package chaos

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"time"

	"github.com/floodgate-dev/floodgate/loadtest/internal/promtext"
)

// Service is a started Floodgate service with its HTTP address.
type Service struct {
	*Proc
	Addr string
}

func (e *Env) startService(ctx context.Context, name string, env []string) (*Service, error) {
	addr, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	key := map[string]string{"limiter": "FLOODGATE_LIMITER_ADDR", "detector": "FLOODGATE_DETECTOR_ADDR", "quota": "FLOODGATE_QUOTA_ADDR", "deferred": "FLOODGATE_DEFERRED_ADDR", "adjuster": "FLOODGATE_ADJUSTER_ADDR"}[name]
	p, err := e.Start(name, filepath.Join(e.Bin, name), nil, append(env, key+"="+addr, "FLOODGATE_SHUTDOWN_TIMEOUT=20s"))
	if err != nil {
		return nil, err
	}
	s := &Service{Proc: p, Addr: addr}
	client := &http.Client{Timeout: time.Second}
	err = waitFor(ctx, 30*time.Second, name+" /readyz", func() error {
		if p.Exited() {
			return fmt.Errorf("exited, see %s: %w", p.LogPath, errStop)
		}
		resp, err := client.Get("http://" + addr + "/readyz")
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	})
	if err != nil {
		p.Kill()
		return nil, err
	}
	return s, nil
}

// StartLimiter starts the limiter against the broker and Redis; a non-empty
// journal directory turns the decision-event journal on.
func (e *Env) StartLimiter(ctx context.Context, b *Broker, r *Redis, journalDir string, extra ...string) (*Service, error) {
	env := []string{
		"FLOODGATE_KAFKA_BROKERS=" + b.Addr, "FLOODGATE_REDIS_ADDRS=" + r.Addr,
		"FLOODGATE_LIMITER_PRINCIPAL_LIMIT=100000", "FLOODGATE_LIMITER_INFLUX_INTERVAL=0", "FLOODGATE_GATEWAY=chaos",
		"FLOODGATE_JOURNAL_DIR=" + journalDir,
	}
	return e.startService(ctx, "limiter", append(env, extra...))
}

// StartLimiterBehindFaultProxy starts a fault proxy in front of r and a
// limiter (as StartLimiter, no journal) whose Redis is the proxy, for the
// scenarios that slow or stall Redis. The caller kills the proxy; when the
// limiter does not start, it is killed here.
func (e *Env) StartLimiterBehindFaultProxy(ctx context.Context, b *Broker, r *Redis, extra ...string) (*Service, *FaultProxy, error) {
	px, err := e.StartFaultProxy(ctx, r.Addr)
	if err != nil {
		return nil, nil, err
	}
	lim, err := e.StartLimiter(ctx, b, &Redis{Addr: px.Addr}, "", extra...)
	if err != nil {
		px.Kill()
		return nil, nil, err
	}
	return lim, px, nil
}

// StartQuota starts one quota instance in group with short group timings.
func (e *Env) StartQuota(ctx context.Context, b *Broker, r *Redis, dynamoEndpoint, prefix, group string) (*Service, error) {
	return e.startService(ctx, "quota", []string{
		"FLOODGATE_KAFKA_BROKERS=" + b.Addr, "FLOODGATE_REDIS_ADDRS=" + r.Addr,
		"FLOODGATE_DYNAMODB_ENDPOINT=" + dynamoEndpoint, "FLOODGATE_DYNAMODB_TABLE_PREFIX=" + prefix,
		"FLOODGATE_QUOTA_GROUP=" + group, "FLOODGATE_QUOTA_FLUSH_INTERVAL=200ms",
		"FLOODGATE_QUOTA_SESSION_TIMEOUT=1s", "FLOODGATE_QUOTA_HEARTBEAT_INTERVAL=200ms",
		"FLOODGATE_QUOTA_REBALANCE_TIMEOUT=3s", "FLOODGATE_QUOTA_JOIN_BACKOFF=100ms",
		"FLOODGATE_QUOTA_FETCH_MAX_WAIT=100ms", "FLOODGATE_QUOTA_DRAIN_TIMEOUT=3s",
	})
}

// StartDetector starts the detector (abuse records off) with the end-to-end
// test's rapid-fire settings: a principal above 100 events/s over 5 s is
// detected.
func (e *Env) StartDetector(ctx context.Context, b *Broker, r *Redis, group, influxURL string, extra ...string) (*Service, error) {
	env := []string{
		"FLOODGATE_KAFKA_BROKERS=" + b.Addr, "FLOODGATE_REDIS_ADDRS=" + r.Addr,
		"FLOODGATE_DETECTOR_GROUP=" + group, "FLOODGATE_PAGER_GROUP=" + group + "-pager",
		"FLOODGATE_DETECTOR_RECORDS=off", "FLOODGATE_INFLUX_URL=" + influxURL,
		"FLOODGATE_DETECTOR_WINDOW=5s", "FLOODGATE_DETECTOR_RAPID_FIRE_RATE=20",
		"FLOODGATE_DETECTOR_PENALTY_TTL=10m",
		// One ladder step: the scenarios measure faults, so every penalty
		// is the full one for the whole scenario (docs/detector.md).
		"FLOODGATE_DETECTOR_LADDER_STEPS=1",
	}
	return e.startService(ctx, "detector", append(env, extra...))
}

// Metrics is one scrape of the service's /metrics.
func (s *Service) Metrics(ctx context.Context) (promtext.Exposition, error) {
	e, err := promtext.Get(ctx, "http://"+s.Addr+"/metrics")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.Name, err)
	}
	return e, nil
}

// Buckets is a histogram's cumulative buckets on the service's /metrics;
// nil when it cannot be read.
func (s *Service) Buckets(ctx context.Context, name string) []promtext.Bucket {
	e, err := s.Metrics(ctx)
	if err != nil {
		return nil
	}
	return e.Buckets(name)
}

// Metric sums the samples of a Prometheus metric on the service's /metrics
// (a name, or a series written out: promtext.Exposition.Sum).
func (s *Service) Metric(ctx context.Context, name string) (float64, error) {
	e, err := s.Metrics(ctx)
	if err != nil {
		return 0, err
	}
	v, ok := e.Sum(name)
	if !ok {
		return 0, fmt.Errorf("%s: no metric %s", s.Name, name)
	}
	return v, nil
}

// closedURL is an http URL on a port nothing listens on ("down").
func closedURL() string {
	port, err := FreePort()
	if err != nil {
		port = 1
	}
	return "http://127.0.0.1:" + strconv.Itoa(port)
}
