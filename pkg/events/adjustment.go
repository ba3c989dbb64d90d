package events

import "time"

// Adjustment is an adjustment.v1 event: one per limit-scale change, applied or
// dry-run.
type Adjustment struct {
	// ID is unique per event: 1–64 characters of [A-Za-z0-9_-].
	ID string
	TS time.Time
	// Scope is what the scale applies to, 1–256 characters: "global",
	// "kind:bot", "route:POST /channels/{channel_id}/messages", …
	Scope string
	// OldScale and NewScale multiply the configured limits, each in (0, 10].
	OldScale float64
	NewScale float64
	// Signals are the inputs the decision was based on.
	Signals Signals
	// Rule is the adjuster rule (or operator action) that fired, 1–128 characters.
	Rule string
	// DryRun is true when the change was computed but not applied.
	DryRun bool
	Actor  Actor
	// Reason is an optional free-text explanation, up to 1024 characters; tab
	// and newline are allowed.
	Reason string
}

// Signals are the adjuster's inputs.
type Signals struct {
	// CPU is the utilisation, 0–1.
	CPU float64
	// ErrorRate is the fraction of requests that failed, 0–1.
	ErrorRate float64
	// AbuseRate is abuse detections per second, >= 0.
	AbuseRate float64
}

// Actor is who or what made a change.
type Actor struct {
	Kind ActorKind
	// ID names the loop instance or the operator, 1–128 characters.
	ID string
}

// CETypeAdjustment is the CloudEvents ce_type of adjustment.v1.
const CETypeAdjustment = "dev.floodgate." + TypeAdjustment

// Validate checks a against the adjustment.v1 contract.
func (a *Adjustment) Validate() error { return withType(TypeAdjustment, a.validate()) }

func (a *Adjustment) validate() *ValidationError {
	if err := validID(a.ID); err != nil {
		return at("id", err)
	}
	if err := validTime(a.TS); err != nil {
		return at("ts", err)
	}
	if err := validText(a.Scope, MaxScopeLen, false); err != nil {
		return at("scope", err)
	}
	if err := scale(a.OldScale); err != nil {
		return at("old_scale", err)
	}
	if err := scale(a.NewScale); err != nil {
		return at("new_scale", err)
	}
	if err := fraction(a.Signals.CPU); err != nil {
		return at("signals.cpu", err)
	}
	if err := fraction(a.Signals.ErrorRate); err != nil {
		return at("signals.error_rate", err)
	}
	if err := atLeast0(a.Signals.AbuseRate); err != nil {
		return at("signals.abuse_rate", err)
	}
	if err := validText(a.Rule, MaxRuleLen, false); err != nil {
		return at("rule", err)
	}
	if !a.Actor.Kind.Valid() {
		return at("actor.kind", oneOf(string(a.Actor.Kind), actorKinds))
	}
	if err := validText(a.Actor.ID, MaxActorIDLen, false); err != nil {
		return at("actor.id", err)
	}
	if a.Reason != "" {
		if err := validText(a.Reason, MaxReasonLen, true); err != nil {
			return at("reason", err)
		}
	}
	return nil
}

// EncodeAdjustment validates a and encodes it as JSON.
func EncodeAdjustment(a *Adjustment) ([]byte, error) {
	return AppendAdjustment(make([]byte, 0, 512), a)
}

// AppendAdjustment validates a and appends its JSON encoding to dst; on error
// dst is returned unchanged.
func AppendAdjustment(dst []byte, a *Adjustment) ([]byte, error) {
	if err := a.Validate(); err != nil {
		return dst, err
	}
	b := append(dst, `{"type":"`+TypeAdjustment+`","id":`...)
	b = appendString(b, a.ID)
	b = append(b, `,"ts":`...)
	b = appendTimeString(b, a.TS)
	b = append(b, `,"scope":`...)
	b = appendString(b, a.Scope)
	b = append(b, `,"old_scale":`...)
	b = appendFloat(b, a.OldScale)
	b = append(b, `,"new_scale":`...)
	b = appendFloat(b, a.NewScale)
	b = append(b, `,"signals":{"cpu":`...)
	b = appendFloat(b, a.Signals.CPU)
	b = append(b, `,"error_rate":`...)
	b = appendFloat(b, a.Signals.ErrorRate)
	b = append(b, `,"abuse_rate":`...)
	b = appendFloat(b, a.Signals.AbuseRate)
	b = append(b, `},"rule":`...)
	b = appendString(b, a.Rule)
	b = append(b, `,"dry_run":`...)
	b = appendBool(b, a.DryRun)
	b = append(b, `,"actor":{"kind":`...)
	b = appendString(b, string(a.Actor.Kind))
	b = append(b, `,"id":`...)
	b = appendString(b, a.Actor.ID)
	b = append(b, '}')
	if a.Reason != "" {
		b = append(b, `,"reason":`...)
		b = appendString(b, a.Reason)
	}
	return append(b, '}'), nil
}

// MarshalJSON implements json.Marshaler with EncodeAdjustment.
func (a Adjustment) MarshalJSON() ([]byte, error) { return EncodeAdjustment(&a) }

// UnmarshalJSON implements json.Unmarshaler with DecodeAdjustment.
func (a *Adjustment) UnmarshalJSON(data []byte) error {
	v, err := DecodeAdjustment(data)
	if err != nil {
		return err
	}
	*a = v
	return nil
}

// DecodeAdjustment decodes and validates an adjustment.v1 event. Every error
// satisfies errors.Is(err, ErrInvalid); the Adjustment is zero on error.
func DecodeAdjustment(data []byte) (Adjustment, error) {
	var ev Adjustment
	if err := decodeAdjustment(data, &ev); err != nil {
		return Adjustment{}, err
	}
	return ev, nil
}

