// Package openloop offers calls at a fixed rate, open loop: a pacer releases
// each call at its due time to a pool of callers, and each latency runs from
// the due time, so a server that falls behind is charged for the wait (no
// coordinated omission). peerbench and httpfloor run their open-loop rounds
// on it.
package openloop

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Run offers rate calls a second for d to workers callers (the most in
// flight) and returns every call's latency, sorted, and how many failed.
// The pacer wakes every 200 µs and releases what is due; a call released
// late keeps its own due time.
func Run(rate float64, d time.Duration, workers int, call func(worker int) error) ([]time.Duration, int64) {
	interval := time.Duration(float64(time.Second) / rate)
	total := int(d / interval)
	due := make(chan time.Time, workers*4)
	lats := make([][]time.Duration, workers)
	var errs atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for at := range due {
				if err := call(w); err != nil {
					errs.Add(1)
				}
				lats[w] = append(lats[w], time.Since(at))
			}
		}()
	}
	start := time.Now()
	for sent := 0; sent < total; {
		for now := time.Now(); sent < total; sent++ {
			at := start.Add(time.Duration(sent) * interval)
			if at.After(now) {
				break
			}
			due <- at // blocks only when every caller is busy: the wait is charged to the server
		}
		time.Sleep(200 * time.Microsecond)
	}
	close(due)
	wg.Wait()
	var all []time.Duration
	for _, l := range lats {
		all = append(all, l...)
	}
	slices.Sort(all)
	return all, errs.Load()
}

// Quantile is the q-quantile of sorted latencies (0 when there are none).
func Quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}
