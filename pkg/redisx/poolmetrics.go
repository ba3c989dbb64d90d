package redisx

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// PoolCollector exports the connection pool of c (summed over a cluster's
// nodes) as floodgate_redis_pool_*: how often a command found an idle
// connection or none (then the pool dialed one for it, handshake included,
// inside the command's time), how often it timed out waiting, and the
// connections open and idle now.
func PoolCollector(c redis.UniversalClient) prometheus.Collector {
	return poolCollector{c: c}
}

type poolCollector struct{ c redis.UniversalClient }

var (
	poolHits = prometheus.NewDesc("floodgate_redis_pool_hits_total",
		"Redis commands that found an idle pooled connection.", nil, nil)
	poolMisses = prometheus.NewDesc("floodgate_redis_pool_misses_total",
		"Redis commands that found no idle connection (a connection was dialed for them, or they waited for one).", nil, nil)
	poolTimeouts = prometheus.NewDesc("floodgate_redis_pool_timeouts_total",
		"Redis commands that gave up waiting for a pooled connection.", nil, nil)
	poolConns = prometheus.NewDesc("floodgate_redis_pool_connections",
		"Redis connections open now, by state (idle, or in use).", []string{"state"}, nil)
)

func (poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- poolHits
	ch <- poolMisses
	ch <- poolTimeouts
	ch <- poolConns
}

func (p poolCollector) Collect(ch chan<- prometheus.Metric) {
	s := p.c.PoolStats()
	ch <- prometheus.MustNewConstMetric(poolHits, prometheus.CounterValue, float64(s.Hits))
	ch <- prometheus.MustNewConstMetric(poolMisses, prometheus.CounterValue, float64(s.Misses))
	ch <- prometheus.MustNewConstMetric(poolTimeouts, prometheus.CounterValue, float64(s.Timeouts))
	ch <- prometheus.MustNewConstMetric(poolConns, prometheus.GaugeValue, float64(s.IdleConns), "idle")
	ch <- prometheus.MustNewConstMetric(poolConns, prometheus.GaugeValue, float64(s.TotalConns)-float64(s.IdleConns), "in_use")
}