func decodeAdjustment(data []byte, ev *Adjustment) *ValidationError {
	const (
		bType uint32 = 1 << iota
		bID
		bTS
		bScope
		bOldScale
		bNewScale
		bSignals
		bRule
		bDryRun
		bActor
		bReason
	)
	d := decoder{data: data, typ: TypeAdjustment}
	if err := d.object(""); err != nil {
		return err
	}
	var seen uint32
	first := true
	for {
		name, ok, err := d.member(&first)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		switch string(name) {
		case "type":
			if err = d.seen(&seen, bType, "type"); err == nil {
				err = d.constant("type", TypeAdjustment)
			}
		case "id":
			if err = d.seen(&seen, bID, "id"); err == nil {
				if ev.ID, err = d.str("id"); err == nil {
					if e := validID(ev.ID); e != nil {
						err = d.invalid("id", e)
					}
				}
			}
		case "ts":
			if err = d.seen(&seen, bTS, "ts"); err == nil {
				ev.TS, err = d.time("ts")
			}
		case "scope":
			if err = d.seen(&seen, bScope, "scope"); err == nil {
				ev.Scope, err = d.text("scope", MaxScopeLen, false)
			}
		case "old_scale":
			if err = d.seen(&seen, bOldScale, "old_scale"); err == nil {
				ev.OldScale, err = d.scale("old_scale")
			}
		case "new_scale":
			if err = d.seen(&seen, bNewScale, "new_scale"); err == nil {
				ev.NewScale, err = d.scale("new_scale")
			}
		case "signals":
			if err = d.seen(&seen, bSignals, "signals"); err == nil {
				err = d.signals(&ev.Signals)
			}
		case "rule":
			if err = d.seen(&seen, bRule, "rule"); err == nil {
				ev.Rule, err = d.text("rule", MaxRuleLen, false)
			}
		case "dry_run":
			if err = d.seen(&seen, bDryRun, "dry_run"); err == nil {
				ev.DryRun, err = d.boolean("dry_run")
			}
		case "actor":
			if err = d.seen(&seen, bActor, "actor"); err == nil {
				err = d.actor(&ev.Actor)
			}
		case "reason":
			if err = d.seen(&seen, bReason, "reason"); err == nil {
				ev.Reason, err = d.text("reason", MaxReasonLen, true)
			}
		default:
			err = d.skip(1)
		}
		if err != nil {
			return err
		}
	}
	if err := d.end(); err != nil {
		return err
	}
	return d.required("", seen, []req{
		{bType, "type"}, {bID, "id"}, {bTS, "ts"}, {bScope, "scope"}, {bOldScale, "old_scale"},
		{bNewScale, "new_scale"}, {bSignals, "signals"}, {bRule, "rule"}, {bDryRun, "dry_run"},
		{bActor, "actor"},
	})
}

// text reads a free-text string member (see validText).
func (d *decoder) text(field string, max int, multiline bool) (string, *ValidationError) {
	s, err := d.str(field)
	if err == nil {
		if e := validText(s, max, multiline); e != nil {
			return "", d.invalid(field, e)
		}
	}
	return s, err
}

func (d *decoder) scale(field string) (float64, *ValidationError) {
	v, err := d.float(field)
	if err == nil {
		if e := scale(v); e != nil {
			return 0, d.invalid(field, e)
		}
	}
	return v, err
}

func (d *decoder) fraction(field string) (float64, *ValidationError) {
	v, err := d.float(field)
	if err == nil {
		if e := fraction(v); e != nil {
			return 0, d.invalid(field, e)
		}
	}
	return v, err
}

func (d *decoder) signals(s *Signals) *ValidationError {
	const (
		bCPU uint32 = 1 << iota
		bErrorRate
		bAbuseRate
	)
	if err := d.object("signals"); err != nil {
		return err
	}
	var seen uint32
	first := true
	for {
		name, ok, err := d.member(&first)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		switch string(name) {
		case "cpu":
			if err = d.seen(&seen, bCPU, "cpu"); err == nil {
				s.CPU, err = d.fraction("signals.cpu")
			}
		case "error_rate":
			if err = d.seen(&seen, bErrorRate, "error_rate"); err == nil {
				s.ErrorRate, err = d.fraction("signals.error_rate")
			}
		case "abuse_rate":
			if err = d.seen(&seen, bAbuseRate, "abuse_rate"); err == nil {
				s.AbuseRate, err = d.nonNegative("signals.abuse_rate")
			}
		default:
			err = d.skip(1)
		}
		if err != nil {
			return err
		}
	}
	return d.required("signals", seen, []req{{bCPU, "cpu"}, {bErrorRate, "error_rate"}, {bAbuseRate, "abuse_rate"}})
}

func (d *decoder) actor(a *Actor) *ValidationError {
	const (
		bKind uint32 = 1 << iota
		bID
	)
	if err := d.object("actor"); err != nil {
		return err
	}
	var seen uint32
	first := true
	for {
		name, ok, err := d.member(&first)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		switch string(name) {
		case "kind":
			if err = d.seen(&seen, bKind, "kind"); err == nil {
				var s string
				s, err = d.enum("actor.kind", actorKinds)
				a.Kind = ActorKind(s)
			}
		case "id":
			if err = d.seen(&seen, bID, "id"); err == nil {
				a.ID, err = d.text("actor.id", MaxActorIDLen, false)
			}
		default:
			err = d.skip(1)
		}
		if err != nil {
			return err
		}
	}
	return d.required("actor", seen, []req{{bKind, "kind"}, {bID, "id"}})
}
