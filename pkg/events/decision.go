package events

import (
	"net/netip"
	"strconv"
	"time"
)

// Decision is a decision.v1 event: one per limiter decision.
type Decision struct {
	// ID is unique per event: 1–64 characters of [A-Za-z0-9_-].
	ID string
	// TS is when the decision was made; encoded in UTC with millisecond precision.
	TS        time.Time
	Principal Principal
	// IP is the client address, without a zone.
	IP netip.Addr
	// Method is one of Methods.
	Method string
	// Route is the templated route (see ValidRoute).
	Route string
	// Resource is optional ("" = absent): "type:id", see ValidResource.
	Resource string
	Allowed  bool
	// Tier is the tier that decided: the denying tier, or the tightest when allowed.
	Tier Tier
	// Shadow is true when a shadow rule would have blocked the request.
	Shadow bool
	// Cost is what the request consumed (or would have): 1–1,000,000.
	Cost int64
	// Limit and Remaining describe the deciding tier's bucket.
	Limit     int64
	Remaining int64
	// Gateway names the gateway that asked: 1–64 characters.
	Gateway string
	// NearLimit is true when Remaining crossed the near-limit threshold (optional).
	NearLimit bool
	// Degraded is true when the answer was given under a fail policy because
	// Redis could not be asked in time (optional).
	Degraded bool
	// Rule is the id of the deciding rule, 1–128 characters ("" = absent).
	Rule string
	// PenaltyMultiplier is the penalty applied to the principal's limits, in
	// (0, 1]; 0 means no penalty (the member is absent).
	PenaltyMultiplier float64
}

// CETypeDecision is the CloudEvents ce_type of decision.v1.
const CETypeDecision = "dev.floodgate." + TypeDecision

// Validate checks d against the decision.v1 contract.
func (d *Decision) Validate() error { return withType(TypeDecision, d.validate()) }

func (d *Decision) validate() *ValidationError {
	if err := validID(d.ID); err != nil {
		return at("id", err)
	}
	if err := validTime(d.TS); err != nil {
		return at("ts", err)
	}
	if err := d.Principal.validate(); err != nil {
		return at("principal", err)
	}
	if err := validAddr(d.IP); err != nil {
		return at("ip", err)
	}
	if _, ok := method(d.Method); !ok {
		return at("method", oneOf(d.Method, Methods))
	}
	if err := validRoute(d.Route); err != nil {
		return at("route", err)
	}
	if d.Resource != "" {
		if err := validResource(d.Resource); err != nil {
			return at("resource", err)
		}
	}
	if !d.Tier.Valid() {
		return at("tier", oneOf(string(d.Tier), tiers))
	}
	if err := intRange(d.Cost, 1, 1_000_000); err != nil {
		return at("cost", err)
	}
	if err := intRange(d.Limit, 0, MaxSafeInteger); err != nil {
		return at("limit", err)
	}
	if err := intRange(d.Remaining, 0, MaxSafeInteger); err != nil {
		return at("remaining", err)
	}
	if err := validText(d.Gateway, MaxGatewayLen, false); err != nil {
		return at("gateway", err)
	}
	if d.Rule != "" {
		if err := validText(d.Rule, MaxRuleLen, false); err != nil {
			return at("rule", err)
		}
	}
	if d.PenaltyMultiplier != 0 {
		if err := multiplier(d.PenaltyMultiplier); err != nil {
			return at("penalty_multiplier", err)
		}
	}
	return nil
}

// EncodeDecision validates d and encodes it as JSON.
func EncodeDecision(d *Decision) ([]byte, error) {
	return AppendDecision(make([]byte, 0, 512), d)
}

