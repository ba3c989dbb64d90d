package deploy_test

// Kafka identities of the production overlay (issue 22, S3): every workload signs in to Kafka
// as its program's own user — the user migrations/acls.go grants exactly that service's topics
// and groups — with a password from a Secret no other program's workload reads, and the MSK IAM
// policy documents in deploy/aws/msk-iam are the same grants, generated from migrations.Grants
// (`migrate -msk-iam-policies`) and compared byte for byte here, so neither can drift from the
// ACLs.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/migrations"
)

const mskPolicyDir = "deploy/aws/msk-iam"

// aclNames are the names the overlay's migrate Job grants: its user prefix (the program's
// default when the Job does not set one).
func (m *model) aclNames() migrations.ACLNames {
	n := migrations.ACLNames{UserPrefix: "floodgate-"}
	if j := m.overlay.find("Job", "migrate"); j != nil && j.Spec.Template != nil {
		if v, ok := m.overlay.env(workload{j, m.programs["migrate"]})["FLOODGATE_KAFKA_ACL_USER_PREFIX"]; ok {
			n.UserPrefix = v
		}
	}
	return n
}

// checkKafkaUsers holds the production overlay's render.
func checkKafkaUsers(m *model) []string {
	var out []string
	k := m.overlay
	n := m.aclNames()
	grants := map[string]bool{}
	for _, g := range migrations.Grants(n) {
		grants[g.Service] = true
		if m.base.find("Deployment", g.Service) == nil {
			out = append(out, fmt.Sprintf("migrations/acls.go grants service %q, which has no Deployment in the base", g.Service))
		}
	}
	// A user and its password Secret belong to a program: the CRITICAL limiter signs in as the
	// limiter, whose grants it needs, and no other program's workload may.
	users := map[string]string{}     // Kafka user → program
	passwords := map[string]string{} // Secret (its generator's name) → program
	for _, w := range m.workloads(k) {
		if !w.prog.reads("FLOODGATE_KAFKA_BROKERS") || w.main() == nil {
			continue
		}
		where := fmt.Sprintf("%s %s %s", k.where, w.obj.Kind, w.name())
		if !grants[w.prog.name] && w.prog.name != "migrate" {
			out = append(out, fmt.Sprintf("%s: a Kafka client without grants in migrations/acls.go (Grants)", where))
		}
		env := k.env(w)
		want := strings.TrimPrefix(n.User(w.prog.name), "User:")
		if user := env["FLOODGATE_KAFKA_SASL_USERNAME"]; user != want {
			out = append(out, fmt.Sprintf("%s: FLOODGATE_KAFKA_SASL_USERNAME=%q, want its own user %q (the ACLs of migrations/acls.go are granted to it)", where, user, want))
		} else if prev, dup := users[user]; dup && prev != w.prog.name {
			out = append(out, fmt.Sprintf("%s: Kafka user %q is also %s's", where, user, prev))
		} else {
			users[user] = w.prog.name
		}
		pw := w.main().envVar("FLOODGATE_KAFKA_SASL_PASSWORD")
		switch {
		case pw == nil || pw.ValueFrom == nil || pw.ValueFrom.SecretKeyRef == nil:
			out = append(out, fmt.Sprintf("%s: FLOODGATE_KAFKA_SASL_PASSWORD must come from its own Secret", where))
		case k.find("Secret", pw.ValueFrom.SecretKeyRef.Name) == nil:
			out = append(out, fmt.Sprintf("%s: FLOODGATE_KAFKA_SASL_PASSWORD reads Secret %q, which the overlay does not generate", where, pw.ValueFrom.SecretKeyRef.Name))
		default:
			s := generatorName(k.find("Secret", pw.ValueFrom.SecretKeyRef.Name))
			if prev, dup := passwords[s]; dup && prev != w.prog.name {
				out = append(out, fmt.Sprintf("%s: FLOODGATE_KAFKA_SASL_PASSWORD shares Secret %q with %s: one Secret per Kafka user", where, s, prev))
			}
			passwords[s] = w.prog.name
		}
		if w.prog.name == "migrate" && env["FLOODGATE_KAFKA_ACLS"] != "true" {
			out = append(out, where+": FLOODGATE_KAFKA_ACLS must be \"true\": per-service users mean nothing without their ACLs")
		}
	}
	// A Secret holding a Kafka password is read by one program's workloads only.
	for _, w := range m.workloads(k) {
		if w.main() == nil {
			continue
		}
		for _, e := range w.main().Env {
			if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.Name == "FLOODGATE_KAFKA_SASL_PASSWORD" {
				continue
			}
			if s := k.find("Secret", e.ValueFrom.SecretKeyRef.Name); s != nil {
				if owner, ok := passwords[generatorName(s)]; ok && owner != w.prog.name {
					out = append(out, fmt.Sprintf("%s %s: %s reads %s's Kafka password Secret %q", k.where, w.name(), e.Name, owner, generatorName(s)))
				}
			}
		}
	}
	if _, shared := k.config()["FLOODGATE_KAFKA_SASL_USERNAME"]; shared {
		out = append(out, k.where+": floodgate-config sets FLOODGATE_KAFKA_SASL_USERNAME, one user for every service")
	}
	return append(out, m.checkMSKPolicies(n)...)
}

