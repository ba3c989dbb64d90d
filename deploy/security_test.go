package deploy_test

// Security checks of the packaging (issue 22, S9 and S10; docs/security.md): nothing published
// beyond the host's loopback, no secret with a default or a literal value, the compose secrets
// generated on first run, the console's session secret from a Secret and its trusted proxies
// set in the production overlay. Same shape as packaging_test.go: each check is a function of
// the model (the Kubernetes manifests as rendered); the drift test breaks a fresh model one way
// per case.

import (
	"bytes"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/gateway"
)

var securityChecks = []check{
	{"compose-published-on-loopback", checkComposeLoopback},
	{"compose-secrets", checkComposeSecrets},
	{"k8s-secrets-and-proxies", checkK8sSecurity},
	{"k8s-kafka-users", checkKafkaUsers},
}

func TestSecurityPackaging(t *testing.T) {
	runChecks(t, loadModel(t), securityChecks)
}

// secretVar names an environment variable that holds a credential.
var secretVar = regexp.MustCompile(`(PASSWORD|TOKEN|SECRET|ROUTING_KEY)S?$`)

// Compose interpolation: required (${NAME:?message}) or empty by default (${NAME:-}).
var (
	requiredRef = regexp.MustCompile(`^\$\{([A-Z][A-Z0-9_]*):\?[^}]+\}$`)
	emptyRef    = regexp.MustCompile(`^\$\{([A-Z][A-Z0-9_]*):?-\}$`)
	secretsList = regexp.MustCompile(`(?m)^NAMES=\(([^)]*)\)`)
	derivedList = regexp.MustCompile(`(?m)^DERIVED=\(([^)]*)\)`)
)

// mustBeRequired are the credentials that protect something the moment the stack starts: they
// may not even default to empty.
var mustBeRequired = map[string][]string{
	"influxdb": {"DOCKER_INFLUXDB_INIT_PASSWORD", "DOCKER_INFLUXDB_INIT_ADMIN_TOKEN"},
	"grafana":  {"GF_SECURITY_ADMIN_PASSWORD"},
	"console":  {"FLOODGATE_CONSOLE_SESSION_SECRET"},
}

func checkComposeLoopback(m *model) []string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(m.compose.Services)) {
		for _, p := range m.compose.Services[name].Ports {
			// host_ip:host_port:container_port; without a host_ip Docker binds every interface.
			host := ""
			if i := strings.LastIndex(p, ":"); i > 0 {
				if j := strings.LastIndex(p[:i], ":"); j > 0 {
					host = strings.Trim(p[:j], "[]")
				}
			}
			ip, err := netip.ParseAddr(host)
			if err != nil || !ip.IsLoopback() {
				out = append(out, fmt.Sprintf("compose %s: port %q is published on every interface; publish it as 127.0.0.1:%s", name, p, strings.TrimPrefix(p, host+":")))
			}
		}
	}
	return out
}

func checkComposeSecrets(m *model) []string {
	var out []string
	raw, _ := os.ReadFile(filepath.Join(m.root, "deploy/compose/secrets.sh"))
	script := string(raw)
	generated := map[string]bool{}
	if mm := secretsList.FindStringSubmatch(script); mm != nil {
		for _, n := range strings.Fields(mm[1]) {
			generated[n] = true
		}
	} else {
		out = append(out, "deploy/compose/secrets.sh: no NAMES=(...) list of the secrets it generates")
	}
	// DERIVED=(...) are written from generated ones (a token's hash).
	if mm := derivedList.FindStringSubmatch(script); mm != nil {
		for _, n := range strings.Fields(mm[1]) {
			generated[n] = strings.Contains(script, "^"+n+"=")
		}
	}
	for _, name := range slices.Sorted(maps.Keys(m.compose.Services)) {
		env := m.compose.Services[name].env()
		for _, k := range slices.Sorted(maps.Keys(env)) {
			v := env[k]
			if mm := requiredRef.FindStringSubmatch(v); mm != nil {
				if !generated[mm[1]] {
					out = append(out, fmt.Sprintf("compose %s: %s requires ${%s}, which deploy/compose/secrets.sh does not generate", name, k, mm[1]))
				}
				continue
			}
			if !secretVar.MatchString(k) {
				continue
			}
			if slices.Contains(mustBeRequired[name], k) || (k == "FLOODGATE_INFLUX_TOKEN") {
				out = append(out, fmt.Sprintf("compose %s: %s=%q must be ${NAME:?...} from deploy/compose/secrets.env (no default)", name, k, v))
				continue
			}
			if v != "" && !emptyRef.MatchString(v) {
				out = append(out, fmt.Sprintf("compose %s: %s=%q: a credential is never a literal or a default; use ${NAME:?...} or ${NAME:-} (disabled)", name, k, v))
			}
		}
		for _, k := range mustBeRequired[name] {
			if _, ok := env[k]; !ok {
				out = append(out, fmt.Sprintf("compose %s: %s is not set (it must come from deploy/compose/secrets.env)", name, k))
			}
		}
	}
	if g := m.compose.Services["grafana"]; g == nil || g.env()["GF_AUTH_ANONYMOUS_ENABLED"] != "false" {
		out = append(out, "compose grafana: GF_AUTH_ANONYMOUS_ENABLED must be \"false\"")
	}
	return out
}

