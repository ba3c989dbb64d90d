// Package stream holds Floodgate's Kafka loops, written once for every
// service: a consumer-group Consumer (at-least-once, ordered per partition,
// retries with backoff and a dead-letter topic) that hands a handler one
// message at a time (NewConsumer) or one partition's batch at a time, its
// offsets committed only after the batch handler returned
// (NewBatchConsumer), a reliable Producer, and an AsyncProducer for hot paths
// that must never block.
//
// The door. Before any handler sees a message the consumer checks it: a
// replay addressed to another group is skipped; a message over
// MaxMessageBytes, or a record batch that would decompress past
// MaxDecompressedBytes, is dead-lettered as a reference (class oversize) and
// the partition moves on; with an EventTime hook, an event outside the
// event-time window is dead-lettered (class event_time). Handlers that decode
// the event time themselves check it with EventTimeWindow.
//
// Middleware. Both modes run the handler through one chain of
// HandlerMiddleware composed once per consumer (middleware.go): retries with
// backoff, the handle-time histogram, the "process" span, the caller's
// ConsumerConfig.Middleware and panic recovery around each invocation; then
// the outcome counters, dead letters with the reason in their headers, and
// aggregated dead-letter logging.
//
// Delivery contract. The Consumer commits an offset only after every message
// before it on that partition was handled or dead-lettered, so a crash
// redelivers messages but never skips one. On a rebalance it stops fetching,
// lets running handlers finish (bounded), and commits before it rejoins, so a
// clean rebalance or shutdown redelivers nothing; a crash, or a handler cut
// off by a deadline, does. Handlers must therefore be idempotent (event ids,
// offsets stored with the data, conditional writes): at-least-once delivery
// plus idempotent sinks gives effectively-once effects.
//
// Errors. A handler error is retried with exponential backoff up to
// ConsumerConfig.MaxAttempts and then dead-lettered as transient_exhausted. An
// error wrapped with Permanent, or any error in whose chain an error has a
// Permanent() bool method returning true, is poison and is dead-lettered at
// once. A handler panic is recovered and dead-lettered as handler_panic.
//
// Dead letters. A DLQ record keeps the original key, value and headers and adds
// the dlq_* headers (see HeaderDLQSourceTopic and the other header names);
// ParseDLQRecord reads one back. A record larger than MaxMessageBytes is a
// reference instead: no value, the key cut, and the original's size and
// SHA-256 in dlq_original_size and dlq_original_sha256.
//
// Timestamps in headers use TimeFormat: RFC 3339, millisecond precision, UTC.
package stream