// AppendDecision validates d and appends its JSON encoding to dst; on error dst
// is returned unchanged. It does not allocate when dst has room.
func AppendDecision(dst []byte, d *Decision) ([]byte, error) {
	if err := d.Validate(); err != nil {
		return dst, err
	}
	b := append(dst, `{"type":"`+TypeDecision+`","id":`...)
	b = appendString(b, d.ID)
	b = append(b, `,"ts":`...)
	b = appendTimeString(b, d.TS)
	b = append(b, `,"principal":`...)
	b = appendPrincipal(b, d.Principal)
	b = append(b, `,"ip":"`...)
	b = d.IP.AppendTo(b)
	b = append(b, `","method":`...)
	b = appendString(b, d.Method)
	b = append(b, `,"route":`...)
	b = appendString(b, d.Route)
	if d.Resource != "" {
		b = append(b, `,"resource":`...)
		b = appendString(b, d.Resource)
	}
	b = append(b, `,"allowed":`...)
	b = appendBool(b, d.Allowed)
	b = append(b, `,"tier":`...)
	b = appendString(b, string(d.Tier))
	b = append(b, `,"shadow":`...)
	b = appendBool(b, d.Shadow)
	b = append(b, `,"cost":`...)
	b = strconv.AppendInt(b, d.Cost, 10)
	b = append(b, `,"limit":`...)
	b = strconv.AppendInt(b, d.Limit, 10)
	b = append(b, `,"remaining":`...)
	b = strconv.AppendInt(b, d.Remaining, 10)
	b = append(b, `,"gateway":`...)
	b = appendString(b, d.Gateway)
	if d.NearLimit {
		b = append(b, `,"near_limit":true`...)
	}
	if d.Degraded {
		b = append(b, `,"degraded":true`...)
	}
	if d.Rule != "" {
		b = append(b, `,"rule":`...)
		b = appendString(b, d.Rule)
	}
	if d.PenaltyMultiplier != 0 {
		b = append(b, `,"penalty_multiplier":`...)
		b = appendFloat(b, d.PenaltyMultiplier)
	}
	return append(b, '}'), nil
}

// MarshalJSON implements json.Marshaler with EncodeDecision.
func (d Decision) MarshalJSON() ([]byte, error) { return EncodeDecision(&d) }

// UnmarshalJSON implements json.Unmarshaler with DecodeDecision.
func (d *Decision) UnmarshalJSON(data []byte) error {
	v, err := DecodeDecision(data)
	if err != nil {
		return err
	}
	*d = v
	return nil
}

// Members of decision.v1, as bits of the decoder's seen mask.
const (
	dType uint32 = 1 << iota
	dID
	dTS
	dPrincipal
	dIP
	dMethod
	dRoute
	dResource
	dAllowed
	dTier
	dShadow
	dCost
	dLimit
	dRemaining
	dGateway
	dNearLimit
	dDegraded
	dRule
	dPenaltyMultiplier
)

// DecodeDecision decodes and validates a decision.v1 event. Every error
// satisfies errors.Is(err, ErrInvalid); the Decision is zero on error.
func DecodeDecision(data []byte) (Decision, error) {
	var ev Decision
	if err := decodeDecision(data, &ev); err != nil {
		return Decision{}, err
	}
	return ev, nil
}