func checkK8sSecurity(m *model) []string {
	var out []string
	for _, k := range m.renders() {
		for _, o := range k.objects {
			if o.Spec.Template == nil {
				continue
			}
			for _, c := range append(slices.Clone(o.Spec.Template.Spec.Containers), o.Spec.Template.Spec.InitContainers...) {
				for _, e := range c.Env {
					if secretVar.MatchString(e.Name) && (e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil) {
						out = append(out, fmt.Sprintf("%s %s %s: %s must come from a Secret (secretKeyRef), not a value", k.where, o.Kind, o.Metadata.Name, e.Name))
					}
				}
			}
		}
		if c := k.find("Deployment", "console"); c != nil {
			if k.env(workload{c, m.programs["console"]})["FLOODGATE_CONSOLE_SESSION_SECRET"] != "<ref>" {
				out = append(out, k.where+" console: FLOODGATE_CONSOLE_SESSION_SECRET must be set from a Secret (the console listens on 0.0.0.0 and refuses to start without it)")
			}
		} else {
			out = append(out, k.where+": no console Deployment")
		}
	}
	proxies := ""
	if c := m.overlay.find("Deployment", "console"); c != nil {
		proxies = m.overlay.env(workload{c, m.programs["console"]})["FLOODGATE_CONSOLE_TRUSTED_PROXIES"]
	}
	list, err := gateway.ParseTrustedProxies(strings.Split(proxies, ","))
	switch {
	case err != nil:
		out = append(out, fmt.Sprintf("k8s overlay production: FLOODGATE_CONSOLE_TRUSTED_PROXIES: %v", err))
	case len(list) == 0:
		out = append(out, "k8s overlay production: the console must set FLOODGATE_CONSOLE_TRUSTED_PROXIES to the ingress's addresses, or every sign-in failure counts against the ingress's one address (S9)")
	default:
		for _, p := range list {
			if p.Bits() == 0 {
				out = append(out, fmt.Sprintf("k8s overlay production: FLOODGATE_CONSOLE_TRUSTED_PROXIES trusts %s, i.e. every client's X-Forwarded-For", p))
			}
		}
	}
	return out
}

// container is the main container of k's kind/name (named after its program).
func (m *model) container(t *testing.T, k *rendered, kind, name string) *container {
	t.Helper()
	o := k.find(kind, name)
	require.NotNil(t, o, "%s: %s %s", k.dir, kind, name)
	c := workload{o, m.programOf(o)}.main()
	require.NotNil(t, c, "%s: %s %s", k.dir, kind, name)
	return c
}

// dropEnv removes variable name from c.
func (c *container) dropEnv(name string) {
	c.Env = slices.DeleteFunc(c.Env, func(e envVar) bool { return e.Name == name })
}

// envVar is c's variable name, or nil.
func (c *container) envVar(name string) *envVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

