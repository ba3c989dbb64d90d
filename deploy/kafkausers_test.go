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
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/floodgate-dev/floodgate/migrations"
)

const mskPolicyDir = "deploy/aws/msk-iam"

// overlayEnv is a workload's container env after the production overlay's patches: a
// patch's entry replaces the base's entry of the same name (what kustomize's strategic
// merge does for env, keyed by name), resolved like workload.env.
func (m *model) overlayEnv(w workload) (map[string]string, map[string]*envVar) {
	entries := map[string]*envVar{}
	if c := w.main(); c != nil {
		for i := range c.Env {
			entries[c.Env[i].Name] = &c.Env[i]
		}
	}
	for _, p := range m.overlay.patches {
		if p.Kind != w.obj.Kind || p.Metadata.Name != w.obj.Metadata.Name || p.Spec.Template == nil {
			continue
		}
		for i := range p.Spec.Template.Spec.Containers {
			c := &p.Spec.Template.Spec.Containers[i]
			if c.Name != w.prog.name {
				continue
			}
			for j := range c.Env {
				entries[c.Env[j].Name] = &c.Env[j]
			}
		}
	}
	vals := map[string]string{}
	for name, e := range entries {
		switch {
		case e.ValueFrom == nil:
			vals[name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			vals[name] = "<secret " + e.ValueFrom.SecretKeyRef.Name + ">"
		default:
			vals[name] = "<ref>"
		}
	}
	return vals, entries
}

// aclNames are the names the overlay's migrate Job grants: its user prefix (the program's
// default when the Job does not set one).
func (m *model) aclNames() migrations.ACLNames {
	n := migrations.ACLNames{UserPrefix: "floodgate-"}
	if j := m.base.find("Job", "migrate"); j != nil && j.Spec.Template != nil {
		env, _ := m.overlayEnv(workload{j, m.programs["migrate"]})
		if v, ok := env["FLOODGATE_KAFKA_ACL_USER_PREFIX"]; ok {
			n.UserPrefix = v
		}
	}
	return n
}

func checkKafkaUsers(m *model) []string {
	var out []string
	n := m.aclNames()
	grants := map[string]bool{}
	for _, g := range migrations.Grants(n) {
		grants[g.Service] = true
		if m.base.find("Deployment", g.Service) == nil {
			out = append(out, fmt.Sprintf("migrations/acls.go grants service %q, which has no Deployment in the base", g.Service))
		}
	}
	secrets := map[string]bool{}
	for _, g := range m.overlay.SecretGenerator {
		secrets[g.Name] = true
	}
	// A user and its password Secret belong to a program: the CRITICAL limiter signs in as the
	// limiter, whose grants it needs, and no other program's workload may.
	users := map[string]string{}     // Kafka user → program
	passwords := map[string]string{} // Secret → program
	for _, w := range m.workloads(m.base) {
		if !w.prog.reads("FLOODGATE_KAFKA_BROKERS") {
			continue
		}
		where := fmt.Sprintf("k8s overlay production %s %s", w.obj.Kind, w.name())
		if !grants[w.prog.name] && w.prog.name != "migrate" {
			out = append(out, fmt.Sprintf("%s: a Kafka client without grants in migrations/acls.go (Grants)", where))
		}
		env, entries := m.overlayEnv(w)
		want := strings.TrimPrefix(n.User(w.prog.name), "User:")
		if user := env["FLOODGATE_KAFKA_SASL_USERNAME"]; user != want {
			out = append(out, fmt.Sprintf("%s: FLOODGATE_KAFKA_SASL_USERNAME=%q, want its own user %q (the ACLs of migrations/acls.go are granted to it)", where, user, want))
		} else if prev, dup := users[user]; dup && prev != w.prog.name {
			out = append(out, fmt.Sprintf("%s: Kafka user %q is also %s's", where, user, prev))
		} else {
			users[user] = w.prog.name
		}
		pw := entries["FLOODGATE_KAFKA_SASL_PASSWORD"]
		switch {
		case pw == nil || pw.ValueFrom == nil || pw.ValueFrom.SecretKeyRef == nil:
			out = append(out, fmt.Sprintf("%s: FLOODGATE_KAFKA_SASL_PASSWORD must come from its own Secret", where))
		case !secrets[pw.ValueFrom.SecretKeyRef.Name]:
			out = append(out, fmt.Sprintf("%s: FLOODGATE_KAFKA_SASL_PASSWORD reads Secret %q, which the overlay does not generate", where, pw.ValueFrom.SecretKeyRef.Name))
		default:
			s := pw.ValueFrom.SecretKeyRef.Name
			if prev, dup := passwords[s]; dup && prev != w.prog.name {
				out = append(out, fmt.Sprintf("%s: FLOODGATE_KAFKA_SASL_PASSWORD shares Secret %q with %s: one Secret per Kafka user", where, s, prev))
			}
			passwords[s] = w.prog.name
		}
		if w.prog.name == "migrate" && env["FLOODGATE_KAFKA_ACLS"] != "true" {
			out = append(out, where+": FLOODGATE_KAFKA_ACLS must be \"true\": per-service users mean nothing without their ACLs")
		}
	}
	// A Secret holding a Kafka password is read by one workload only.
	for _, w := range m.workloads(m.base) {
		_, entries := m.overlayEnv(w)
		for name, e := range entries {
			if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || name == "FLOODGATE_KAFKA_SASL_PASSWORD" {
				continue
			}
			if owner, ok := passwords[e.ValueFrom.SecretKeyRef.Name]; ok && owner != w.prog.name {
				out = append(out, fmt.Sprintf("k8s overlay production %s: %s reads %s's Kafka password Secret %q", w.name(), name, owner, e.ValueFrom.SecretKeyRef.Name))
			}
		}
	}
	if c, ok := m.overlay.generated(m.overlay.ConfigMapGenerator, "floodgate-config"); ok {
		if _, shared := c["FLOODGATE_KAFKA_SASL_USERNAME"]; shared {
			out = append(out, "k8s overlay production: floodgate-config sets FLOODGATE_KAFKA_SASL_USERNAME, one user for every service")
		}
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

// TestSecurityKafkaUsersRenderedS3 renders the production overlay with kustomize (kubectl's
// built-in) and checks what a cluster would receive: every Kafka client's container has its own
// user and its own password Secret, and no env entry holds both a value and a valueFrom (which
// the parsed model above could not see and the API server rejects).
func TestSecurityKafkaUsersRenderedS3(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is not installed: TestSecurityPackaging/k8s-kafka-users checks the parsed overlay instead")
	}
	m := loadModel(t)
	raw, err := exec.Command(kubectl, "kustomize", filepath.Join(m.root, "deploy/k8s/overlays/production")).Output()
	require.NoError(t, err, "kubectl kustomize deploy/k8s/overlays/production")
	n := m.aclNames()
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	seen := map[string]string{}
	for {
		var o k8sObject
		if err := dec.Decode(&o); err != nil {
			require.ErrorContains(t, err, "EOF")
			break
		}
		if (o.Kind != "Deployment" && o.Kind != "Job") || o.Spec.Template == nil {
			continue
		}
		p := m.programOf(&o)
		require.NotNil(t, p, "%s %s", o.Kind, o.Metadata.Name)
		if !p.reads("FLOODGATE_KAFKA_BROKERS") {
			continue
		}
		c := workload{&o, p}.main()
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
		if prev, ok := seen[secret]; ok {
			require.Equal(t, p.name, prev, "%s shares its password Secret with %s", o.Metadata.Name, prev)
		}
		seen[secret] = p.name
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
