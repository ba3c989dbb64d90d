package migrations

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// Who may do what on Kafka: one SASL user per service, each allowed only the
// topics and consumer groups it uses, so that a service (or a credential
// stolen from one) cannot write events another trusts — above all, only the
// limiter (and the dlq-auditor's audited replay) may write decision events,
// which the quota ledger and the detector believe (issue 22 S3).

// ACLNames are the users, topics and groups the grants are made for; the
// zero value of a field means the default of the services' configuration.
type ACLNames struct {
	// UserPrefix precedes each service's name in its Kafka user
	// ("floodgate-" makes User:floodgate-limiter, …).
	UserPrefix                                                                             string
	DecisionsTopic, AbuseTopic, AdjustmentsTopic, RulesTopic, DeferredTopic, VerdictsTopic string
	ParamsTopic                                                                            string
	DetectorGroup, PagerGroup, QuotaGroup, DLQGroup, DeferredGroup                         string
}

func (n ACLNames) withDefaults() ACLNames {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&n.UserPrefix, "floodgate-")
	def(&n.DecisionsTopic, config.DefaultDecisionsTopic)
	def(&n.AbuseTopic, config.DefaultAbuseTopic)
	def(&n.AdjustmentsTopic, config.DefaultAdjustmentsTopic)
	def(&n.RulesTopic, config.DefaultRulesTopic)
	def(&n.ParamsTopic, config.DefaultDetectorParamsTopic)
	def(&n.DeferredTopic, "floodgate.deferred.v1")
	def(&n.VerdictsTopic, config.DefaultVerdictsTopic)
	def(&n.DeferredGroup, "floodgate-deferred")
	def(&n.DetectorGroup, "floodgate-detector")
	def(&n.PagerGroup, "floodgate-pager")
	def(&n.QuotaGroup, "floodgate-quota")
	def(&n.DLQGroup, "floodgate-dlq-auditor")
	return n
}

// Grant is one service's permissions.
type Grant struct {
	Service string
	// Produce and Consume are topics (Write, or Read, each with Describe);
	// Groups are the consumer groups it joins (Read).
	Produce, Consume, Groups []string
}

// Grants returns every service's permissions: the limiter writes decisions
// and deferred requests and reads the rules versions;
// the detector reads them (its group), writes abuse events and reads them
// back for paging (the pager group); the quota ledger reads decisions; each
// consumer writes its dead letters; the adjuster writes adjustments; the
// dlq-auditor reads the dead-letter topics and replays into their sources;
// the detector parameters versions are read by the detector and written as
// the rules versions are; the deferred-work worker reads deferred requests (its group) and writes
// their dead letters; the rules versions are written by the adjuster's
// rollout controller and the console's rollout page (and the `limiter
// rollout` command, run with an operator's own user); the console writes
// reviewers' verdicts and reads what it shows.
func Grants(n ACLNames) []Grant {
	n = n.withDefaults()
	dlq := func(t string) string { return t + stream.DLQSuffix }
	sources := []string{n.DecisionsTopic, n.AbuseTopic, n.AdjustmentsTopic, n.DeferredTopic, n.VerdictsTopic}
	dlqs := []string{dlq(n.DecisionsTopic), dlq(n.AbuseTopic), dlq(n.AdjustmentsTopic), dlq(n.DeferredTopic), dlq(n.VerdictsTopic)}
	auditGroups := make([]string, len(dlqs))
	for i, t := range dlqs {
		auditGroups[i] = stream.AuditGroup(n.DLQGroup, t)
	}
	return []Grant{
		{Service: "limiter", Produce: []string{n.DecisionsTopic, n.DeferredTopic}, Consume: []string{n.RulesTopic}},
		{Service: "detector", Produce: []string{n.AbuseTopic, dlq(n.DecisionsTopic), dlq(n.AbuseTopic)},
			Consume: []string{n.DecisionsTopic, n.AbuseTopic, n.ParamsTopic}, Groups: []string{n.DetectorGroup, n.PagerGroup}},
		{Service: "quota", Produce: []string{dlq(n.DecisionsTopic)}, Consume: []string{n.DecisionsTopic}, Groups: []string{n.QuotaGroup}},
		{Service: "adjuster", Produce: []string{n.AdjustmentsTopic, n.RulesTopic, n.ParamsTopic}, Consume: []string{n.RulesTopic, n.ParamsTopic}},
		{Service: "deferred", Produce: []string{dlq(n.DeferredTopic)}, Consume: []string{n.DeferredTopic}, Groups: []string{n.DeferredGroup}},
		{Service: "dlq-auditor", Produce: sources, Consume: dlqs, Groups: auditGroups},
		{Service: "console", Produce: []string{n.RulesTopic, n.ParamsTopic, n.VerdictsTopic}, Consume: append(append(slices.Clone(sources), dlqs...), n.RulesTopic, n.ParamsTopic)},
	}
}

// User is the Kafka principal of a service.
func (n ACLNames) User(service string) string { return "User:" + n.withDefaults().UserPrefix + service }

// ACLEntries turns grants into Kafka ACLs (literal resources, any host).
func ACLEntries(n ACLNames, grants []Grant) []kafka.ACLEntry {
	var out []kafka.ACLEntry
	add := func(user string, rt kafka.ResourceType, name string, ops ...kafka.ACLOperationType) {
		for _, op := range ops {
			out = append(out, kafka.ACLEntry{ResourceType: rt, ResourceName: name, ResourcePatternType: kafka.PatternTypeLiteral,
				Principal: user, Host: "*", Operation: op, PermissionType: kafka.ACLPermissionTypeAllow})
		}
	}
	for _, g := range grants {
		u := n.User(g.Service)
		for _, t := range g.Produce {
			add(u, kafka.ResourceTypeTopic, t, kafka.ACLOperationTypeWrite, kafka.ACLOperationTypeDescribe)
		}
		for _, t := range g.Consume {
			add(u, kafka.ResourceTypeTopic, t, kafka.ACLOperationTypeRead, kafka.ACLOperationTypeDescribe)
		}
		for _, grp := range g.Groups {
			add(u, kafka.ResourceTypeGroup, grp, kafka.ACLOperationTypeRead, kafka.ACLOperationTypeDescribe)
		}
	}
	return out
}

// ApplyACLs creates the ACLs (creating one that exists is a no-op in Kafka).
// The connection's user must be allowed to alter the cluster's ACLs.
func (k *Kafka) ApplyACLs(ctx context.Context, entries []kafka.ACLEntry, report func(string)) error {
	if len(entries) == 0 {
		return nil
	}
	resp, err := k.Client.CreateACLs(ctx, &kafka.CreateACLsRequest{ACLs: entries})
	if err != nil {
		return fmt.Errorf("kafka create acls: %w", err)
	}
	var errs []error
	for i, e := range resp.Errors {
		if e != nil && i < len(entries) {
			a := entries[i]
			errs = append(errs, fmt.Errorf("kafka acl %s %s on %s %s: %w", a.Principal, a.Operation, a.ResourceType, a.ResourceName, e))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	users := map[string]bool{}
	for _, a := range entries {
		users[a.Principal] = true
	}
	report(fmt.Sprintf("kafka acls: %d entries for %d users", len(entries), len(users)))
	return nil
}