// checkMSKPolicies compares deploy/aws/msk-iam with what migrations generates.
func (m *model) checkMSKPolicies(n migrations.ACLNames) []string {
	ms, err := migrations.Load()
	if err != nil {
		return []string{fmt.Sprintf("migrations: %v", err)}
	}
	want, err := migrations.PolicyFiles(n, ms, migrations.ExampleMSKClusterARN)
	if err != nil {
		return []string{fmt.Sprintf("MSK IAM policies: %v", err)}
	}
	var out []string
	regen := "regenerate with `go run ./migrations/cmd/migrate -msk-iam-policies " + mskPolicyDir + "`"
	for _, name := range slices.Sorted(maps.Keys(want)) {
		got, ok := m.mskPolicies[name]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("%s/%s: missing; %s", mskPolicyDir, name, regen))
		case !bytes.Equal(got, want[name]):
			out = append(out, fmt.Sprintf("%s/%s: not the grants of migrations/acls.go; %s", mskPolicyDir, name, regen))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(m.mskPolicies)) {
		if _, ok := want[name]; !ok {
			out = append(out, fmt.Sprintf("%s/%s: no service of migrations/acls.go has this policy; remove it", mskPolicyDir, name))
		}
	}
	return out
}

// TestSecurityKafkaUsersRenderedS3 takes what a cluster would receive from the production
// overlay (rendered with kustomize, render_test.go), on its own terms: every Kafka client's
// container has its own user and its own password Secret, every granted service runs as its own
// user, and no env entry holds both a value and a valueFrom (which the API server rejects).
func TestSecurityKafkaUsersRenderedS3(t *testing.T) {
	m := loadModel(t)
	n := m.aclNames()
	seen := map[string]string{}
	for _, kind := range []string{"Deployment", "Job"} {
		for _, o := range m.overlay.kind(kind) {
			p := m.programOf(o)
			require.NotNil(t, p, "%s %s", o.Kind, o.Metadata.Name)
			if !p.reads("FLOODGATE_KAFKA_BROKERS") {
				continue
			}
			c := workload{o, p}.main()
			require.NotNil(t, c)
			env := map[string]envVar{}
			for _, e := range c.Env {
				require.False(t, e.Value != "" && e.ValueFrom != nil, "%s: %s has both a value and a valueFrom", o.Metadata.Name, e.Name)
				env[e.Name] = e
			}
			user := env["FLOODGATE_KAFKA_SASL_USERNAME"]
			require.Equal(t, strings.TrimPrefix(n.User(p.name), "User:"), user.Value, "%s: its own Kafka user", o.Metadata.Name)
			pw := env["FLOODGATE_KAFKA_SASL_PASSWORD"]
			require.NotNil(t, pw.ValueFrom, o.Metadata.Name)
			require.NotNil(t, pw.ValueFrom.SecretKeyRef, o.Metadata.Name)
			secret := pw.ValueFrom.SecretKeyRef.Name
			require.NotNil(t, m.overlay.find("Secret", secret), "%s: Secret %s", o.Metadata.Name, secret)
			if prev, ok := seen[secret]; ok {
				require.Equal(t, p.name, prev, "%s shares its password Secret with %s", o.Metadata.Name, prev)
			}
			seen[secret] = p.name
		}
	}
	var want []string
	for _, g := range migrations.Grants(n) {
		want = append(want, g.Service)
	}
	var got []string
	for _, w := range seen {
		if w != "migrate" {
			got = append(got, w)
		}
	}
	slices.Sort(want)
	slices.Sort(got)
	require.Equal(t, want, got, "every granted service runs, as its own user")
}

// TestSecurityMSKIAMPoliciesAreTheACLGrantsS3 reads the committed policy documents back and checks them
// against the grants themselves (not only against the generator): each service may write
// exactly the topics it produces to, read exactly those it consumes, join exactly its groups.
func TestSecurityMSKIAMPoliciesAreTheACLGrantsS3(t *testing.T) {
	m := loadModel(t)
	n := m.aclNames()
	arn := func(kind, name string) string {
		return strings.Replace(migrations.ExampleMSKClusterARN, ":cluster/", ":"+kind+"/", 1) + "/" + name
	}
	for _, g := range migrations.Grants(n) {
		t.Run(g.Service, func(t *testing.T) {
			raw, ok := m.mskPolicies[g.Service+".json"]
			require.True(t, ok, "%s/%s.json", mskPolicyDir, g.Service)
			var p migrations.IAMPolicy
			require.NoError(t, json.Unmarshal(raw, &p))
			allowed := func(action string) []string {
				var res []string
				for _, s := range p.Statement {
					require.Equal(t, "Allow", s.Effect)
					if slices.Contains(s.Action, action) {
						res = append(res, s.Resource...)
					}
				}
				slices.Sort(res)
				return res
			}
			topics := func(names []string) []string {
				var res []string
				for _, t := range names {
					res = append(res, arn("topic", t))
				}
				slices.Sort(res)
				return slices.Compact(res)
			}
			var groups []string
			for _, grp := range g.Groups {
				groups = append(groups, arn("group", grp))
			}
			slices.Sort(groups)
			require.Equal(t, topics(g.Produce), allowed("kafka-cluster:WriteData"), "write")
			require.Equal(t, topics(g.Consume), allowed("kafka-cluster:ReadData"), "read")
			require.Equal(t, groups, allowed("kafka-cluster:AlterGroup"), "groups")
			require.Equal(t, []string{migrations.ExampleMSKClusterARN}, allowed("kafka-cluster:Connect"))
			for _, s := range p.Statement {
				for _, a := range s.Action {
					require.NotContains(t, []string{"kafka-cluster:*", "kafka-cluster:CreateTopic", "kafka-cluster:AlterCluster"}, a)
				}
			}
		})
	}
}
