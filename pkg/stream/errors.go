package stream

import (
	"errors"
	"fmt"
)

// ErrInvalidConfig is wrapped by every configuration error (Validate, NewConsumer).
var ErrInvalidConfig = errors.New("invalid config")

// configCheck collects the errors of a configuration's Validate: each wraps
// ErrInvalidConfig and names the field ("ConsumerConfig.Topic: required").
type configCheck struct {
	config string // the type's name
	errs   []error
}

func (v *configCheck) bad(field, format string, args ...any) {
	v.errs = append(v.errs, fmt.Errorf("%w: %s.%s: %s", ErrInvalidConfig, v.config, field, fmt.Sprintf(format, args...)))
}

// brokers checks a Brokers field: at least one address, none empty.
func (v *configCheck) brokers(brokers []string) {
	if len(brokers) == 0 {
		v.bad("Brokers", "at least one broker address (host:port) is required")
	}
	for i, b := range brokers {
		if b == "" {
			v.bad("Brokers", "address %d is empty", i)
		}
	}
}

func (v *configCheck) err() error { return errors.Join(v.errs...) }

// ErrorClass says why a message was dead-lettered; it is the value of the
// dlq_error_class header.
type ErrorClass string

// The dead-letter error classes.
const (
	// ClassPoison: the handler said the message can never succeed (Permanent).
	ClassPoison ErrorClass = "poison"
	// ClassTransientExhausted: the handler kept failing for MaxAttempts attempts.
	ClassTransientExhausted ErrorClass = "transient_exhausted"
	// ClassHandlerPanic: the handler panicked.
	ClassHandlerPanic ErrorClass = "handler_panic"
	// ClassOversize: the message (or the record batch holding it, once
	// decompressed) is over the consumer's size limit. It is refused at the
	// door and dead-lettered as a reference (dlq_reference).
	ClassOversize ErrorClass = "oversize"
	// ClassEventTime: the event's time is outside the consumer's window
	// (too far in the future, or too old); see EventTimeWindow.
	ClassEventTime ErrorClass = "event_time"
)

// Valid reports whether c is one of the known classes.
func (c ErrorClass) Valid() bool {
	switch c {
	case ClassPoison, ClassTransientExhausted, ClassHandlerPanic, ClassOversize, ClassEventTime:
		return true
	}
	return false
}

// Permanent marks err as permanent: the consumer dead-letters the message at
// once instead of retrying it. Permanent(nil) is nil. errors.Is and errors.As
// still see err through the wrapper.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string   { return e.err.Error() }
func (e *permanentError) Unwrap() error   { return e.err }
func (e *permanentError) Permanent() bool { return true }

// IsPermanent reports whether any error in err's tree (following Unwrap() error
// and Unwrap() []error) has a Permanent() bool method that returns true. Types
// such as a decoder's validation error can implement that method instead of
// being wrapped with Permanent at every call site.
func IsPermanent(err error) bool {
	for err != nil {
		if p, ok := err.(interface{ Permanent() bool }); ok && p.Permanent() {
			return true
		}
		switch u := err.(type) { //nolint:errorlint // walks the wrap tree itself, one level at a time
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if IsPermanent(e) {
					return true
				}
			}
			return false
		default:
			return false
		}
	}
	return false
}

// panicError is what a recovered handler panic becomes.
type panicError struct {
	value any
	stack []byte
}

func (e *panicError) Error() string { return fmt.Sprintf("handler panic: %v", e.value) }
