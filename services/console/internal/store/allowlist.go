package store

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/floodgate-dev/floodgate/pkg/dynamo"
)

// Allowlist keys in floodgate_runtime_config, as the detector reads them
// (services/detector/internal/detector/records.go).
const (
	AllowPrefix          = "detector#allow#"
	AllowPrincipalPrefix = AllowPrefix + "principal#"
	AllowCIDRPrefix      = AllowPrefix + "cidr#"
)

// Audit actions of the allowlist page.
const (
	ActionAllowCIDR   = "allowlist.cidr.add"
	ActionAllowRemove = "allowlist.remove"
)

// The narrowest prefix lengths an analyst may allowlist; broader ones need
// the admin role. /0 is refused to everyone: it would switch detection off.
const (
	MinAnalystBits4 = 8
	MinAnalystBits6 = 32
)

// ErrBroad is returned for a prefix broader than the caller may allowlist.
var ErrBroad = errors.New("prefix too broad")

// ParseCIDR reads a network (203.0.113.0/24, 2001:db8::/48) or a single
// address (a /32 or /128) and returns it masked, as the detector keys it.
// IPv4-mapped IPv6 networks are written in their IPv4 form. Prefixes broader
// than /8 (IPv4) or /32 (IPv6) need admin.
func ParseCIDR(s string, admin bool) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	var p netip.Prefix
	var err error
	if strings.Contains(s, "/") {
		p, err = netip.ParsePrefix(s)
	} else {
		var a netip.Addr
		if a, err = netip.ParseAddr(s); err == nil {
			if a.Zone() != "" {
				return netip.Prefix{}, fmt.Errorf("%w: cidr %q: zones are not allowed", ErrInvalid, s)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
	}
	if err != nil || s == "" {
		return netip.Prefix{}, fmt.Errorf("%w: cidr %q: want a network like 203.0.113.0/24 or 2001:db8::/48", ErrInvalid, s)
	}
	if p.Addr().Is4In6() {
		if p.Bits() < 96 {
			return netip.Prefix{}, fmt.Errorf("%w: cidr %q: an IPv4-mapped network must be /96 or longer; write it in IPv4 form", ErrInvalid, s)
		}
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	p = p.Masked()
	minBits := MinAnalystBits6
	if p.Addr().Is4() {
		minBits = MinAnalystBits4
	}
	switch {
	case p.Bits() == 0:
		return netip.Prefix{}, fmt.Errorf("%w: cidr %s would allowlist every address", ErrBroad, p)
	case p.Bits() < minBits && !admin:
		return netip.Prefix{}, fmt.Errorf("%w: cidr %s is broader than /%d; only an admin may allowlist it", ErrBroad, p, minBits)
	}
	return p, nil
}

// AllowCIDRPK is the runtime-config key of a network's allowlist entry.
func AllowCIDRPK(p netip.Prefix) string { return AllowCIDRPrefix + p.Masked().String() }

// CIDRSubject is the audit pk of what is done to one allowlisted network.
func CIDRSubject(p netip.Prefix) string { return "cidr#" + p.Masked().String() }

// AllowListing is one allowlist entry as the allowlist page shows it.
type AllowListing struct {
	AllowEntry
	Kind    string       // "principal" or "cidr"
	Target  string       // kind:id or the prefix
	Prefix  netip.Prefix // for a CIDR entry
	Expired bool         // past expires_at; DynamoDB's TTL has not removed it yet
}

// Until is the entry's expiry.
func (l AllowListing) Until() time.Time { return time.Unix(l.ExpiresAt, 0).UTC() }

func (s *Store) getAllowPK(ctx context.Context, pk string) (AllowEntry, bool, error) {
	out, err := s.ddb.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(s.runtime),
		Key: map[string]types.AttributeValue{"pk": sv(pk)}, ConsistentRead: aws.Bool(true)})
	if err != nil {
		return AllowEntry{}, false, fmt.Errorf("get allowlist entry %s: %w", pk, err)
	}
	if len(out.Item) == 0 {
		return AllowEntry{}, false, nil
	}
	return allowFrom(out.Item), true, nil
}

func allowFrom(it map[string]types.AttributeValue) AllowEntry {
	e := AllowEntry{PK: dynamo.Str(it["pk"]), Comment: dynamo.Str(it["comment"]), CreatedBy: dynamo.Str(it["created_by"]), CreatedAt: dynamo.Str(it["created_at"])}
	e.ExpiresAt, _ = strconv.ParseInt(dynamo.Num(it["expires_at"]), 10, 64)
	return e
}

// AllowCIDR allowlists the network p until expires: the detector stops
// acting on detections whose every top IP lies in allowlisted networks from
// its next allowlist refresh (30 s). from, when set, is the alert the analyst
// acted from: the change is then audited under its principal too.
func (s *Store) AllowCIDR(ctx context.Context, p netip.Prefix, expires time.Time, comment string, who Actor, from *Alert) (AllowEntry, error) {
	if err := who.check(); err != nil {
		return AllowEntry{}, err
	}
	now := s.now().UTC()
	if !p.IsValid() {
		return AllowEntry{}, fmt.Errorf("%w: no network", ErrInvalid)
	}
	if err := checkAllow(now, expires, comment); err != nil {
		return AllowEntry{}, err
	}
	p = p.Masked()
	pk := AllowCIDRPK(p)
	prev, had, err := s.getAllowPK(ctx, pk)
	if err != nil {
		return AllowEntry{}, err
	}
	e := AllowEntry{PK: pk, ExpiresAt: expires.Unix(), Comment: comment, CreatedBy: who.Name, CreatedAt: now.Format(time.RFC3339)}
	var before any
	if had {
		before = prev
	}
	items := []types.TransactWriteItem{{Put: s.allowPut(e)}}
	subject := Alert{Principal: "", ID: ""}
	if from != nil {
		subject.ID = from.ID
		// The alert's own audit log shows the change too.
		alertRow := s.entry(*from, who, ActionAllowCIDR, now, before, e)
		items = append(items, types.TransactWriteItem{Put: &types.Put{TableName: aws.String(s.audit), Item: auditItem(alertRow),
			ConditionExpression: aws.String("attribute_not_exists(pk)")}})
	}
	row := s.entry(subject, who, ActionAllowCIDR, now, before, e)
	row.Subject = CIDRSubject(p)
	if err := s.write(ctx, row, items...); err != nil {
		return AllowEntry{}, fmt.Errorf("allowlist %s: %w", p, err)
	}
	return e, nil
}

