// Package stream holds Floodgate's Kafka loops, written once for every
// service: a consumer-group Consumer (at-least-once, ordered per partition,
// retries with backoff and a dead-letter topic), a reliable Producer, and an
// AsyncProducer for hot paths that must never block.
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
// ParseDLQRecord reads one back.
//
// Timestamps in headers use TimeFormat: RFC 3339, millisecond precision, UTC.
package stream
