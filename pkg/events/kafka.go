package events

// Kafka message keys. The key is the principal ("kind:id") so that one principal's
// events stay ordered on one partition; adjustments have no principal and are keyed
// by scope. Topic names, CloudEvents headers and the DLQ record live with the Kafka
// code in pkg/stream and pkg/config.

// Key returns the Kafka message key of d: its principal's key.
func (d *Decision) Key() string { return d.Principal.Key() }

// Key returns the Kafka message key of a: its principal's key.
func (a *Abuse) Key() string { return a.Principal.Key() }

// Key returns the Kafka message key of a: its scope.
func (a *Adjustment) Key() string { return a.Scope }

// Key returns the Kafka message key of d: its principal's key.
func (d *Deferred) Key() string { return d.Principal.Key() }

// Key returns the Kafka message key of v: the judged detection's principal's key.
func (v *Verdict) Key() string { return v.Principal.Key() }