func decodeDecision(data []byte, ev *Decision) *ValidationError {
	d := decoder{data: data, typ: TypeDecision}
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
			if err = d.seen(&seen, dType, "type"); err == nil {
				err = d.constant("type", TypeDecision)
			}
		case "id":
			if err = d.seen(&seen, dID, "id"); err == nil {
				if ev.ID, err = d.str("id"); err == nil {
					if e := validID(ev.ID); e != nil {
						err = d.invalid("id", e)
					}
				}
			}
		case "ts":
			if err = d.seen(&seen, dTS, "ts"); err == nil {
				ev.TS, err = d.time("ts")
			}
		case "principal":
			if err = d.seen(&seen, dPrincipal, "principal"); err == nil {
				ev.Principal, err = d.principal()
			}
		case "ip":
			if err = d.seen(&seen, dIP, "ip"); err == nil {
				ev.IP, err = d.ip("ip")
			}
		case "method":
			if err = d.seen(&seen, dMethod, "method"); err == nil {
				var b []byte
				if b, err = d.strBytes("method"); err == nil {
					var ok bool
					if ev.Method, ok = method(b); !ok {
						err = d.invalid("method", oneOf(string(b), Methods))
					}
				}
			}
		case "route":
			if err = d.seen(&seen, dRoute, "route"); err == nil {
				if ev.Route, err = d.str("route"); err == nil {
					if e := validRoute(ev.Route); e != nil {
						err = d.invalid("route", e)
					}
				}
			}
		case "resource":
			if err = d.seen(&seen, dResource, "resource"); err == nil {
				if ev.Resource, err = d.str("resource"); err == nil {
					if e := validResource(ev.Resource); e != nil {
						err = d.invalid("resource", e)
					}
				}
			}
		case "allowed":
			if err = d.seen(&seen, dAllowed, "allowed"); err == nil {
				ev.Allowed, err = d.boolean("allowed")
			}
		case "tier":
			if err = d.seen(&seen, dTier, "tier"); err == nil {
				var b []byte
				if b, err = d.strBytes("tier"); err == nil {
					var ok bool
					if ev.Tier, ok = tier(b); !ok {
						err = d.invalid("tier", oneOf(string(b), tiers))
					}
				}
			}
		case "shadow":
			if err = d.seen(&seen, dShadow, "shadow"); err == nil {
				ev.Shadow, err = d.boolean("shadow")
			}
		case "cost":
			if err = d.seen(&seen, dCost, "cost"); err == nil {
				ev.Cost, err = d.integer("cost", 1, 1_000_000)
			}
		case "limit":
			if err = d.seen(&seen, dLimit, "limit"); err == nil {
				ev.Limit, err = d.integer("limit", 0, MaxSafeInteger)
			}
		case "remaining":
			if err = d.seen(&seen, dRemaining, "remaining"); err == nil {
				ev.Remaining, err = d.integer("remaining", 0, MaxSafeInteger)
			}
		case "gateway":
			if err = d.seen(&seen, dGateway, "gateway"); err == nil {
				if ev.Gateway, err = d.str("gateway"); err == nil {
					if e := validText(ev.Gateway, MaxGatewayLen, false); e != nil {
						err = d.invalid("gateway", e)
					}
				}
			}
		case "near_limit":
			if err = d.seen(&seen, dNearLimit, "near_limit"); err == nil {
				ev.NearLimit, err = d.boolean("near_limit")
			}
		case "degraded":
			if err = d.seen(&seen, dDegraded, "degraded"); err == nil {
				ev.Degraded, err = d.boolean("degraded")
			}
		case "rule":
			if err = d.seen(&seen, dRule, "rule"); err == nil {
				if ev.Rule, err = d.str("rule"); err == nil {
					if e := validText(ev.Rule, MaxRuleLen, false); e != nil {
						err = d.invalid("rule", e)
					}
				}
			}
		case "penalty_multiplier":
			if err = d.seen(&seen, dPenaltyMultiplier, "penalty_multiplier"); err == nil {
				if ev.PenaltyMultiplier, err = d.float("penalty_multiplier"); err == nil {
					if e := multiplier(ev.PenaltyMultiplier); e != nil {
						err = d.invalid("penalty_multiplier", e)
					}
				}
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
	if err := d.required("", seen, []req{
		{dType, "type"}, {dID, "id"}, {dTS, "ts"}, {dPrincipal, "principal"}, {dIP, "ip"},
		{dMethod, "method"}, {dRoute, "route"}, {dAllowed, "allowed"}, {dTier, "tier"},
		{dShadow, "shadow"}, {dCost, "cost"}, {dLimit, "limit"}, {dRemaining, "remaining"},
		{dGateway, "gateway"},
	}); err != nil {
		return err
	}
	// Every member was validated as it was read; TestDecodedEventsValidate
	// checks that this agrees with Validate.
	return nil
}
