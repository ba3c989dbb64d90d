//go:build !floodgate_noevents

package server

// Publishing is false only in a benchmark build (go build -tags
// floodgate_noevents), where Emit publishes nothing: the same limiter,
// principal, penalty read and all, minus its decision events' encoding,
// batching and delivery, so that a measurement of what an event costs a
// call compares like with like (docs/benchmarks.md). Not a setting: a
// limiter built that way loses every decision event.
const Publishing = true