// RemoveAllow deletes the allowlist entry pk (a principal's or a network's);
// the detector acts on their detections again from its next refresh.
func (s *Store) RemoveAllow(ctx context.Context, pk string, who Actor) (AllowEntry, error) {
	if err := who.check(); err != nil {
		return AllowEntry{}, err
	}
	subject, err := allowSubject(pk)
	if err != nil {
		return AllowEntry{}, err
	}
	prev, had, err := s.getAllowPK(ctx, pk)
	if err != nil {
		return AllowEntry{}, err
	}
	if !had {
		return AllowEntry{}, ErrNoAllow
	}
	del := &types.Delete{TableName: aws.String(s.runtime), Key: map[string]types.AttributeValue{"pk": sv(pk)},
		ConditionExpression: aws.String("attribute_exists(pk)")}
	now := s.now().UTC()
	row := s.entry(Alert{}, who, ActionAllowRemove, now, prev, nil)
	row.Subject = subject
	err = s.write(ctx, row, types.TransactWriteItem{Delete: del})
	var canceled *types.TransactionCanceledException
	if errors.As(err, &canceled) && len(canceled.CancellationReasons) > 1 &&
		aws.ToString(canceled.CancellationReasons[1].Code) == "ConditionalCheckFailed" {
		return AllowEntry{}, ErrNoAllow
	}
	if err != nil {
		return AllowEntry{}, fmt.Errorf("remove allowlist entry %s: %w", pk, err)
	}
	return prev, nil
}

// ErrNoAllow is returned when the entry to remove does not exist.
var ErrNoAllow = errors.New("no such allowlist entry")

// allowSubject is the audit pk of an allowlist key.
func allowSubject(pk string) (string, error) {
	switch {
	case strings.HasPrefix(pk, AllowPrincipalPrefix):
		principal := strings.TrimPrefix(pk, AllowPrincipalPrefix)
		if _, err := penaltyKey(principal); err != nil {
			return "", err
		}
		return AuditSubject(principal), nil
	case strings.HasPrefix(pk, AllowCIDRPrefix):
		p, err := netip.ParsePrefix(strings.TrimPrefix(pk, AllowCIDRPrefix))
		if err != nil {
			return "", fmt.Errorf("%w: %q is not an allowlist key", ErrInvalid, pk)
		}
		return CIDRSubject(p), nil
	}
	return "", fmt.Errorf("%w: %q is not an allowlist key", ErrInvalid, pk)
}

// ListAllow returns every allowlist entry, principals and networks, soonest
// expiry last; expired entries the table's TTL has not removed yet are marked.
func (s *Store) ListAllow(ctx context.Context) ([]AllowListing, error) {
	var res []AllowListing
	var start map[string]types.AttributeValue
	now := s.now().Unix()
	for {
		out, err := s.ddb.Scan(ctx, &dynamodb.ScanInput{TableName: aws.String(s.runtime),
			FilterExpression:          aws.String("begins_with(pk, :p)"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":p": sv(AllowPrefix)},
			ExclusiveStartKey:         start, ConsistentRead: aws.Bool(true)})
		if err != nil {
			return nil, fmt.Errorf("scan allowlist: %w", err)
		}
		for _, it := range out.Items {
			l := AllowListing{AllowEntry: allowFrom(it)}
			switch {
			case strings.HasPrefix(l.PK, AllowPrincipalPrefix):
				l.Kind, l.Target = "principal", strings.TrimPrefix(l.PK, AllowPrincipalPrefix)
			case strings.HasPrefix(l.PK, AllowCIDRPrefix):
				l.Kind, l.Target = "cidr", strings.TrimPrefix(l.PK, AllowCIDRPrefix)
				l.Prefix, _ = netip.ParsePrefix(l.Target)
			default:
				continue
			}
			l.Expired = l.ExpiresAt <= now
			res = append(res, l)
		}
		if len(out.LastEvaluatedKey) == 0 {
			break
		}
		start = out.LastEvaluatedKey
	}
	sort.Slice(res, func(i, j int) bool {
		if res[i].Expired != res[j].Expired {
			return !res[i].Expired
		}
		if res[i].Kind != res[j].Kind {
			return res[i].Kind < res[j].Kind
		}
		return res[i].Target < res[j].Target
	})
	return res, nil
}

// CIDRCovering returns, of the live network entries, the one that covers ip
// (the narrowest), as the detector matches them.
func CIDRCovering(entries []AllowListing, ip netip.Addr) (AllowListing, bool) {
	var best AllowListing
	found := false
	for _, e := range entries {
		if e.Kind != "cidr" || e.Expired || !e.Prefix.IsValid() || !e.Prefix.Contains(ip.Unmap()) {
			continue
		}
		if !found || e.Prefix.Bits() > best.Prefix.Bits() {
			best, found = e, true
		}
	}
	return best, found
}