func TestSecurityPackagingCatchesDrift(t *testing.T) {
	// publish is a break that publishes compose service svc's ports as given.
	publish := func(svc string, ports ...string) func(*model) {
		return func(m *model) { m.compose.Services[svc].Ports = ports }
	}
	for _, tc := range []struct {
		name    string
		breakIt func(m *model)
		want    string
	}{
		{"Grafana on every interface", publish("grafana", "3000:3000"), `compose grafana: port "3000:3000" is published on every interface`},
		{"Prometheus on 0.0.0.0", publish("prometheus", "0.0.0.0:9090:9090"), "compose prometheus: port"},
		{"the limiter on every interface", publish("limiter", "8080:8080"), "compose limiter: port"},
		{"Grafana admin/admin", setComposeEnv("grafana", "GF_SECURITY_ADMIN_PASSWORD", "admin"), "compose grafana: GF_SECURITY_ADMIN_PASSWORD"},
		{"Grafana without a password", unsetComposeEnv("grafana", "GF_SECURITY_ADMIN_PASSWORD"),
			"compose grafana: GF_SECURITY_ADMIN_PASSWORD is not set"},
		{"a default InfluxDB token",
			setComposeEnv("influxdb", "DOCKER_INFLUXDB_INIT_ADMIN_TOKEN", "${FLOODGATE_INFLUX_TOKEN:-floodgate-compose-dev-token-not-secret}"),
			"compose influxdb: DOCKER_INFLUXDB_INIT_ADMIN_TOKEN"},
		{"a default token on a service", setComposeEnv("detector", "FLOODGATE_INFLUX_TOKEN", "${FLOODGATE_INFLUX_TOKEN:-dev}"),
			"compose detector: FLOODGATE_INFLUX_TOKEN"},
		{"a literal credential", setComposeEnv("adjuster", "FLOODGATE_ADJUSTER_TOKENS", "ops:sre:abc"),
			"compose adjuster: FLOODGATE_ADJUSTER_TOKENS"},
		{"the console without its session secret", unsetComposeEnv("console", "FLOODGATE_CONSOLE_SESSION_SECRET"),
			"compose console: FLOODGATE_CONSOLE_SESSION_SECRET is not set"},
		{"a required secret nobody generates", setComposeEnv("grafana", "GF_SECURITY_ADMIN_PASSWORD", "${GF_PASSWORD:?run secrets.sh}"),
			"requires ${GF_PASSWORD}, which deploy/compose/secrets.sh does not generate"},
		{"anonymous Grafana", setComposeEnv("grafana", "GF_AUTH_ANONYMOUS_ENABLED", "true"), "GF_AUTH_ANONYMOUS_ENABLED"},
		{"the session secret as a value in k8s", func(m *model) {
			e := m.container(t, m.base, "Deployment", "console").envVar("FLOODGATE_CONSOLE_SESSION_SECRET")
			e.ValueFrom, e.Value = nil, "hunter2hunter2hunter2hunter2hunter2"
		}, "FLOODGATE_CONSOLE_SESSION_SECRET must come from a Secret"},
		{"no trusted proxies in the overlay", func(m *model) {
			m.container(t, m.overlay, "Deployment", "console").dropEnv("FLOODGATE_CONSOLE_TRUSTED_PROXIES")
		}, "the console must set FLOODGATE_CONSOLE_TRUSTED_PROXIES"},
		{"one Kafka user for every service", func(m *model) {
			for _, w := range m.workloads(m.overlay) {
				if e := w.main().envVar("FLOODGATE_KAFKA_SASL_USERNAME"); e != nil {
					e.Value = "floodgate"
				}
			}
		}, `k8s overlay production Deployment limiter: FLOODGATE_KAFKA_SASL_USERNAME="floodgate", want its own user "floodgate-limiter"`},
		{"a service without its own Kafka user", func(m *model) {
			m.container(t, m.overlay, "Deployment", "deferred").dropEnv("FLOODGATE_KAFKA_SASL_USERNAME")
		}, `Deployment deferred: FLOODGATE_KAFKA_SASL_USERNAME="", want its own user "floodgate-deferred"`},
		{"the CRITICAL limiter as a Kafka user without grants", func(m *model) {
			m.container(t, m.overlay, "Deployment", criticalLimiter).envVar("FLOODGATE_KAFKA_SASL_USERNAME").Value = "limiter-critical"
		}, `Deployment limiter-critical: FLOODGATE_KAFKA_SASL_USERNAME="limiter-critical", want its own user "floodgate-limiter"`},
		{"another program's Kafka password on the CRITICAL limiter", func(m *model) {
			e := m.container(t, m.overlay, "Deployment", criticalLimiter).envVar("FLOODGATE_KAFKA_SASL_PASSWORD")
			e.ValueFrom.SecretKeyRef.Name = m.overlay.generated("Secret", "floodgate-kafka-quota").Metadata.Name
		}, `Deployment quota: FLOODGATE_KAFKA_SASL_PASSWORD shares Secret "floodgate-kafka-quota" with limiter`},
		{"a shared Kafka password", func(m *model) {
			e := m.container(t, m.overlay, "Deployment", "quota").envVar("FLOODGATE_KAFKA_SASL_PASSWORD")
			e.ValueFrom.SecretKeyRef.Name = m.overlay.generated("Secret", "floodgate-kafka-detector").Metadata.Name
		}, `shares Secret "floodgate-kafka-detector"`},
		{"a Kafka password from a Secret the overlay does not generate", func(m *model) {
			e := m.container(t, m.overlay, "Deployment", "quota").envVar("FLOODGATE_KAFKA_SASL_PASSWORD")
			e.ValueFrom.SecretKeyRef.Name = "floodgate-kafka-quota"
		}, `FLOODGATE_KAFKA_SASL_PASSWORD reads Secret "floodgate-kafka-quota", which the overlay does not generate`},
		{"ACLs not applied", func(m *model) {
			m.container(t, m.overlay, "Job", "migrate").dropEnv("FLOODGATE_KAFKA_ACLS")
		}, "FLOODGATE_KAFKA_ACLS must be"},
		{"an IAM policy edited by hand", func(m *model) {
			m.mskPolicies["quota.json"] = bytes.Replace(m.mskPolicies["quota.json"], []byte("ReadData"), []byte("WriteData"), 1)
		}, "deploy/aws/msk-iam/quota.json: not the grants of migrations/acls.go"},
		{"an IAM policy missing", func(m *model) {
			delete(m.mskPolicies, "console.json")
		}, "deploy/aws/msk-iam/console.json: missing"},
		{"every client trusted", func(m *model) {
			m.container(t, m.overlay, "Deployment", "console").envVar("FLOODGATE_CONSOLE_TRUSTED_PROXIES").Value = "0.0.0.0/0"
		}, "trusts 0.0.0.0/0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := loadModel(t)
			tc.breakIt(m)
			var problems []string
			for _, c := range securityChecks {
				problems = append(problems, c.run(m)...)
			}
			require.NotEmpty(t, problems)
			require.Contains(t, strings.Join(problems, "\n"), tc.want)
		})
	}
}
