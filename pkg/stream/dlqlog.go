package stream

import (
	"log/slog"
	"sync"
	"time"
)

// DefaultDeadLetterLogInterval is how long dead letters of one error class
// are counted into one log line.
const DefaultDeadLetterLogInterval = 10 * time.Second

// deadLetterLog keeps the log readable when one broken producer sends a
// stream of poison messages: per error class, the first dead letter of an
// interval is logged at once with its details, the rest of the interval are
// counted, and one summary line at the interval's end gives the count and the
// first example. Metrics still count every message.
type deadLetterLog struct {
	log      *slog.Logger // carries the consumer's source topic and group
	interval time.Duration

	mu   sync.Mutex
	open map[ErrorClass]*deadLetterAgg
}

type deadLetterAgg struct {
	count     int // every dead letter of the interval, the first included
	partition int
	offset    int64
	err       string
	timer     *time.Timer
}

// newDeadLetterLog returns the dead-letter log of one consumer: log should
// carry its source topic (every Consumer's does), so lines are per class and
// source topic.
func newDeadLetterLog(log *slog.Logger, interval time.Duration) *deadLetterLog {
	return &deadLetterLog{log: log, interval: interval, open: map[ErrorClass]*deadLetterAgg{}}
}

// record logs or counts one dead letter.
func (l *deadLetterLog) record(partition int, offset int64, dlqTopic string, class ErrorClass, attempts int, errMsg string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if a := l.open[class]; a != nil {
		a.count++
		return
	}
	l.log.Warn("message dead-lettered", "partition", partition, "offset", offset,
		"dlq_topic", dlqTopic, "class", class, "attempts", attempts, "err", errMsg,
		"note", "further dead letters of this class are counted for "+l.interval.String())
	a := &deadLetterAgg{count: 1, partition: partition, offset: offset, err: errMsg}
	a.timer = time.AfterFunc(l.interval, func() { l.flush(class) })
	l.open[class] = a
}

// flush ends class's interval, logging a summary when more than the first
// dead letter was counted.
func (l *deadLetterLog) flush(class ErrorClass) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.flushLocked(class)
}

func (l *deadLetterLog) flushLocked(class ErrorClass) {
	a := l.open[class]
	if a == nil {
		return
	}
	delete(l.open, class)
	a.timer.Stop()
	if a.count > 1 {
		l.log.Warn("messages dead-lettered", "class", class, "count", a.count,
			"interval", l.interval, "first_partition", a.partition, "first_offset", a.offset, "first_err", a.err)
	}
}

// close logs every open interval's summary.
func (l *deadLetterLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for class := range l.open {
		l.flushLocked(class)
	}
}
