package auditor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// IsDLQTopic reports whether name is a dead-letter topic the auditor consumes:
// it ends in ".dlq", but not in ".dlq.dlq" (a dead-letter topic has none).
func IsDLQTopic(name string) bool {
	base, ok := strings.CutSuffix(name, DLQSuffix)
	return ok && base != "" && !strings.HasSuffix(base, DLQSuffix)
}

// DLQTopics lists the cluster's dead-letter topics, sorted.
func DLQTopics(ctx context.Context, client *kafka.Client) ([]string, error) {
	meta, err := client.Metadata(ctx, &kafka.MetadataRequest{})
	if err != nil {
		return nil, fmt.Errorf("list topics: %w", err)
	}
	var out []string
	for _, t := range meta.Topics {
		if t.Error == nil && IsDLQTopic(t.Name) {
			out = append(out, t.Name)
		}
	}
	sort.Strings(out)
	return out, nil
}

// Runner is a started consumer: Run returns when ctx is done, after draining.
type Runner interface {
	Run(ctx context.Context) error
}

// Supervisor consumes every dead-letter topic: it discovers them through
// Kafka metadata, starts one consumer per topic (all in one consumer group),
// and looks for new topics every Interval.
type Supervisor struct {
	Client      *kafka.Client
	Interval    time.Duration
	NewConsumer func(topic string) (Runner, error)
	Logger      *slog.Logger
	Metrics     *Metrics

	mu      sync.Mutex
	running map[string]bool
}

// Topics returns the topics being consumed, sorted.
func (s *Supervisor) Topics() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.running))
}

// Run discovers and consumes until ctx is done, then waits for every
// consumer to drain; it returns their errors joined.
func (s *Supervisor) Run(ctx context.Context) error {
	s.mu.Lock()
	s.running = map[string]bool{}
	s.mu.Unlock()
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var errs []error
	discover := func() {
		topics, err := DLQTopics(ctx, s.Client)
		if err != nil {
			if ctx.Err() == nil {
				s.Logger.Warn("discover dead-letter topics; retrying next interval", "err", err)
			}
			return
		}
		for _, topic := range topics {
			s.mu.Lock()
			known := s.running[topic]
			s.mu.Unlock()
			if known {
				continue
			}
			c, err := s.NewConsumer(topic)
			if err != nil {
				s.Logger.Error("start dead-letter consumer", "topic", topic, "err", err)
				continue
			}
			s.mu.Lock()
			s.running[topic] = true
			s.Metrics.topics.Set(float64(len(s.running)))
			s.mu.Unlock()
			s.Logger.Info("consuming dead-letter topic", "topic", topic)
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := c.Run(ctx); err != nil {
					errMu.Lock()
					errs = append(errs, fmt.Errorf("consumer %s: %w", topic, err))
					errMu.Unlock()
				}
			}()
		}
	}
	discover()
	t := time.NewTicker(s.Interval)
	defer t.Stop()
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-t.C:
			discover()
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}
