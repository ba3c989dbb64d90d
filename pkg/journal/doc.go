// Package journal keeps on disk the Kafka messages a producer could not
// deliver and re-publishes them, oldest first, once Kafka takes them again
// (docs/journal.md).
//
// A Journal is an append-only log of checksummed records in segment files
// under one locked directory, capped in size (MaxBytes: the oldest segments
// are dropped, counted). What the disk refuses — no room on the filesystem
// under ReserveBytes, or a failed write — is kept in a bounded memory buffer
// (MemoryBytes; beyond it dropped, counted) until the disk takes writes
// again or Kafka takes the records. Open recovers it after a crash: a torn
// tail is cut, each segment's replay checkpoint restored. Run writes what
// Offer handed it and replays through a ReplayPublisher (a stream.Producer);
// a segment is deleted only once every record in it was acknowledged.
// Repeated error lines are logged once per interval with a count.
//
// DurableProducer puts it in front of Kafka: a stream.AsyncProducer whose
// overflow and failed batches go to the journal. A directory that cannot be
// opened (read-only, missing) leaves it running memory-only with a warning
// (JournalError); a locked one or a bad Config stops it.
//
// The journal is not a stream: it imports pkg/stream for the producers it
// sits between, never the other way round.
package journal
