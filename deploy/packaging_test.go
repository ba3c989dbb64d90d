// Package deploy_test checks the production packaging against the code, so the Dockerfile,
// docker-compose.yml, the Kubernetes manifests and the Grafana dashboards cannot drift from
// what the programs really read, listen on, consume and export. Nothing here runs Docker or a
// cluster (there is neither on a developer machine or in CI): the files are parsed, the
// Kubernetes kustomizations rendered in-process as `kubectl kustomize` renders them
// (render_test.go), and the result cross-checked with the Go sources, migrations/ and each other.
//
// Every check is a function from the model to a list of problems. TestPackaging runs
// them on the files as they are and wants none; TestChecksCatchDrift breaks a fresh copy of
// the model one way per case and wants the matching problem, so no check can pass vacuously.
package deploy_test

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"go/parser"
	"go/token"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/floodgate-dev/floodgate/migrations"
)

const (
	nonRootUID   = 65532
	consumesAnno = "floodgate.dev/consumes"
	placeholder  = "CHANGE-ME"
)

// ---- the model ----------------------------------------------------------------------------

// program is one binary the packaging ships: services/<name> or the migrate command.
type program struct {
	name string
	dir  string // relative to the repository root, slash-separated
	// sources holds the non-test Go files of every package in the program's import closure
	// inside this module (path → content): what the program can possibly read.
	sources map[string]string
	// own holds the program's own files (its directory tree), where its defaults live.
	own map[string]string
	// listen maps each FLOODGATE_*_ADDR the program reads to its default port.
	listen map[string]int
	// consumer is true when the program reads a FLOODGATE_*_GROUP (a Kafka consumer group).
	consumer bool
}

func (p *program) ownHas(s string) bool {
	for _, src := range p.own {
		if strings.Contains(src, s) {
			return true
		}
	}
	return false
}

// servesMetrics reports whether the program mounts a Prometheus /metrics handler.
func (p *program) servesMetrics() bool {
	for _, src := range p.sources {
		if strings.Contains(src, `"GET /metrics"`) {
			return true
		}
	}
	return false
}

func (p *program) reads(env string) bool {
	needle := `"` + env + `"`
	for _, src := range p.sources {
		if strings.Contains(src, needle) {
			return true
		}
	}
	return false
}

type model struct {
	root       string
	programs   map[string]*program
	partitions map[string]int // topic → partitions, from migrations/
	tables     []string
	goSources  map[string]string // every non-test .go under services/, pkg/, migrations/

	docker     *dockerfile
	compose    *composeFile
	base       *rendered             // deploy/k8s/base, rendered
	overlay    *rendered             // deploy/k8s/overlays/production, rendered
	monitoring *rendered             // deploy/k8s/monitoring: Prometheus Operator objects, optional
	dashboards map[string]*dashboard // file name → dashboard
	alerts     alertRules            // deploy/prometheus/alerts.yml
	runbooks   string                // docs/runbooks.md
	prometheus *promConfig
	grafana    grafanaProvisioning
	docs       string
	// mskPolicies are deploy/aws/msk-iam/*.json by file name (security_test.go).
	mskPolicies map[string][]byte
}

func loadModel(t *testing.T) *model {
	t.Helper()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	m := &model{root: root, programs: map[string]*program{}, partitions: map[string]int{}, dashboards: map[string]*dashboard{}}

	ms, err := migrations.Load()
	require.NoError(t, err)
	for _, mig := range ms { // version order: a later file may grow a topic
		for _, tp := range mig.Kafka.Topics {
			m.partitions[tp.Name] = tp.Partitions
		}
		for _, tb := range mig.DynamoDB.Tables {
			m.tables = append(m.tables, tb.Name)
		}
	}
	require.NotEmpty(t, m.partitions, "no topics in migrations/")

	m.goSources = map[string]string{}
	for _, dir := range []string{"services", "pkg", "migrations"} {
		require.NoError(t, filepath.WalkDir(filepath.Join(root, dir), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !isSource(path) {
				return err
			}
			b, err := os.ReadFile(path)
			m.goSources[rel(root, path)] = string(b)
			return err
		}))
	}

	mains, err := filepath.Glob(filepath.Join(root, "services", "*", "main.go"))
	require.NoError(t, err)
	require.NotEmpty(t, mains, "no services/*/main.go")
	dirs := map[string]string{"migrate": "migrations/cmd/migrate"}
	for _, mf := range mains {
		d := rel(root, filepath.Dir(mf))
		dirs[filepath.Base(d)] = d
	}
	modPath := modulePath(t, root)
	for name, dir := range dirs {
		m.programs[name] = loadProgram(t, root, modPath, name, dir)
	}

	m.docker = parseDockerfile(t, filepath.Join(root, "deploy/docker/Dockerfile"))
	m.compose = parseCompose(t, filepath.Join(root, "deploy/docker-compose.yml"))
	renders, err := committed()
	require.NoError(t, err)
	m.setRenders(t, renders)
	dashFiles, err := filepath.Glob(filepath.Join(root, "deploy/grafana/dashboards/*.json"))
	require.NoError(t, err)
	require.NotEmpty(t, dashFiles)
	for _, f := range dashFiles {
		var d dashboard
		require.NoError(t, json.Unmarshal(readFile(t, f), &d), f)
		m.dashboards[filepath.Base(f)] = &d
	}
	m.prometheus = &promConfig{}
	require.NoError(t, yaml.Unmarshal(readFile(t, filepath.Join(root, "deploy/grafana/prometheus.yml")), m.prometheus))
	require.NoError(t, yaml.Unmarshal(readFile(t, filepath.Join(root, "deploy/grafana/provisioning/dashboards/floodgate.yaml")), &m.grafana))
	require.NoError(t, yaml.Unmarshal(readFile(t, filepath.Join(root, "deploy/prometheus/alerts.yml")), &m.alerts))
	m.runbooks = string(readFile(t, filepath.Join(root, "docs/runbooks.md")))
	m.docs = string(readFile(t, filepath.Join(root, "docs/deployment.md")))
	m.mskPolicies = map[string][]byte{}
	policyFiles, err := filepath.Glob(filepath.Join(root, mskPolicyDir, "*.json"))
	require.NoError(t, err)
	for _, f := range policyFiles {
		m.mskPolicies[filepath.Base(f)] = readFile(t, f)
	}
	return m
}

func isSource(path string) bool {
	return strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go")
}

func rel(root, path string) string {
	r, err := filepath.Rel(root, path)
	if err != nil {
		return path
	}
	return filepath.ToSlash(r)
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

func modulePath(t *testing.T, root string) string {
	t.Helper()
	for _, line := range strings.Split(string(readFile(t, filepath.Join(root, "go.mod"))), "\n") {
		if p, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.TrimSpace(p)
		}
	}
	t.Fatal("go.mod has no module line")
	return ""
}

var (
	addrDefaultRe = regexp.MustCompile(`\.String\(\s*"(FLOODGATE_[A-Z0-9_]+_ADDR)",\s*("[^"]*"|[A-Za-z_][A-Za-z0-9_.]*)`)
	constRe       = `(?m)\b%s\s*=\s*"([^"]*)"`
	groupEnvRe    = regexp.MustCompile(`"FLOODGATE_[A-Z0-9_]+_GROUP"`)
	tlsAddrsRe    = regexp.MustCompile(`\baddrs:\s*"FLOODGATE_[A-Z0-9_]+"`)
)

// loadProgram follows the program's imports inside the module (non-test files, every build
// tag) and reads the defaults of its listen addresses.
func loadProgram(t *testing.T, root, modPath, name, dir string) *program {
	t.Helper()
	p := &program{name: name, dir: dir, sources: map[string]string{}, own: map[string]string{}, listen: map[string]int{}}
	seen := map[string]bool{}
	queue := []string{dir}
	for len(queue) > 0 {
		d := queue[0]
		queue = queue[1:]
		if seen[d] {
			continue
		}
		seen[d] = true
		entries, err := os.ReadDir(filepath.Join(root, d))
		require.NoError(t, err, "package %s imported by %s", d, name)
		for _, e := range entries {
			if e.IsDir() || !isSource(e.Name()) {
				continue
			}
			path := filepath.Join(root, d, e.Name())
			src := readFile(t, path)
			// A TLSVars literal's addrs only names the address variable in
			// error hints (pkg/config): naming is not reading.
			p.sources[d+"/"+e.Name()] = tlsAddrsRe.ReplaceAllString(string(src), `addrs: ""`)
			f, err := parser.ParseFile(token.NewFileSet(), path, src, parser.ImportsOnly)
			require.NoError(t, err)
			for _, imp := range f.Imports {
				ip, _ := strconv.Unquote(imp.Path.Value)
				if sub, ok := strings.CutPrefix(ip, modPath+"/"); ok {
					queue = append(queue, sub)
				}
			}
		}
	}
	for path, src := range p.sources {
		if strings.HasPrefix(path, dir+"/") {
			p.own[path] = src
		}
	}
	for _, src := range p.own {
		if groupEnvRe.MatchString(src) {
			p.consumer = true
		}
		for _, mm := range addrDefaultRe.FindAllStringSubmatch(src, -1) {
			def := mm[2]
			if !strings.HasPrefix(def, `"`) { // a constant: find its value in the program's files
				ident := def[strings.LastIndex(def, ".")+1:]
				re := regexp.MustCompile(fmt.Sprintf(constRe, regexp.QuoteMeta(ident)))
				def = ""
				for _, s := range p.own {
					if c := re.FindStringSubmatch(s); c != nil {
						def = strconv.Quote(c[1])
					}
				}
				require.NotEmpty(t, def, "%s: default of %s (%s) not found", name, mm[1], mm[2])
			}
			addr, _ := strconv.Unquote(def)
			if addr == "" {
				continue // no default: the listener is off unless configured
			}
			_, port, err := net.SplitHostPort(addr)
			require.NoError(t, err, "%s: default of %s", name, mm[1])
			p.listen[mm[1]], err = strconv.Atoi(port)
			require.NoError(t, err)
		}
	}
	return p
}

// ---- Dockerfile ---------------------------------------------------------------------------

type dockerStage struct {
	name, from  string
	env         map[string]string
	expose      []int
	healthcheck string
	user        string
	entrypoint  string
	builds      []string // `go build` command lines
	copies      []string
}

type dockerfile struct {
	stages []*dockerStage
	args   map[string]string
}

func (d *dockerfile) stage(name string) *dockerStage {
	for _, s := range d.stages {
		if s.name == name {
			return s
		}
	}
	return nil
}

// chain returns the stage and the stages it is built FROM, nearest first.
func (d *dockerfile) chain(name string) []*dockerStage {
	var out []*dockerStage
	for s := d.stage(name); s != nil && len(out) < 20; s = d.stage(s.from) {
		out = append(out, s)
	}
	return out
}

var fromRe = regexp.MustCompile(`(?i)^FROM\s+(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?$`)

func parseDockerfile(t *testing.T, path string) *dockerfile {
	t.Helper()
	// Join continuation lines, drop comments.
	var lines []string
	var cur strings.Builder
	for _, l := range strings.Split(string(readFile(t, path)), "\n") {
		trimmed := strings.TrimSpace(l)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && cur.Len() == 0) {
			continue
		}
		if s, ok := strings.CutSuffix(trimmed, `\`); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(trimmed)
		lines = append(lines, cur.String())
		cur.Reset()
	}
	d := &dockerfile{args: map[string]string{}}
	var st *dockerStage
	for _, l := range lines {
		instr, rest, _ := strings.Cut(l, " ")
		rest = strings.TrimSpace(rest)
		switch strings.ToUpper(instr) {
		case "FROM":
			mm := fromRe.FindStringSubmatch(l)
			require.NotNil(t, mm, "bad FROM: %s", l)
			st = &dockerStage{name: mm[2], from: mm[1], env: map[string]string{}}
			d.stages = append(d.stages, st)
		case "ARG":
			k, v, _ := strings.Cut(rest, "=")
			if st == nil {
				d.args[k] = v
			}
		case "ENV":
			for _, kv := range strings.Fields(rest) {
				k, v, _ := strings.Cut(kv, "=")
				st.env[k] = v
			}
		case "EXPOSE":
			for _, p := range strings.Fields(rest) {
				n, err := strconv.Atoi(strings.TrimSuffix(p, "/tcp"))
				require.NoError(t, err, l)
				st.expose = append(st.expose, n)
			}
		case "HEALTHCHECK":
			st.healthcheck = rest
		case "USER":
			st.user = rest
		case "ENTRYPOINT":
			st.entrypoint = rest
		case "COPY":
			st.copies = append(st.copies, rest)
		case "RUN":
			if i := strings.Index(rest, "go build"); i >= 0 {
				st.builds = append(st.builds, rest[i:])
			}
		}
	}
	return d
}

// ---- docker-compose.yml -------------------------------------------------------------------

type composeService struct {
	Image string `yaml:"image"`
	Build *struct {
		Context    string `yaml:"context"`
		Dockerfile string `yaml:"dockerfile"`
		Target     string `yaml:"target"`
	} `yaml:"build"`
	Command     []string                 `yaml:"command"`
	Environment map[string]any           `yaml:"environment"`
	Ports       []string                 `yaml:"ports"`
	Volumes     []string                 `yaml:"volumes"`
	User        string                   `yaml:"user"`
	ReadOnly    bool                     `yaml:"read_only"`
	CapDrop     []string                 `yaml:"cap_drop"`
	Restart     string                   `yaml:"restart"`
	Healthcheck *struct{ Test []string } `yaml:"healthcheck"`
	DependsOn   map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
}

// setComposeEnv is a break for the drift tests: it sets variable key of compose service
// svc to value.
func setComposeEnv(svc, key, value string) func(*model) {
	return func(m *model) { m.compose.Services[svc].Environment[key] = value }
}

// unsetComposeEnv is a break for the drift tests: it removes variable key from compose
// service svc.
func unsetComposeEnv(svc, key string) func(*model) {
	return func(m *model) { delete(m.compose.Services[svc].Environment, key) }
}

func (s *composeService) env() map[string]string {
	out := map[string]string{}
	for k, v := range s.Environment {
		if v == nil {
			out[k] = ""
			continue
		}
		out[k] = fmt.Sprint(v)
	}
	return out
}

type composeFile struct {
	Services map[string]*composeService `yaml:"services"`
}

func parseCompose(t *testing.T, path string) *composeFile {
	t.Helper()
	var c composeFile
	require.NoError(t, yaml.Unmarshal(readFile(t, path), &c), path)
	require.NotEmpty(t, c.Services)
	return &c
}

// ---- Kubernetes ---------------------------------------------------------------------------

type intOrString struct {
	num int
	str string
}

func (v *intOrString) UnmarshalYAML(n *yaml.Node) error {
	if i, err := strconv.Atoi(n.Value); err == nil {
		v.num = i
		return nil
	}
	v.str = n.Value
	return nil
}

type securityContext struct {
	RunAsNonRoot             *bool  `yaml:"runAsNonRoot"`
	RunAsUser                *int64 `yaml:"runAsUser"`
	ReadOnlyRootFilesystem   *bool  `yaml:"readOnlyRootFilesystem"`
	AllowPrivilegeEscalation *bool  `yaml:"allowPrivilegeEscalation"`
	Capabilities             *struct {
		Drop []string `yaml:"drop"`
		Add  []string `yaml:"add"`
	} `yaml:"capabilities"`
}

type keyRef struct {
	Name string `yaml:"name"`
	Key  string `yaml:"key"`
}

type envVar struct {
	Name      string `yaml:"name"`
	Value     string `yaml:"value"`
	ValueFrom *struct {
		ConfigMapKeyRef *keyRef `yaml:"configMapKeyRef"`
		SecretKeyRef    *keyRef `yaml:"secretKeyRef"`
		FieldRef        *struct {
			FieldPath string `yaml:"fieldPath"`
		} `yaml:"fieldRef"`
	} `yaml:"valueFrom"`
}

type probe struct {
	HTTPGet *struct {
		Path string      `yaml:"path"`
		Port intOrString `yaml:"port"`
	} `yaml:"httpGet"`
}

type container struct {
	Name  string   `yaml:"name"`
	Image string   `yaml:"image"`
	Args  []string `yaml:"args"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	Env            []envVar `yaml:"env"`
	ReadinessProbe *probe   `yaml:"readinessProbe"`
	LivenessProbe  *probe   `yaml:"livenessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext *securityContext `yaml:"securityContext"`
	Lifecycle       *struct {
		PreStop *struct {
			Sleep *struct {
				Seconds int `yaml:"seconds"`
			} `yaml:"sleep"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

// port resolves a probe's or Service's port (a number or a container port's name).
func (c *container) port(p intOrString) int {
	if p.str == "" {
		return p.num
	}
	for _, cp := range c.Ports {
		if cp.Name == p.str {
			return cp.ContainerPort
		}
	}
	return 0
}

type labelSelector struct {
	MatchLabels      map[string]string `yaml:"matchLabels"`
	MatchExpressions []struct {
		Key      string   `yaml:"key"`
		Operator string   `yaml:"operator"`
		Values   []string `yaml:"values"`
	} `yaml:"matchExpressions"`
}

// matches reports whether the selector selects labels (an empty selector selects all).
func (s *labelSelector) matches(labels map[string]string) bool {
	if s == nil {
		return true
	}
	for k, v := range s.MatchLabels {
		if labels[k] != v {
			return false
		}
	}
	for _, e := range s.MatchExpressions {
		v, ok := labels[e.Key]
		switch e.Operator {
		case "In":
			if !ok || !slices.Contains(e.Values, v) {
				return false
			}
		case "NotIn":
			if ok && slices.Contains(e.Values, v) {
				return false
			}
		case "Exists":
			if !ok {
				return false
			}
		case "DoesNotExist":
			if ok {
				return false
			}
		default:
			return false
		}
	}
	return true
}

type podSpec struct {
	ServiceAccountName            string           `yaml:"serviceAccountName"`
	TerminationGracePeriodSeconds *int             `yaml:"terminationGracePeriodSeconds"`
	SecurityContext               *securityContext `yaml:"securityContext"`
	Containers                    []container      `yaml:"containers"`
	InitContainers                []container      `yaml:"initContainers"`
	Volumes                       []struct {
		Name   string `yaml:"name"`
		Secret *struct {
			SecretName string `yaml:"secretName"`
		} `yaml:"secret"`
		ConfigMap *struct {
			Name string `yaml:"name"`
		} `yaml:"configMap"`
	} `yaml:"volumes"`
}

type k8sObject struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name        string            `yaml:"name"`
		Namespace   string            `yaml:"namespace"`
		Labels      map[string]string `yaml:"labels"`
		Annotations map[string]string `yaml:"annotations"`
	} `yaml:"metadata"`
	Spec struct {
		// Deployment, Job
		Replicas *int      `yaml:"replicas"`
		Selector yaml.Node `yaml:"selector"` // a labelSelector, or a map on a Service
		Template *struct {
			Metadata struct {
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"metadata"`
			Spec podSpec `yaml:"spec"`
		} `yaml:"template"`
		// Service
		Ports []struct {
			Name       string      `yaml:"name"`
			Port       int         `yaml:"port"`
			TargetPort intOrString `yaml:"targetPort"`
		} `yaml:"ports"`
		// HorizontalPodAutoscaler
		ScaleTargetRef *struct {
			Kind string `yaml:"kind"`
			Name string `yaml:"name"`
		} `yaml:"scaleTargetRef"`
		MinReplicas *int `yaml:"minReplicas"`
		MaxReplicas int  `yaml:"maxReplicas"`
		// PodDisruptionBudget
		MinAvailable   *intOrString `yaml:"minAvailable"`
		MaxUnavailable *intOrString `yaml:"maxUnavailable"`
		// NetworkPolicy
		PodSelector *labelSelector `yaml:"podSelector"`
		PolicyTypes []string       `yaml:"policyTypes"`
		Ingress     []netRule      `yaml:"ingress"`
		Egress      []netRule      `yaml:"egress"`
		// ServiceMonitor, PodMonitor (monitoring.coreos.com/v1)
		Endpoints           []scrapeEndpoint `yaml:"endpoints"`
		PodMetricsEndpoints []scrapeEndpoint `yaml:"podMetricsEndpoints"`
		NamespaceSelector   yaml.Node        `yaml:"namespaceSelector"`
	} `yaml:"spec"`
	Data map[string]string `yaml:"data"` // a ConfigMap's, or a Secret's base64-encoded (values)
	raw  map[string]any    // the whole document, for comparing what the fields above leave out
}

type scrapeEndpoint struct {
	Port          string `yaml:"port"`
	Path          string `yaml:"path"`
	Interval      string `yaml:"interval"`
	ScrapeTimeout string `yaml:"scrapeTimeout"`
}

type netRule struct {
	Ports []struct {
		Protocol string      `yaml:"protocol"`
		Port     intOrString `yaml:"port"`
	} `yaml:"ports"`
	From []any `yaml:"from"`
	To   []any `yaml:"to"`
}

// allows reports whether the rule admits TCP port (no ports = every port).
func (r netRule) allows(port int) bool {
	if len(r.Ports) == 0 {
		return true
	}
	for _, p := range r.Ports {
		if (p.Protocol == "" || p.Protocol == "TCP") && p.Port.num == port {
			return true
		}
	}
	return false
}

func (o *k8sObject) labelSelector() *labelSelector {
	var s labelSelector
	if o.Spec.Selector.Kind == 0 {
		return nil
	}
	_ = o.Spec.Selector.Decode(&s)
	return &s
}

func (o *k8sObject) serviceSelector() map[string]string {
	var s map[string]string
	_ = o.Spec.Selector.Decode(&s)
	return s
}

// ---- Grafana and Prometheus ----------------------------------------------------------------

type dashboard struct {
	UID    string  `json:"uid"`
	Title  string  `json:"title"`
	Panels []panel `json:"panels"`
}

type panel struct {
	Type    string  `json:"type"`
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"` // collapsed rows
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

type promConfig struct {
	ScrapeConfigs []struct {
		JobName       string `yaml:"job_name"`
		StaticConfigs []struct {
			Targets []string `yaml:"targets"`
		} `yaml:"static_configs"`
	} `yaml:"scrape_configs"`
}

type grafanaProvisioning struct {
	Providers []struct {
		Options struct {
			Path string `yaml:"path"`
		} `yaml:"options"`
	} `yaml:"providers"`
}

// ---- checks -------------------------------------------------------------------------------

type check struct {
	name string
	run  func(m *model) []string
}

var checks = []check{
	{"dockerfile", checkDockerfile},
	{"compose", checkCompose},
	{"k8s-workloads", checkWorkloads},
	{"k8s-services-and-probes", checkServices},
	{"k8s-consumers", checkConsumers},
	{"k8s-autoscaling-and-disruption", checkScaling},
	{"k8s-variants", checkVariants},
	{"k8s-config-and-secrets", checkConfig},
	{"k8s-network-policies", checkNetworkPolicies},
	{"k8s-overlay", checkOverlay},
	{"k8s-monitoring", checkMonitoring},
	{"grafana", checkGrafana},
	{"alerts", checkAlerts},
	{"docs", checkDocs},
}

func TestPackaging(t *testing.T) {
	m := loadModel(t)
	require.Contains(t, m.programs, "limiter")
	runChecks(t, m, checks)
}

// runChecks runs each check on m as a subtest that fails with every
// problem the check found.
func runChecks(t *testing.T, m *model, checks []check) {
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			problems := c.run(m)
			require.Empty(t, problems, "\n%s", strings.Join(problems, "\n"))
		})
	}
}

// servicePrograms are the long-running programs (not the migrate one-shot), sorted.
func (m *model) servicePrograms() []*program {
	var out []*program
	for _, p := range m.programs {
		if p.name != "migrate" {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

func (m *model) sortedPrograms() []*program {
	out := append(m.servicePrograms(), m.programs["migrate"])
	return out
}

// checkEnv reports variables the program does not read, and topic values migrations/ lacks.
func (m *model) checkEnv(where string, p *program, env map[string]string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if !strings.HasPrefix(k, "FLOODGATE_") {
			continue
		}
		if !p.reads(k) {
			out = append(out, fmt.Sprintf("%s: %s is set but %s (%s and its imports) never reads it", where, k, p.name, p.dir))
		}
		if strings.HasSuffix(k, "_TOPIC") {
			if _, ok := m.partitions[env[k]]; !ok {
				out = append(out, fmt.Sprintf("%s: %s=%q is not a topic in migrations/", where, k, env[k]))
			}
		}
	}
	return out
}

// connVars are the endpoints whose defaults are loopback addresses: a program in a container
// that reads one must have it set. The value is the migrate -only backend that needs it.
var connVars = map[string]string{
	"FLOODGATE_KAFKA_BROKERS":     "kafka",
	"FLOODGATE_REDIS_ADDRS":       "redis",
	"FLOODGATE_INFLUX_URL":        "influxdb",
	"FLOODGATE_DYNAMODB_ENDPOINT": "dynamodb",
}

// checkConnections reports endpoints the program reads but env leaves at their loopback default.
func checkConnections(where string, p *program, env map[string]string, args []string) []string {
	var out []string
	only := ""
	for i, a := range args {
		if a == "-only" && i+1 < len(args) {
			only = "," + args[i+1] + ","
		}
	}
	for _, k := range slices.Sorted(maps.Keys(connVars)) {
		if _, set := env[k]; set || !p.reads(k) {
			continue
		}
		if only != "" && !strings.Contains(only, ","+connVars[k]+",") {
			continue // migrate -only without this backend
		}
		out = append(out, fmt.Sprintf("%s: %s reads %s but it is not set (its default is loopback, or AWS for DynamoDB)", where, p.name, k))
	}
	return out
}

// listenPort checks the program's *_ADDR in env: it listens on all interfaces at the port of
// its local default. It returns the primary (HTTP: health, metrics) port, the one of the
// shortest variable name (FLOODGATE_LIMITER_ADDR rather than FLOODGATE_LIMITER_GRPC_ADDR);
// 0 when there is none. listenPorts lists every port set.
func (m *model) listenPort(where string, p *program, env map[string]string) (int, []string) {
	var out []string
	port, primary := 0, ""
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if !strings.HasSuffix(k, "_ADDR") || !strings.HasPrefix(k, "FLOODGATE_") {
			continue
		}
		def, ok := p.listen[k]
		if !ok {
			out = append(out, fmt.Sprintf("%s: %s is not a listen address %s has a default for", where, k, p.name))
			continue
		}
		host, ps, err := net.SplitHostPort(env[k])
		n, _ := strconv.Atoi(ps)
		switch {
		case err != nil:
			out = append(out, fmt.Sprintf("%s: %s=%q is not host:port", where, k, env[k]))
		case host != "0.0.0.0" && host != "" && host != "::":
			out = append(out, fmt.Sprintf("%s: %s=%q must listen on all interfaces in a container", where, k, env[k]))
		case n != def:
			out = append(out, fmt.Sprintf("%s: %s port %d differs from the code's default %d", where, k, n, def))
		}
		if primary == "" || len(k) < len(primary) {
			port, primary = n, k
		}
	}
	if port == 0 && len(p.listen) > 0 {
		out = append(out, fmt.Sprintf("%s: %s listens on 127.0.0.1 by default; set one of %v to 0.0.0.0:<port>", where, p.name, slices.Sorted(maps.Keys(p.listen))))
	}
	return port, out
}

// listenPorts are the ports of every listen address the program has a default for in env.
func (m *model) listenPorts(p *program, env map[string]string) []int {
	var out []int
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if _, ok := p.listen[k]; !ok {
			continue
		}
		if _, ps, err := net.SplitHostPort(env[k]); err == nil {
			if n, err := strconv.Atoi(ps); err == nil && !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
	}
	sort.Ints(out)
	return out
}

var urlPortRe = regexp.MustCompile(`https?://127\.0\.0\.1:(\d+)/(\w+)`)

func checkDockerfile(m *model) []string {
	var out []string
	d := m.docker
	known := map[string]bool{"deps": true, "build": true, "runtime": true}
	for _, p := range m.sortedPrograms() {
		known[p.name] = true
		st := d.stage(p.name)
		if st == nil {
			out = append(out, fmt.Sprintf("Dockerfile: no final stage %q for %s", p.name, p.dir))
			continue
		}
		bin := "/usr/local/bin/" + p.name
		if !strings.Contains(st.entrypoint, `"`+bin+`"`) {
			out = append(out, fmt.Sprintf("Dockerfile %s: ENTRYPOINT %s does not run %s", p.name, st.entrypoint, bin))
		}
		if !slices.ContainsFunc(st.copies, func(c string) bool { return strings.HasPrefix(c, "--from=build /out/"+p.name+" ") }) {
			out = append(out, fmt.Sprintf("Dockerfile %s: does not copy its binary /out/%s from stage build", p.name, p.name))
		}
		// One `go build -o /out/` in stage build names every program's package; go names each
		// binary after its package's directory, which is the program's name.
		if b := d.stage("build"); b == nil || len(b.builds) != 1 || !strings.Contains(b.builds[0], " -o /out/ ") ||
			!slices.Contains(strings.Fields(b.builds[0]), "./"+p.dir) || filepath.Base(p.dir) != p.name {
			out = append(out, fmt.Sprintf("Dockerfile: stage build must `go build -o /out/ ... ./%s` (binary %s)", p.dir, p.name))
		}
		// Non-root: the nearest USER in the stage chain is 65532.
		user, base := "", ""
		for _, s := range d.chain(p.name) {
			if user == "" {
				user = s.user
			}
			base = s.from
		}
		if user != fmt.Sprintf("%d:%d", nonRootUID, nonRootUID) {
			out = append(out, fmt.Sprintf("Dockerfile %s: runs as %q, want %d:%d", p.name, user, nonRootUID, nonRootUID))
		}
		if base = strings.Trim(base, "${}"); !strings.Contains(d.args[base]+base, "distroless/static") && base != "scratch" {
			out = append(out, fmt.Sprintf("Dockerfile %s: final image %q is not distroless static or scratch", p.name, base))
		}
		port, problems := m.listenPort("Dockerfile "+p.name, p, st.env)
		out = append(out, problems...)
		out = append(out, m.checkEnv("Dockerfile "+p.name, p, st.env)...)
		if port == 0 {
			continue
		}
		for _, lp := range m.listenPorts(p, st.env) {
			if !slices.Contains(st.expose, lp) {
				out = append(out, fmt.Sprintf("Dockerfile %s: EXPOSE %v lacks its port %d", p.name, st.expose, lp))
			}
		}
		if mm := urlPortRe.FindStringSubmatch(st.healthcheck); mm == nil || mm[1] != strconv.Itoa(port) || mm[2] != "healthz" {
			out = append(out, fmt.Sprintf("Dockerfile %s: HEALTHCHECK %q must probe http://127.0.0.1:%d/healthz", p.name, st.healthcheck, port))
		}
	}
	for _, s := range d.stages {
		if !known[s.name] {
			out = append(out, fmt.Sprintf("Dockerfile: stage %q matches no program (services/*/main.go, migrate)", s.name))
		}
		for _, b := range s.builds {
			for _, flag := range []string{"-trimpath", `-ldflags="-s -w"`} {
				if !strings.Contains(b, flag) {
					out = append(out, fmt.Sprintf("Dockerfile %s: %q lacks %s", s.name, b, flag))
				}
			}
		}
	}
	if dep := d.stage("deps"); dep == nil || dep.env["CGO_ENABLED"] != "0" {
		out = append(out, "Dockerfile: the deps stage must set CGO_ENABLED=0 (static binaries)")
	}
	return out
}

func checkCompose(m *model) []string {
	var out []string
	c := m.compose
	scraped := map[string]bool{}
	for _, sc := range m.prometheus.ScrapeConfigs {
		for _, s := range sc.StaticConfigs {
			for _, tg := range s.Targets {
				scraped[tg] = true
			}
		}
	}
	for _, p := range m.sortedPrograms() {
		s := c.Services[p.name]
		where := "compose " + p.name
		if s == nil {
			out = append(out, fmt.Sprintf("compose: no service %q for %s", p.name, p.dir))
			continue
		}
		if s.Build == nil || s.Build.Target != p.name || s.Build.Dockerfile != "deploy/docker/Dockerfile" || s.Build.Context != ".." {
			out = append(out, fmt.Sprintf("%s: must build deploy/docker/Dockerfile --target %s from context ..", where, p.name))
		}
		if s.User != fmt.Sprintf("%d:%d", nonRootUID, nonRootUID) || !s.ReadOnly || !slices.Contains(s.CapDrop, "ALL") {
			out = append(out, fmt.Sprintf("%s: must run as %d:%d, read_only, cap_drop ALL", where, nonRootUID, nonRootUID))
		}
		env := s.env()
		out = append(out, m.checkEnv(where, p, env)...)
		out = append(out, checkConnections(where, p, env, s.Command)...)
		for _, k := range []string{"FLOODGATE_KAFKA_BROKERS", "FLOODGATE_REDIS_ADDRS", "FLOODGATE_INFLUX_URL", "FLOODGATE_DYNAMODB_ENDPOINT"} {
			for _, hp := range endpoints(env[k]) {
				if c.Services[hp.host] == nil {
					out = append(out, fmt.Sprintf("%s: %s points at %q, which is no compose service", where, k, hp.host))
				}
			}
		}
		if p.name == "migrate" {
			if s.Restart != "no" {
				out = append(out, "compose migrate: a one-shot must have restart: \"no\"")
			}
			continue
		}
		if dep, ok := s.DependsOn["migrate"]; !ok || dep.Condition != "service_completed_successfully" {
			out = append(out, fmt.Sprintf("%s: must depend on migrate with condition service_completed_successfully", where))
		}
		port, problems := m.listenPort(where, p, env)
		out = append(out, problems...)
		if port == 0 {
			continue
		}
		if s.Healthcheck == nil || len(s.Healthcheck.Test) < 2 {
			out = append(out, fmt.Sprintf("%s: no healthcheck", where))
		} else if mm := urlPortRe.FindStringSubmatch(strings.Join(s.Healthcheck.Test, " ")); mm == nil || mm[1] != strconv.Itoa(port) {
			out = append(out, fmt.Sprintf("%s: healthcheck %v does not probe its port %d", where, s.Healthcheck.Test, port))
		}
		if !scraped[fmt.Sprintf("%s:%d", p.name, port)] {
			out = append(out, fmt.Sprintf("deploy/grafana/prometheus.yml: no scrape target %s:%d", p.name, port))
		}
	}
	for tg := range scraped {
		host, ps, _ := net.SplitHostPort(tg)
		p, ok := m.programs[host]
		if !ok || c.Services[host] == nil {
			out = append(out, fmt.Sprintf("deploy/grafana/prometheus.yml: target %s is no Floodgate service", tg))
			continue
		}
		if port, _ := m.listenPort("", p, c.Services[host].env()); strconv.Itoa(port) != ps {
			out = append(out, fmt.Sprintf("deploy/grafana/prometheus.yml: target %s, but %s listens on %d", tg, host, port))
		}
	}
	for name, s := range c.Services {
		if s.Build != nil && m.programs[name] == nil {
			out = append(out, fmt.Sprintf("compose: service %q builds an image but matches no program", name))
		}
	}
	if k := c.Services["kafka"]; k == nil || fmt.Sprint(k.Environment["KAFKA_AUTO_CREATE_TOPICS_ENABLE"]) != "false" ||
		!strings.Contains(fmt.Sprint(k.Environment["KAFKA_PROCESS_ROLES"]), "controller") {
		out = append(out, "compose kafka: must run KRaft (KAFKA_PROCESS_ROLES with controller) with KAFKA_AUTO_CREATE_TOPICS_ENABLE=false")
	}
	if ix := c.Services["influxdb"]; ix != nil {
		ienv := ix.env()
		for name, s := range c.Services {
			env := s.env()
			if b, ok := env["FLOODGATE_INFLUX_BUCKET"]; ok && b != ienv["DOCKER_INFLUXDB_INIT_BUCKET"] {
				out = append(out, fmt.Sprintf("compose %s: FLOODGATE_INFLUX_BUCKET=%q but InfluxDB 2 is set up with bucket %q", name, b, ienv["DOCKER_INFLUXDB_INIT_BUCKET"]))
			}
			if tok, ok := env["FLOODGATE_INFLUX_TOKEN"]; ok && tok != ienv["DOCKER_INFLUXDB_INIT_ADMIN_TOKEN"] {
				out = append(out, fmt.Sprintf("compose %s: FLOODGATE_INFLUX_TOKEN differs from InfluxDB's DOCKER_INFLUXDB_INIT_ADMIN_TOKEN", name))
			}
		}
	} else {
		out = append(out, "compose: no influxdb service")
	}
	if g := c.Services["grafana"]; g == nil || len(m.grafana.Providers) == 0 ||
		!slices.ContainsFunc(g.Volumes, func(v string) bool { return strings.HasSuffix(v, ":"+m.grafana.Providers[0].Options.Path+":ro") }) {
		out = append(out, "compose grafana: must mount deploy/grafana/dashboards at the provisioning provider's path")
	}
	return out
}

type hostPort struct {
	host string
	port int
}

// endpoints parses a comma-separated list of host:port or URLs (https without a port = 443).
func endpoints(v string) []hostPort {
	var out []hostPort
	for _, item := range strings.Split(v, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if u, err := url.Parse(item); err == nil && u.Scheme != "" && u.Host != "" {
			port, _ := strconv.Atoi(u.Port())
			if port == 0 && u.Scheme == "https" {
				port = 443
			} else if port == 0 {
				port = 80
			}
			out = append(out, hostPort{u.Hostname(), port})
			continue
		}
		if h, p, err := net.SplitHostPort(item); err == nil {
			port, _ := strconv.Atoi(p)
			out = append(out, hostPort{h, port})
		}
	}
	return out
}

// workload is a Deployment or the migrate Job with its program. Most are named after their
// program; a variant (the CRITICAL limiter, limiter-critical) runs the program under
// another name, in a container named after the program.
type workload struct {
	obj  *k8sObject
	prog *program
}

func (w workload) name() string { return w.obj.Metadata.Name }

// variant reports whether the workload runs its program under a name of its own.
func (w workload) variant() bool { return w.name() != w.prog.name }

func (w workload) pod() *podSpec { return &w.obj.Spec.Template.Spec }

// labels are the labels of w's pods.
func (w workload) labels() map[string]string { return w.obj.Spec.Template.Metadata.Labels }

func (w workload) main() *container {
	for i := range w.pod().Containers {
		if w.pod().Containers[i].Name == w.prog.name {
			return &w.pod().Containers[i]
		}
	}
	return nil
}

// programOf is the program a Deployment or Job runs: the one it is named after, else the one
// a container of it is named after; nil for neither.
func (m *model) programOf(o *k8sObject) *program {
	if o == nil || o.Spec.Template == nil {
		return nil
	}
	if p := m.programs[o.Metadata.Name]; p != nil {
		return p
	}
	for _, c := range o.Spec.Template.Spec.Containers {
		if p := m.programs[c.Name]; p != nil {
			return p
		}
	}
	return nil
}

// workloads are k's Deployments of the services and its migrate Job, by program (migrate
// last), each program's own Deployment before its variants.
func (m *model) workloads(k *rendered) []workload {
	var out []workload
	for _, kind := range []string{"Deployment", "Job"} {
		for _, o := range k.kind(kind) {
			if p := m.programOf(o); p != nil && (p.name == "migrate") == (kind == "Job") {
				out = append(out, workload{o, p})
			}
		}
	}
	bit := func(b bool) int {
		if b {
			return 1
		}
		return 0
	}
	slices.SortFunc(out, func(a, b workload) int {
		return cmp.Or(
			cmp.Compare(bit(a.prog.name == "migrate"), bit(b.prog.name == "migrate")),
			cmp.Compare(a.prog.name, b.prog.name),
			cmp.Compare(bit(a.variant()), bit(b.variant())),
			cmp.Compare(a.name(), b.name()))
	})
	return out
}

// own is the Deployment (the Job for migrate) of k named after w's program.
func (m *model) own(k *rendered, w workload) *workload {
	for _, o := range m.workloads(k) {
		if o.prog == w.prog && !o.variant() {
			return &o
		}
	}
	return nil
}

// renders are what a cluster receives from the base and from the production overlay; most
// checks hold both.
func (m *model) renders() []*rendered { return []*rendered{m.base, m.overlay} }

// eachRender is check's problems in the base and in the overlay.
func (m *model) eachRender(check func(*rendered) []string) []string {
	var out []string
	for _, k := range m.renders() {
		out = append(out, check(k)...)
	}
	return out
}

// splitImage splits an image reference into its repository and its tag or digest.
func splitImage(image string) (repo, version string) {
	if r, d, ok := strings.Cut(image, "@"); ok {
		return r, d
	}
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		return image[:i], image[i+1:]
	}
	return image, ""
}

func checkWorkloads(m *model) []string {
	out := m.eachRender(m.checkWorkloadsOf)
	if s := m.compose.Services["migrate"]; s != nil {
		out = append(out, checkMigrateArgs("compose migrate", m.programs["migrate"], s.Command)...)
	}
	return out
}

// hostAgents are the DaemonSets that run no program of this repository: Telegraf
// (deploy/telegraf), which TestTelegrafPackaging checks.
var hostAgents = map[string]bool{"telegraf": true}

func (m *model) checkWorkloadsOf(k *rendered) []string {
	var out []string
	for _, p := range m.sortedPrograms() {
		kind := "Deployment"
		if p.name == "migrate" {
			kind = "Job"
		}
		if o := k.find(kind, p.name); o == nil || o.Spec.Template == nil {
			out = append(out, fmt.Sprintf("%s: no %s %q for %s", k.where, kind, p.name, p.dir))
		}
	}
	for _, kind := range []string{"Deployment", "Job", "StatefulSet", "DaemonSet"} {
		for _, o := range k.kind(kind) {
			if m.programOf(o) == nil && !(kind == "DaemonSet" && hostAgents[o.Metadata.Name]) {
				out = append(out, fmt.Sprintf("%s %s %q: matches no program (by its name or a container's)", k.where, kind, o.Metadata.Name))
			}
		}
	}
	for _, sa := range k.kind("ServiceAccount") {
		if m.programs[sa.Metadata.Name] == nil {
			out = append(out, fmt.Sprintf("%s ServiceAccount %s: is no program's ServiceAccount", k.where, sa.Metadata.Name))
		}
	}
	for _, w := range m.workloads(k) {
		where := fmt.Sprintf("%s %s %s", k.where, w.obj.Kind, w.name())
		pod := w.pod()
		c := w.main()
		if c == nil {
			out = append(out, fmt.Sprintf("%s: no container named %s", where, w.prog.name))
			continue
		}
		// The kustomization's images give every image its tag (the base) or its registry too.
		if repo, version := splitImage(c.Image); (repo != "floodgate/"+w.prog.name && !strings.HasSuffix(repo, "/floodgate/"+w.prog.name)) || version == "" {
			out = append(out, fmt.Sprintf("%s: image %q, want floodgate/%s with the tag the kustomization's images give it", where, c.Image, w.prog.name))
		}
		if sel := w.obj.labelSelector(); w.obj.Kind == "Deployment" && (sel == nil || !sel.matches(w.labels())) {
			out = append(out, fmt.Sprintf("%s: selector does not match its pod labels", where))
		}
		if pod.ServiceAccountName != w.prog.name || k.find("ServiceAccount", w.prog.name) == nil {
			out = append(out, fmt.Sprintf("%s: must run as its own ServiceAccount %q", where, w.prog.name))
		}
		ps := pod.SecurityContext
		if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.RunAsUser == nil || *ps.RunAsUser == 0 {
			out = append(out, fmt.Sprintf("%s: pod securityContext must set runAsNonRoot: true and a non-zero runAsUser", where))
		}
		for _, ct := range append(slices.Clone(pod.Containers), pod.InitContainers...) {
			s := ct.SecurityContext
			if s == nil || s.ReadOnlyRootFilesystem == nil || !*s.ReadOnlyRootFilesystem ||
				s.AllowPrivilegeEscalation == nil || *s.AllowPrivilegeEscalation ||
				s.Capabilities == nil || !slices.Contains(s.Capabilities.Drop, "ALL") || len(s.Capabilities.Add) > 0 ||
				(s.RunAsUser != nil && *s.RunAsUser == 0) || (s.RunAsNonRoot != nil && !*s.RunAsNonRoot) {
				out = append(out, fmt.Sprintf("%s container %s: needs readOnlyRootFilesystem, no privilege escalation, drop ALL capabilities, non-root", where, ct.Name))
			}
			if ct.Resources.Requests["cpu"] == "" || ct.Resources.Requests["memory"] == "" || ct.Resources.Limits["memory"] == "" {
				out = append(out, fmt.Sprintf("%s container %s: needs cpu and memory requests and a memory limit", where, ct.Name))
			}
		}
		env := k.env(w)
		out = append(out, m.checkEnv(where, w.prog, env)...)
		out = append(out, checkConnections(where, w.prog, env, c.Args)...)
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.FieldRef == nil && e.ValueFrom.ConfigMapKeyRef == nil && e.ValueFrom.SecretKeyRef == nil {
				out = append(out, fmt.Sprintf("%s: %s has an empty valueFrom", where, e.Name))
			}
		}
		// Shutdown: the grace period covers preStop plus the drain budget.
		if d, err := time.ParseDuration(env["FLOODGATE_SHUTDOWN_TIMEOUT"]); err == nil && w.obj.Kind == "Deployment" {
			grace := 30
			if pod.TerminationGracePeriodSeconds != nil {
				grace = *pod.TerminationGracePeriodSeconds
			}
			pre := 0
			if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
				pre = c.Lifecycle.PreStop.Sleep.Seconds
			}
			if time.Duration(grace)*time.Second <= d+time.Duration(pre)*time.Second {
				out = append(out, fmt.Sprintf("%s: terminationGracePeriodSeconds %d does not cover preStop %ds + FLOODGATE_SHUTDOWN_TIMEOUT %s", where, grace, pre, d))
			}
		}
		if w.prog.name == "migrate" {
			out = append(out, checkMigrateArgs(where, w.prog, c.Args)...)
		}
	}
	return out
}

// checkMigrateArgs: the flags exist in the migrate command and -only names its backends.
func checkMigrateArgs(where string, migrate *program, args []string) []string {
	var out []string
	for i, a := range args {
		if !strings.HasPrefix(a, "-") {
			continue
		}
		flag := strings.TrimLeft(a, "-")
		if !migrate.ownHas(`fs.Duration("`+flag+`"`) && !migrate.ownHas(`fs.String("`+flag+`"`) {
			out = append(out, fmt.Sprintf("%s: flag %s is not defined by %s", where, a, migrate.dir))
		}
		if flag == "only" && i+1 < len(args) {
			for _, b := range strings.Split(args[i+1], ",") {
				if !migrate.ownHas(`"` + b + `"`) {
					out = append(out, fmt.Sprintf("%s: -only %s is not a backend of %s", where, b, migrate.dir))
				}
			}
		}
	}
	return out
}

// selectsPods reports whether a Service's selector takes pods with labels.
func selectsPods(svc *k8sObject, labels map[string]string) bool {
	sel := svc.serviceSelector()
	return len(sel) > 0 && (&labelSelector{MatchLabels: sel}).matches(labels)
}

func checkServices(m *model) []string { return m.eachRender(m.checkServicesOf) }

func (m *model) checkServicesOf(k *rendered) []string {
	var out []string
	for _, w := range m.workloads(k) {
		if w.obj.Kind != "Deployment" {
			continue
		}
		where := fmt.Sprintf("%s Deployment %s", k.where, w.name())
		c := w.main()
		if c == nil {
			continue
		}
		env := k.env(w)
		port, problems := m.listenPort(where, w.prog, env)
		out = append(out, problems...)
		if port == 0 {
			continue
		}
		ports := m.listenPorts(w.prog, env)
		for _, lp := range ports {
			if !slices.ContainsFunc(c.Ports, func(p struct {
				Name          string `yaml:"name"`
				ContainerPort int    `yaml:"containerPort"`
			}) bool {
				return p.ContainerPort == lp
			}) {
				out = append(out, fmt.Sprintf("%s: containerPort %d (its *_ADDR) is not declared", where, lp))
			}
		}
		for _, pr := range []struct {
			name, path string
			p          *probe
		}{{"readinessProbe", "/readyz", c.ReadinessProbe}, {"livenessProbe", "/healthz", c.LivenessProbe}} {
			if pr.p == nil || pr.p.HTTPGet == nil || pr.p.HTTPGet.Path != pr.path || c.port(pr.p.HTTPGet.Port) != port {
				out = append(out, fmt.Sprintf("%s: %s must GET %s on port %d", where, pr.name, pr.path, port))
			}
		}
		if got := w.obj.Spec.Template.Metadata.Annotations["prometheus.io/port"]; got != strconv.Itoa(port) {
			out = append(out, fmt.Sprintf("%s: prometheus.io/port %q, want %d", where, got, port))
		}
		var svc *k8sObject
		for _, s := range k.kind("Service") {
			if selectsPods(s, w.labels()) {
				svc = s
			}
		}
		if svc == nil {
			out = append(out, fmt.Sprintf("%s: no Service selects its pods", where))
			continue
		}
		for _, sp := range svc.Spec.Ports {
			if got := c.port(sp.TargetPort); !slices.Contains(ports, got) {
				out = append(out, fmt.Sprintf("%s Service %s: port %s targets %d, but %s listens on %s", k.where, svc.Metadata.Name, sp.Name, got, w.name(), strings.Trim(fmt.Sprint(ports), "[]")))
			}
		}
	}
	for _, s := range k.kind("Service") {
		if !slices.ContainsFunc(m.workloads(k), func(w workload) bool { return selectsPods(s, w.labels()) }) {
			out = append(out, fmt.Sprintf("%s Service %s: selects no workload", k.where, s.Metadata.Name))
		}
	}
	return out
}

// consumed lists the topics in a Deployment's floodgate.dev/consumes annotation.
func consumed(o *k8sObject) []string {
	var out []string
	for _, s := range strings.Split(o.Metadata.Annotations[consumesAnno], ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// maxConsumers is the most members a group can use: the fewest partitions among the topics.
func (m *model) maxConsumers(where string, topics []string) (int, []string) {
	var out []string
	limit := 0
	for _, tp := range topics {
		n, ok := m.partitions[tp]
		if !ok {
			out = append(out, fmt.Sprintf("%s: consumes %q, which is not a topic in migrations/", where, tp))
			continue
		}
		if limit == 0 || n < limit {
			limit = n
		}
	}
	return limit, out
}

func checkConsumers(m *model) []string {
	var out []string
	for _, k := range m.renders() {
		for _, w := range m.workloads(k) {
			if w.obj.Kind != "Deployment" {
				continue
			}
			where := fmt.Sprintf("%s Deployment %s", k.where, w.name())
			topics := consumed(w.obj)
			if w.prog.consumer && len(topics) == 0 {
				out = append(out, fmt.Sprintf("%s: %s joins a consumer group (reads a FLOODGATE_*_GROUP) but has no %s annotation", where, w.prog.name, consumesAnno))
			}
			if len(topics) == 0 {
				continue
			}
			limit, problems := m.maxConsumers(where, topics)
			out = append(out, problems...)
			replicas := 1
			if w.obj.Spec.Replicas != nil {
				replicas = *w.obj.Spec.Replicas
			}
			if limit > 0 && replicas > limit {
				out = append(out, fmt.Sprintf("%s: %d replicas, but %v has only %d partitions", where, replicas, topics, limit))
			}
			if h := k.autoscaler(w.name()); h != nil && limit > 0 && h.Spec.MaxReplicas > limit {
				out = append(out, fmt.Sprintf("%s HorizontalPodAutoscaler %s: maxReplicas %d exceeds the %d partitions of %v", k.where, h.Metadata.Name, h.Spec.MaxReplicas, limit, topics))
			}
		}
	}
	return out
}

// autoscaler is the HorizontalPodAutoscaler of k that scales Deployment name, or nil.
func (k *rendered) autoscaler(name string) *k8sObject {
	for _, h := range k.kind("HorizontalPodAutoscaler") {
		if t := h.Spec.ScaleTargetRef; t != nil && t.Kind == "Deployment" && t.Name == name {
			return h
		}
	}
	return nil
}

func checkScaling(m *model) []string { return m.eachRender(m.checkScalingOf) }

func (m *model) checkScalingOf(k *rendered) []string {
	var out []string
	// The limiter scales on CPU: each of its Deployments (its own, the CRITICAL one) has an HPA.
	for _, w := range m.workloads(k) {
		if w.prog.name != "limiter" {
			continue
		}
		if h := k.autoscaler(w.name()); h == nil || h.Spec.MinReplicas == nil || *h.Spec.MinReplicas < 2 || h.Spec.MaxReplicas < *h.Spec.MinReplicas {
			out = append(out, fmt.Sprintf("%s: the limiter needs a HorizontalPodAutoscaler on Deployment %s with 2 <= minReplicas <= maxReplicas", k.where, w.name()))
		} else if w.obj.Spec.Replicas != nil {
			out = append(out, fmt.Sprintf("%s Deployment %s: replicas is set, but the HorizontalPodAutoscaler owns it (an apply would reset the count)", k.where, w.name()))
		}
	}
	for _, h := range k.kind("HorizontalPodAutoscaler") {
		where := fmt.Sprintf("%s HorizontalPodAutoscaler %s", k.where, h.Metadata.Name)
		if h.Spec.ScaleTargetRef == nil || k.find(h.Spec.ScaleTargetRef.Kind, h.Spec.ScaleTargetRef.Name) == nil {
			out = append(out, where+": targets nothing in the render")
		}
		if h.Spec.MinReplicas != nil && h.Spec.MaxReplicas < *h.Spec.MinReplicas {
			out = append(out, fmt.Sprintf("%s: maxReplicas %d below minReplicas %d", where, h.Spec.MaxReplicas, *h.Spec.MinReplicas))
		}
	}
	for _, w := range m.workloads(k) {
		if w.obj.Kind != "Deployment" {
			continue
		}
		n := 0
		for _, pdb := range k.kind("PodDisruptionBudget") {
			if sel := pdb.labelSelector(); sel != nil && len(sel.MatchLabels)+len(sel.MatchExpressions) > 0 && sel.matches(w.labels()) {
				n++
				where := fmt.Sprintf("%s PodDisruptionBudget %s", k.where, pdb.Metadata.Name)
				if pdb.Spec.MinAvailable == nil && pdb.Spec.MaxUnavailable == nil {
					out = append(out, where+": sets neither minAvailable nor maxUnavailable")
				}
				replicas := 1
				if w.obj.Spec.Replicas != nil {
					replicas = *w.obj.Spec.Replicas
				}
				if h := k.autoscaler(w.name()); h != nil && h.Spec.MinReplicas != nil {
					replicas = *h.Spec.MinReplicas
				}
				if pdb.Spec.MinAvailable != nil && pdb.Spec.MinAvailable.str == "" && pdb.Spec.MinAvailable.num >= replicas {
					out = append(out, fmt.Sprintf("%s: minAvailable %d with %d replicas blocks every node drain", where, pdb.Spec.MinAvailable.num, replicas))
				}
			}
		}
		if n != 1 {
			out = append(out, fmt.Sprintf("%s Deployment %s: %d PodDisruptionBudgets select it, want 1", k.where, w.name(), n))
		}
	}
	return out
}

func checkConfig(m *model) []string { return m.eachRender(m.checkConfigOf) }

func (m *model) checkConfigOf(k *rendered) []string {
	var out []string
	config := k.config()
	if config == nil {
		return []string{k.where + ": no ConfigMap of the configMapGenerator floodgate-config"}
	}
	used := map[string]bool{}
	for _, w := range m.workloads(k) {
		where := fmt.Sprintf("%s %s %s", k.where, w.obj.Kind, w.name())
		pod := w.pod()
		for _, c := range pod.Containers {
			for _, e := range c.Env {
				if e.ValueFrom == nil {
					continue
				}
				for _, ref := range []struct {
					r    *keyRef
					kind string
				}{{e.ValueFrom.ConfigMapKeyRef, "ConfigMap"}, {e.ValueFrom.SecretKeyRef, "Secret"}} {
					if ref.r == nil {
						continue
					}
					// A reference the kustomization resolved names the generated object (its
					// content hash included); one it did not names nothing in the render.
					if _, ok := k.keyRef(ref.kind, ref.r); !ok {
						out = append(out, fmt.Sprintf("%s: %s refers to %s %s key %s, which the kustomization does not generate", where, e.Name, ref.kind, ref.r.Name, ref.r.Key))
					}
					if o := k.find(ref.kind, ref.r.Name); o != nil {
						used[generatorName(o)+"/"+ref.r.Key] = true
					}
				}
			}
		}
		for _, v := range pod.Volumes {
			switch {
			case v.Secret != nil && k.find("Secret", v.Secret.SecretName) == nil:
				out = append(out, fmt.Sprintf("%s: volume %s mounts Secret %s, which the kustomization does not generate", where, v.Name, v.Secret.SecretName))
			case v.ConfigMap != nil && k.find("ConfigMap", v.ConfigMap.Name) == nil:
				out = append(out, fmt.Sprintf("%s: volume %s mounts ConfigMap %s, which the kustomization does not generate", where, v.Name, v.ConfigMap.Name))
			}
		}
	}
	for _, key := range slices.Sorted(maps.Keys(config)) {
		if !used["floodgate-config/"+key] {
			out = append(out, fmt.Sprintf("%s floodgate-config: %s is used by no workload", k.where, key))
		}
		if strings.HasSuffix(key, "_TOPIC") {
			if _, ok := m.partitions[config[key]]; !ok {
				out = append(out, fmt.Sprintf("%s floodgate-config: %s=%q is not a topic in migrations/", k.where, key, config[key]))
			}
		}
	}
	for _, s := range k.kind("Secret") {
		vals := s.values()
		for _, key := range slices.Sorted(maps.Keys(vals)) {
			if !strings.Contains(vals[key], placeholder) {
				out = append(out, fmt.Sprintf("%s Secret %s: %s is not a %s placeholder; real secrets never live in git", k.where, generatorName(s), key, placeholder))
			}
		}
	}
	return out
}

// egressAllowed reports whether some egress policy selecting labels admits port.
func egressAllowed(policies []*k8sObject, labels map[string]string, port int) bool {
	for _, np := range policies {
		if !slices.Contains(np.Spec.PolicyTypes, "Egress") || !np.Spec.PodSelector.matches(labels) {
			continue
		}
		for _, r := range np.Spec.Egress {
			if r.allows(port) {
				return true
			}
		}
	}
	return false
}

// needs lists the ports a workload must reach, from the endpoints it is configured with.
func needs(env map[string]string) map[int]string {
	out := map[int]string{53: "DNS"}
	for _, k := range []string{"FLOODGATE_KAFKA_BROKERS", "FLOODGATE_REDIS_ADDRS", "FLOODGATE_INFLUX_URL", "FLOODGATE_DYNAMODB_ENDPOINT"} {
		v, ok := env[k]
		if !ok {
			continue
		}
		if k == "FLOODGATE_DYNAMODB_ENDPOINT" && v == "" {
			v = "https://dynamodb.amazonaws.com" // unset = AWS
		}
		for _, hp := range endpoints(v) {
			out[hp.port] = k
		}
	}
	if _, ok := env["FLOODGATE_PAGERDUTY_ROUTING_KEY"]; ok {
		out[443] = "FLOODGATE_PAGERDUTY_ROUTING_KEY"
	}
	return out
}

// checkEgress: every workload of k may reach the ports of the endpoints it is configured with.
func (m *model) checkEgress(k *rendered) []string {
	var out []string
	policies := k.kind("NetworkPolicy")
	for _, w := range m.workloads(k) {
		need := needs(k.env(w))
		for _, port := range slices.Sorted(maps.Keys(need)) {
			if !egressAllowed(policies, w.labels(), port) {
				out = append(out, fmt.Sprintf("%s: no NetworkPolicy lets %s reach port %d (%s)", k.where, w.name(), port, need[port]))
			}
		}
	}
	return out
}

func checkNetworkPolicies(m *model) []string { return m.eachRender(m.checkNetworkPoliciesOf) }

func (m *model) checkNetworkPoliciesOf(k *rendered) []string {
	var out []string
	policies := k.kind("NetworkPolicy")
	deny := false
	for _, np := range policies {
		sel := np.Spec.PodSelector
		if sel != nil && len(sel.MatchLabels)+len(sel.MatchExpressions) == 0 &&
			slices.Contains(np.Spec.PolicyTypes, "Ingress") && slices.Contains(np.Spec.PolicyTypes, "Egress") &&
			len(np.Spec.Ingress)+len(np.Spec.Egress) == 0 {
			deny = true
		}
	}
	if !deny {
		out = append(out, k.where+": no default-deny NetworkPolicy (podSelector {}, Ingress and Egress, no rules)")
	}
	out = append(out, m.checkEgress(k)...)
	// Every Service port admits somebody.
	for _, svc := range k.kind("Service") {
		for _, w := range m.workloads(k) {
			labels := w.labels()
			if !selectsPods(svc, labels) {
				continue
			}
			c := w.main()
			for _, sp := range svc.Spec.Ports {
				port := c.port(sp.TargetPort)
				ok := false
				for _, np := range policies {
					if slices.Contains(np.Spec.PolicyTypes, "Ingress") && np.Spec.PodSelector.matches(labels) {
						for _, r := range np.Spec.Ingress {
							ok = ok || r.allows(port)
						}
					}
				}
				if !ok {
					out = append(out, fmt.Sprintf("%s Service %s: no NetworkPolicy admits traffic to %s port %d", k.where, svc.Metadata.Name, w.name(), port))
				}
			}
		}
	}
	return out
}

// monitoringNamespace is where the Prometheus Operator's Prometheus runs (docs/deployment.md).
const monitoringNamespace = "monitoring"

// admitsFromNamespace reports whether some ingress policy selecting labels admits port from
// every pod of namespace ns (a rule without `from`, or a namespaceSelector matching ns alone).
func admitsFromNamespace(policies []*k8sObject, labels map[string]string, port int, ns string) bool {
	nsLabels := map[string]string{"kubernetes.io/metadata.name": ns}
	for _, np := range policies {
		if !slices.Contains(np.Spec.PolicyTypes, "Ingress") || !np.Spec.PodSelector.matches(labels) {
			continue
		}
		for _, r := range np.Spec.Ingress {
			if !r.allows(port) {
				continue
			}
			if len(r.From) == 0 {
				return true
			}
			for _, f := range r.From {
				var peer struct {
					NamespaceSelector *labelSelector `yaml:"namespaceSelector"`
					PodSelector       *labelSelector `yaml:"podSelector"`
				}
				b, err := yaml.Marshal(f)
				if err != nil || yaml.Unmarshal(b, &peer) != nil {
					continue
				}
				if peer.NamespaceSelector != nil && peer.NamespaceSelector.matches(nsLabels) && peer.PodSelector == nil {
					return true
				}
			}
		}
	}
	return false
}

// checkMonitoring holds deploy/k8s/monitoring to the base: each ServiceMonitor selects a Service
// and names a port of it (each PodMonitor selects pods and names a containerPort) that reaches
// the program's /metrics listener, Prometheus in the monitoring namespace may connect, every
// service that serves /metrics is scraped, and the base and overlay render without the CRDs.
func checkMonitoring(m *model) []string {
	var out []string
	k := m.monitoring
	for _, kk := range m.renders() {
		for _, o := range kk.objects {
			if strings.HasPrefix(o.APIVersion, "monitoring.coreos.com/") {
				out = append(out, fmt.Sprintf("%s %s %s: needs the Prometheus Operator's CRDs; it belongs in deploy/k8s/monitoring, which %s must not include", kk.where, o.Kind, o.Metadata.Name, kk.dir))
			}
		}
	}
	ns := m.base.namespace()
	policies := m.base.kind("NetworkPolicy")
	scraped := map[string]bool{}
	for _, o := range k.objects {
		where := fmt.Sprintf("%s %s %s", k.where, o.Kind, o.Metadata.Name)
		if o.Metadata.Namespace != ns {
			out = append(out, fmt.Sprintf("%s: namespace %q, want the base's %q (a monitor selects Services in its own namespace)", where, o.Metadata.Namespace, ns))
		}
		eps := o.Spec.Endpoints
		switch o.Kind {
		case "ServiceMonitor":
		case "PodMonitor":
			eps = o.Spec.PodMetricsEndpoints
		default:
			out = append(out, where+": not a ServiceMonitor or PodMonitor")
			continue
		}
		if o.APIVersion != "monitoring.coreos.com/v1" {
			out = append(out, fmt.Sprintf("%s: apiVersion %q, want monitoring.coreos.com/v1", where, o.APIVersion))
		}
		if o.Spec.NamespaceSelector.Kind != 0 {
			out = append(out, where+": must not set namespaceSelector (it scrapes its own namespace)")
		}
		if len(eps) == 0 {
			out = append(out, where+": no endpoints")
		}
		for _, ep := range eps {
			iv, err := time.ParseDuration(ep.Interval)
			if err != nil || iv <= 0 {
				out = append(out, fmt.Sprintf("%s: port %q: interval %q is not a duration", where, ep.Port, ep.Interval))
			}
			if to, err := time.ParseDuration(ep.ScrapeTimeout); ep.ScrapeTimeout != "" && (err != nil || to > iv) {
				out = append(out, fmt.Sprintf("%s: port %q: scrapeTimeout %q must be a duration within the interval %s", where, ep.Port, ep.ScrapeTimeout, ep.Interval))
			}
			if ep.Path != "/metrics" {
				out = append(out, fmt.Sprintf("%s: port %q: path %q, want /metrics", where, ep.Port, ep.Path))
			}
		}
		sel := o.labelSelector()
		if sel == nil || len(sel.MatchLabels)+len(sel.MatchExpressions) == 0 {
			out = append(out, where+": empty selector (it would scrape everything in the namespace)")
			continue
		}
		// The targets: each selected workload and the container port an endpoint reaches.
		type target struct {
			w    workload
			port int
		}
		var targets []target
		if o.Kind == "ServiceMonitor" {
			n := 0
			for _, svc := range m.base.kind("Service") {
				if !sel.matches(svc.Metadata.Labels) {
					continue
				}
				n++
				var names []string
				for _, sp := range svc.Spec.Ports {
					names = append(names, sp.Name)
				}
				for _, ep := range eps {
					i := slices.Index(names, ep.Port)
					if i < 0 {
						out = append(out, fmt.Sprintf("%s: names port %q, which Service %s does not have (%s)", where, ep.Port, svc.Metadata.Name, strings.Join(names, ", ")))
						continue
					}
					for _, w := range m.workloads(m.base) {
						if selectsPods(svc, w.labels()) && w.main() != nil {
							targets = append(targets, target{w, w.main().port(svc.Spec.Ports[i].TargetPort)})
						}
					}
				}
			}
			if n == 0 {
				out = append(out, where+": selects no Service in deploy/k8s/base")
			}
		} else {
			n := 0
			for _, w := range m.workloads(m.base) {
				c := w.main()
				if w.obj.Kind != "Deployment" || c == nil || !sel.matches(w.labels()) {
					continue
				}
				n++
				for _, ep := range eps {
					if port := c.port(intOrString{str: ep.Port}); port != 0 {
						targets = append(targets, target{w, port})
					} else {
						out = append(out, fmt.Sprintf("%s: names port %q, which container %s does not declare", where, ep.Port, c.Name))
					}
				}
			}
			if n == 0 {
				out = append(out, where+": selects no pods of a Deployment in deploy/k8s/base")
			}
		}
		for _, tg := range targets {
			p := tg.w.prog
			metrics, _ := m.listenPort("", p, m.base.env(tg.w))
			switch {
			case !p.servesMetrics():
				out = append(out, fmt.Sprintf("%s: scrapes %s, which serves no /metrics", where, p.name))
			case tg.port != metrics:
				out = append(out, fmt.Sprintf("%s: scrapes %s port %d, but its /metrics is on %d", where, p.name, tg.port, metrics))
			default:
				scraped[tg.w.name()] = true
				if !admitsFromNamespace(policies, tg.w.labels(), tg.port, monitoringNamespace) {
					out = append(out, fmt.Sprintf("%s: no NetworkPolicy admits Prometheus (namespace %s) to %s port %d", where, monitoringNamespace, p.name, tg.port))
				}
			}
		}
	}
	for _, w := range m.workloads(m.base) {
		if w.obj.Kind == "Deployment" && w.prog.servesMetrics() && !scraped[w.name()] {
			out = append(out, fmt.Sprintf("%s: %s serves /metrics but no ServiceMonitor or PodMonitor scrapes it", k.where, w.name()))
		}
	}
	return out
}

// checkOverlay holds the production overlay to its purpose: the base with production values,
// images and limiter rules. (The checks above hold its render as they hold the base's.)
func checkOverlay(m *model) []string {
	var out []string
	o := m.overlay
	// It builds on the base: whatever the base renders, it renders too (a generated object by
	// its generator's name: the content hash differs).
	for _, b := range m.base.objects {
		if !slices.ContainsFunc(o.objects, func(x *k8sObject) bool { return x.Kind == b.Kind && generatorName(x) == generatorName(b) }) {
			out = append(out, fmt.Sprintf("%s: renders no %s %s, which the base does: it must build on ../../base", o.where, b.Kind, generatorName(b)))
		}
	}
	// Its floodgate-config is the base's with production values (behavior: merge): the same keys.
	base, config := m.base.config(), o.config()
	for _, k := range slices.Sorted(maps.Keys(base)) {
		if _, ok := config[k]; !ok {
			out = append(out, fmt.Sprintf("%s: floodgate-config lacks %s, which the base sets (merge into the base's floodgate-config: behavior: merge)", o.where, k))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(config)) {
		if _, ok := base[k]; !ok {
			out = append(out, fmt.Sprintf("%s: floodgate-config sets %s, which no base workload uses", o.where, k))
		}
	}
	if rf, _ := strconv.Atoi(config["FLOODGATE_KAFKA_REPLICATION_FACTOR"]); rf < 3 {
		out = append(out, fmt.Sprintf("%s: FLOODGATE_KAFKA_REPLICATION_FACTOR=%q, want >= 3", o.where, config["FLOODGATE_KAFKA_REPLICATION_FACTOR"]))
	}
	if len(endpoints(config["FLOODGATE_REDIS_ADDRS"])) < 2 {
		out = append(out, o.where+": FLOODGATE_REDIS_ADDRS should list the Redis Cluster's nodes")
	}
	if config["FLOODGATE_DYNAMODB_ENDPOINT"] != "" {
		out = append(out, o.where+": FLOODGATE_DYNAMODB_ENDPOINT must be empty (AWS DynamoDB)")
	}
	// Its images are the production ones: the overlay's images cover every program.
	for _, w := range m.workloads(o) {
		if b := m.base.find(w.obj.Kind, w.name()); b != nil {
			if c, bc := w.main(), (workload{b, w.prog}).main(); c != nil && bc != nil && c.Image == bc.Image {
				out = append(out, fmt.Sprintf("%s %s %s: image %q is the base's; the overlay's images must set the production one", o.where, w.obj.Kind, w.name(), c.Image))
			}
		}
	}
	return append(out, m.checkRules(o)...)
}

// checkRules: the workloads of k that read limiter rules (FLOODGATE_LIMITER_RULES) find them in
// a file of a ConfigMap mounted at that path, valid against schemas/rate-limits.schema.json; at
// least one does.
func (m *model) checkRules(k *rendered) []string {
	var out []string
	n := 0
	for _, w := range m.workloads(k) {
		path, ok := k.env(w)["FLOODGATE_LIMITER_RULES"]
		if !ok {
			continue
		}
		n++
		where := fmt.Sprintf("%s %s %s", k.where, w.obj.Kind, w.name())
		rules, ok := k.mountedFile(w, path)
		if !ok {
			out = append(out, fmt.Sprintf("%s: FLOODGATE_LIMITER_RULES=%s is no file of a ConfigMap mounted in container %s", where, path, w.prog.name))
			continue
		}
		out = append(out, m.checkRulesFile(fmt.Sprintf("%s: %s", where, path), rules)...)
	}
	if n == 0 {
		out = append(out, k.where+": no workload reads limiter rules (FLOODGATE_LIMITER_RULES)")
	}
	return out
}

// mountedFile is the content of the file at path in w's container: a key of a ConfigMap
// volume mounted above it.
func (k *rendered) mountedFile(w workload, path string) (string, bool) {
	c := w.main()
	if c == nil {
		return "", false
	}
	for _, vm := range c.VolumeMounts {
		key, ok := strings.CutPrefix(path, strings.TrimSuffix(vm.MountPath, "/")+"/")
		if !ok {
			continue
		}
		for _, v := range w.pod().Volumes {
			if v.Name != vm.Name || v.ConfigMap == nil {
				continue
			}
			if cm := k.find("ConfigMap", v.ConfigMap.Name); cm != nil {
				s, ok := cm.values()[key]
				return s, ok
			}
		}
	}
	return "", false
}

// checkRulesFile validates limiter rules against schemas/rate-limits.schema.json.
func (m *model) checkRulesFile(where, rules string) []string {
	schemaPath := filepath.Join(m.root, "schemas/rate-limits.schema.json")
	c := jsonschema.NewCompiler()
	sch, err := c.Compile(schemaPath)
	if err != nil {
		return []string{fmt.Sprintf("compile %s: %v", schemaPath, err)}
	}
	var doc any
	if err := yaml.Unmarshal([]byte(rules), &doc); err != nil {
		return []string{fmt.Sprintf("%s: %v", where, err)}
	}
	// Round-trip through JSON so the validator sees JSON types.
	js, err := json.Marshal(doc)
	if err != nil {
		return []string{fmt.Sprintf("%s: %v", where, err)}
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(js))
	if err != nil {
		return []string{err.Error()}
	}
	if err := sch.Validate(inst); err != nil {
		return []string{fmt.Sprintf("%s does not match schemas/rate-limits.schema.json: %v", where, err)}
	}
	return nil
}

var (
	metricRe   = regexp.MustCompile(`\bfloodgate_[a-z0-9_]+`)
	selectorRe = regexp.MustCompile(`\{([^}]*)\}`)
	matcherRe  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	groupingRe = regexp.MustCompile(`\b(?:by|without|on|ignoring)\s*\(([^)]*)\)`)
	// Labels Prometheus adds to every series (target and histogram labels).
	targetLabels = []string{"le", "quantile", "job", "instance", "pod", "namespace", "container", "service", "endpoint", "node"}
)

var (
	labelsLitRe   = regexp.MustCompile(`\[\]string\{([^}]*)\}`)
	labelsIdentRe = regexp.MustCompile(`\},\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)`)
	// A pkg/metric Factory call: the name, the help, then the labels as the last arguments.
	spreadLabelsRe  = regexp.MustCompile(`^,\s*"(?:[^"\\]|\\.)*"[^\n]*?,\s*([A-Za-z_][A-Za-z0-9_]*)\.\.\.\s*\)`)
	factoryCallRe   = regexp.MustCompile(`^,\s*"(?:[^"\\]|\\.)*"\s*[,)]`)
	factoryLabelsRe = regexp.MustCompile(`^,\s*"(?:[^"\\]|\\.)*"((?:\s*,\s*"[^"]*")*)\s*,?\s*\)`)
)

// metricLabels finds metric name in the Go sources (histogram and summary suffixes resolved)
// and returns its label names: the []string that follows the name in its Opts, or the variable
// holding them, or the string arguments after the help of a pkg/metric Factory call. ok is
// false when no source defines the metric.
func (m *model) metricLabels(name string) (labels []string, ok bool) {
	for _, cand := range []string{name, strings.TrimSuffix(name, "_bucket"), strings.TrimSuffix(name, "_sum"), strings.TrimSuffix(name, "_count")} {
		for _, path := range slices.Sorted(maps.Keys(m.goSources)) {
			src := m.goSources[path]
			i := strings.Index(src, `"`+cand+`"`)
			if i < 0 {
				continue
			}
			ok = true
			// The definition runs to the next metric's Name (or a bounded distance).
			def := src[i+len(cand)+2:]
			if j := strings.Index(def, "Name:"); j >= 0 {
				def = def[:j]
			}
			if len(def) > 800 {
				def = def[:800]
			}
			var list string
			if mm := factoryLabelsRe.FindStringSubmatch(def); mm != nil {
				list = mm[1]
			} else if mm := spreadLabelsRe.FindStringSubmatch(def); mm != nil {
				// labels spread from a variable: tg...
				re := regexp.MustCompile(`\b` + regexp.QuoteMeta(mm[1]) + `\s*:?=\s*\[\]string\{([^}]*)\}`)
				if d := re.FindStringSubmatch(src); d != nil {
					list = d[1]
				}
			} else if factoryCallRe.MatchString(def) {
				list = "" // a Factory call without literal labels (a histogram's buckets): none
			} else if mm := labelsLitRe.FindStringSubmatch(def); mm != nil {
				list = mm[1]
			} else if mm := labelsIdentRe.FindStringSubmatch(def); mm != nil {
				re := regexp.MustCompile(regexp.QuoteMeta(mm[1]) + `\s*:?=\s*\[\]string\{([^}]*)\}`)
				if d := re.FindStringSubmatch(src); d != nil {
					list = d[1]
				}
			}
			for _, l := range strings.Split(list, ",") {
				if l, err := strconv.Unquote(strings.TrimSpace(l)); err == nil {
					labels = append(labels, l)
				}
			}
		}
		if ok {
			return labels, true
		}
	}
	return nil, false
}

func checkGrafana(m *model) []string {
	var out []string
	uids := map[string]string{}
	for _, file := range slices.Sorted(maps.Keys(m.dashboards)) {
		d := m.dashboards[file]
		if d.UID == "" || uids[d.UID] != "" {
			out = append(out, fmt.Sprintf("grafana %s: uid %q is empty or also used by %s", file, d.UID, uids[d.UID]))
		}
		uids[d.UID] = file
		var walk func([]panel)
		n := 0
		walk = func(ps []panel) {
			for _, p := range ps {
				walk(p.Panels)
				for _, tg := range p.Targets {
					n++
					out = append(out, m.checkExpr(fmt.Sprintf("grafana %s panel %q", file, p.Title), tg.Expr)...)
				}
			}
		}
		walk(d.Panels)
		if n == 0 {
			out = append(out, fmt.Sprintf("grafana %s: no panel queries anything", file))
		}
	}
	return out
}

// checkExpr checks one PromQL expression: it uses floodgate_ metrics the Go sources
// export, and filters or groups only by labels those metrics declare.
func (m *model) checkExpr(where, expr string) []string {
	var out []string
	metrics := metricRe.FindAllString(expr, -1)
	if len(metrics) == 0 {
		return []string{fmt.Sprintf("%s: expression %q uses no floodgate_ metric", where, expr)}
	}
	var known []string
	found := false
	for _, name := range metrics {
		labels, ok := m.metricLabels(name)
		if !ok {
			out = append(out, fmt.Sprintf("%s: metric %s is exported by no Go source under services/, pkg/, migrations/", where, name))
			continue
		}
		found = true
		known = append(known, labels...)
	}
	if !found {
		return out
	}
	var labels []string
	for _, sel := range selectorRe.FindAllStringSubmatch(expr, -1) {
		for _, mm := range matcherRe.FindAllStringSubmatch(sel[1], -1) {
			labels = append(labels, mm[1])
		}
	}
	for _, g := range groupingRe.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(g[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				labels = append(labels, l)
			}
		}
	}
	for _, l := range labels {
		if !slices.Contains(targetLabels, l) && l != "le" && !slices.Contains(known, l) {
			out = append(out, fmt.Sprintf("%s: label %q is not one of %v, the labels of %v", where, l, known, metrics))
		}
	}
	return out
}

type alertRules struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// checkAlerts checks deploy/prometheus/alerts.yml: every expression against the
// code's metrics, every alert linking a runbook section that exists.
func checkAlerts(m *model) []string {
	var out []string
	anchors := map[string]bool{}
	for _, line := range strings.Split(m.runbooks, "\n") {
		if h, ok := strings.CutPrefix(line, "### "); ok {
			anchors[slug(h)] = true
		}
	}
	n := 0
	for _, g := range m.alerts.Groups {
		for _, r := range g.Rules {
			n++
			where := fmt.Sprintf("alert %s", r.Alert)
			out = append(out, m.checkExpr(where, r.Expr)...)
			file, anchor, ok := strings.Cut(r.Annotations["runbook"], "#")
			if !ok || file != "docs/runbooks.md" || !anchors[anchor] {
				out = append(out, fmt.Sprintf("%s: runbook %q is not a section of docs/runbooks.md", where, r.Annotations["runbook"]))
			}
		}
	}
	if n == 0 {
		out = append(out, "deploy/prometheus/alerts.yml: no alerts")
	}
	return out
}

// slug is the anchor GitHub gives a Markdown heading.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

func checkDocs(m *model) []string {
	var out []string
	for _, p := range m.sortedPrograms() {
		if !strings.Contains(m.docs, "--target "+p.name) {
			out = append(out, fmt.Sprintf("docs/deployment.md: does not show how to build %s (--target %s)", p.name, p.name))
		}
	}
	for _, tb := range m.tables {
		if !strings.Contains(m.docs, tb) {
			out = append(out, fmt.Sprintf("docs/deployment.md: the IAM section does not name table %s", tb))
		}
	}
	return out
}

// ---- every check can fail -----------------------------------------------------------------

func TestChecksCatchDrift(t *testing.T) {
	deploy := func(m *model, name string) *k8sObject {
		o := m.base.find("Deployment", name)
		require.NotNil(t, o, name)
		return o
	}
	ctr := func(m *model, name string) *container {
		c := workload{deploy(m, name), m.programs[name]}.main()
		require.NotNil(t, c, name)
		return c
	}
	drop := func(k *rendered, kind, name string) {
		n := len(k.objects)
		k.objects = slices.DeleteFunc(k.objects, func(o *k8sObject) bool { return o.Kind == kind && o.Metadata.Name == name })
		require.Less(t, len(k.objects), n, "%s %s", kind, name)
	}
	ptr := func(n int) *int { return &n }
	monitor := func(m *model, name string) *k8sObject {
		o := m.monitoring.find("ServiceMonitor", name)
		require.NotNil(t, o, name)
		return o
	}
	// rawCtr is the first container of o as rendered, for checkVariants.
	rawCtr := func(o *k8sObject) map[string]any {
		require.NotNil(t, o)
		c, ok := list(dig(o.raw, "spec", "template", "spec")["containers"])[0].(map[string]any)
		require.True(t, ok, o.Metadata.Name)
		return c
	}
	// baseConfig and overlayConfig set (value "<delete>": delete) key of the floodgate-config
	// ConfigMap the base or the production overlay generates.
	baseConfig := func(key, value string) func(*model) {
		return func(m *model) { m.base.setValue(t, "ConfigMap", "floodgate-config", key, value) }
	}
	overlayConfig := func(key, value string) func(*model) {
		return func(m *model) { m.overlay.setValue(t, "ConfigMap", "floodgate-config", key, value) }
	}
	// edit breaks a kustomization's file (relative to deploy/k8s), replacing old with new, and
	// renders again.
	edit := func(file, old, new string) func(*model) {
		return func(m *model) {
			m.rerender(t, map[string]func(string) string{k8sDir + "/" + file: func(s string) string {
				require.Contains(t, s, old, file)
				return strings.Replace(s, old, new, 1)
			}})
		}
	}

	tests := []struct {
		name   string
		check  func(*model) []string
		break_ func(m *model)
		want   string
	}{
		{"image missing for a service", checkDockerfile, func(m *model) {
			m.docker.stages = slices.DeleteFunc(m.docker.stages, func(s *dockerStage) bool { return s.name == "quota" })
		}, `no final stage "quota"`},
		{"image runs as root", checkDockerfile, func(m *model) { m.docker.stage("runtime").user = "0" }, `runs as "0"`},
		{"image not static", checkDockerfile, func(m *model) { m.docker.stage("runtime").from = "debian:12" }, "not distroless static"},
		{"build without -trimpath", checkDockerfile, func(m *model) {
			b := m.docker.stage("build")
			b.builds[0] = strings.Replace(b.builds[0], "-trimpath ", "", 1)
		}, "lacks -trimpath"},
		{"a program left out of the build", checkDockerfile, func(m *model) {
			b := m.docker.stage("build")
			b.builds[0] = strings.Replace(b.builds[0], " ./services/quota ", " ", 1)
		}, "stage build must `go build -o /out/ ... ./services/quota`"},
		{"image copies another program's binary", checkDockerfile, func(m *model) {
			st := m.docker.stage("detector")
			st.copies = []string{"--from=build /out/limiter /usr/local/bin/detector"}
		}, "does not copy its binary /out/detector"},
		{"cgo on", checkDockerfile, func(m *model) { m.docker.stage("deps").env["CGO_ENABLED"] = "1" }, "CGO_ENABLED=0"},
		{"stage for a removed program", checkDockerfile, func(m *model) {
			m.docker.stages = append(m.docker.stages, &dockerStage{name: "billing", from: "runtime", env: map[string]string{}})
		}, `stage "billing" matches no program`},
		{"image listens on loopback", checkDockerfile, func(m *model) {
			m.docker.stage("detector").env["FLOODGATE_DETECTOR_ADDR"] = "127.0.0.1:8082"
		}, "all interfaces"},
		{"image healthcheck on the wrong port", checkDockerfile, func(m *model) {
			st := m.docker.stage("quota")
			st.healthcheck = strings.Replace(st.healthcheck, ":8085/", ":8086/", 1)
		}, "HEALTHCHECK"},
		{"compose service missing", checkCompose, func(m *model) { delete(m.compose.Services, "detector") }, `no service "detector"`},
		{"compose variable nobody reads", checkCompose, setComposeEnv("limiter", "FLOODGATE_LIMITER_TYPO", "1"),
			"FLOODGATE_LIMITER_TYPO is set but limiter"},
		{"compose variable on the wrong service", checkCompose, setComposeEnv("limiter", "FLOODGATE_QUOTA_GROUP", "g"),
			"FLOODGATE_QUOTA_GROUP is set but limiter"},
		{"compose port differs from the code", checkCompose, setComposeEnv("detector", "FLOODGATE_DETECTOR_ADDR", "0.0.0.0:9999"),
			"differs from the code's default 8082"},
		{"compose healthcheck on the wrong port", checkCompose, func(m *model) {
			m.compose.Services["limiter"].Healthcheck.Test = []string{"CMD", "/usr/local/bin/probe", "http://127.0.0.1:8081/readyz"}
		}, "does not probe its port 8080"},
		{"compose service does not wait for migrate", checkCompose, func(m *model) {
			delete(m.compose.Services["quota"].DependsOn, "migrate")
		}, "service_completed_successfully"},
		{"compose kafka creates topics", checkCompose, setComposeEnv("kafka", "KAFKA_AUTO_CREATE_TOPICS_ENABLE", "true"),
			"KAFKA_AUTO_CREATE_TOPICS_ENABLE=false"},
		{"compose influx bucket of the 1.8 stack", checkCompose, setComposeEnv("detector", "FLOODGATE_INFLUX_BUCKET", "floodgate/d30"),
			"InfluxDB 2 is set up with bucket"},
		{"compose topic not in migrations", checkCompose, setComposeEnv("detector", "FLOODGATE_ABUSE_TOPIC", "floodgate.abuse.v2"),
			`"floodgate.abuse.v2" is not a topic`},
		{"compose endpoint left at loopback", checkCompose, unsetComposeEnv("quota", "FLOODGATE_REDIS_ADDRS"),
			"reads FLOODGATE_REDIS_ADDRS but it is not set"},
		{"compose endpoint names no service", checkCompose, setComposeEnv("quota", "FLOODGATE_KAFKA_BROKERS", "broker:9092"),
			`"broker", which is no compose service`},
		{"compose runs as root", checkCompose, func(m *model) { m.compose.Services["adjuster"].User = "root" }, "must run as 65532"},
		{"compose migrate flag that does not exist", checkWorkloads, func(m *model) {
			m.compose.Services["migrate"].Command = []string{"-olny", "kafka"}
		}, "flag -olny is not defined"},
		{"prometheus scrapes a stale port", checkCompose, func(m *model) {
			m.prometheus.ScrapeConfigs[0].StaticConfigs[0].Targets = []string{"limiter:9999"}
		}, "listens on 8080"},
		{"k8s deployment missing", checkWorkloads, func(m *model) { drop(m.base, "Deployment", "detector") }, `no Deployment "detector"`},
		{"k8s migrate job missing", checkWorkloads, func(m *model) { drop(m.base, "Job", "migrate") }, `no Job "migrate"`},
		{"k8s pod runs as root", checkWorkloads, func(m *model) {
			var root int64
			deploy(m, "quota").Spec.Template.Spec.SecurityContext.RunAsUser = &root
		}, "runAsNonRoot: true and a non-zero runAsUser"},
		{"k8s writable root filesystem", checkWorkloads, func(m *model) {
			f := false
			ctr(m, "limiter").SecurityContext.ReadOnlyRootFilesystem = &f
		}, "readOnlyRootFilesystem"},
		{"k8s added capability", checkWorkloads, func(m *model) {
			ctr(m, "adjuster").SecurityContext.Capabilities.Add = []string{"NET_ADMIN"}
		}, "drop ALL capabilities"},
		{"k8s no memory limit", checkWorkloads, func(m *model) { delete(ctr(m, "detector").Resources.Limits, "memory") }, "memory limit"},
		{"k8s variable nobody reads", checkWorkloads, func(m *model) {
			c := ctr(m, "quota")
			c.Env = append(c.Env, envVar{Name: "FLOODGATE_QUOTA_FLUSH_INTERVALL", Value: "1s"})
		}, "FLOODGATE_QUOTA_FLUSH_INTERVALL is set but quota"},
		{"k8s endpoint left at loopback", checkWorkloads, func(m *model) {
			ctr(m, "detector").dropEnv("FLOODGATE_KAFKA_BROKERS")
		}, "reads FLOODGATE_KAFKA_BROKERS but it is not set"},
		{"k8s grace period shorter than the drain", checkWorkloads, func(m *model) {
			deploy(m, "limiter").Spec.Template.Spec.TerminationGracePeriodSeconds = ptr(20)
		}, "does not cover preStop 5s"},
		{"k8s readiness probe on liveness path", checkServices, func(m *model) {
			ctr(m, "quota").ReadinessProbe.HTTPGet.Path = "/healthz"
		}, "readinessProbe must GET /readyz"},
		{"k8s listens on another port than the code", checkServices, func(m *model) {
			for i, e := range ctr(m, "detector").Env {
				if e.Name == "FLOODGATE_DETECTOR_ADDR" {
					ctr(m, "detector").Env[i].Value = "0.0.0.0:9082"
				}
			}
		}, "differs from the code's default 8082"},
		{"image lacks EXPOSE of a second listener", checkDockerfile, func(m *model) {
			st := m.docker.stage("limiter")
			st.expose = slices.DeleteFunc(st.expose, func(p int) bool { return p == 8081 })
		}, "lacks its port 8081"},
		{"k8s second listener not declared", checkServices, func(m *model) {
			c := ctr(m, "limiter")
			c.Ports = c.Ports[:1]
		}, "containerPort 8081 (its *_ADDR) is not declared"},
		{"k8s gRPC port unreachable from gateways", checkNetworkPolicies, func(m *model) {
			drop(m.base, "NetworkPolicy", "limiter-from-gateways")
		}, "no NetworkPolicy admits traffic to limiter port 8081"},
		{"compose console without its port", checkCompose, unsetComposeEnv("console", "FLOODGATE_CONSOLE_ADDR"),
			"console listens on 127.0.0.1 by default"},
		{"k8s Service targets the wrong port", checkServices, func(m *model) {
			m.base.find("Service", "limiter").Spec.Ports[0].TargetPort = intOrString{num: 9090}
		}, "targets 9090, but limiter listens on 8080"},
		{"k8s consumer replicas over partitions", checkConsumers, func(m *model) { deploy(m, "quota").Spec.Replicas = ptr(13) }, "has only 12 partitions"},
		{"k8s detector bound by the abuse topic", checkConsumers, func(m *model) { deploy(m, "detector").Spec.Replicas = ptr(4) }, "has only 3 partitions"},
		{"k8s consumer without consumes annotation", checkConsumers, func(m *model) {
			delete(deploy(m, "quota").Metadata.Annotations, consumesAnno)
		}, "joins a consumer group"},
		{"k8s consumes an unknown topic", checkConsumers, func(m *model) {
			deploy(m, "quota").Metadata.Annotations[consumesAnno] = "floodgate.decisions.v2"
		}, "not a topic in migrations/"},
		{"k8s HPA on a consumer beyond partitions", checkConsumers, func(m *model) {
			h := &k8sObject{Kind: "HorizontalPodAutoscaler"}
			h.Metadata.Name = "quota"
			h.Spec.ScaleTargetRef = &struct {
				Kind string `yaml:"kind"`
				Name string `yaml:"name"`
			}{"Deployment", "quota"}
			h.Spec.MaxReplicas = 20
			m.base.objects = append(m.base.objects, h)
		}, "maxReplicas 20 exceeds the 12 partitions"},
		{"k8s limiter without HPA", checkScaling, func(m *model) { drop(m.base, "HorizontalPodAutoscaler", "limiter") }, "HorizontalPodAutoscaler on Deployment limiter"},
		{"k8s limiter replicas fight the HPA", checkScaling, func(m *model) { deploy(m, "limiter").Spec.Replicas = ptr(3) }, "the HorizontalPodAutoscaler owns it"},
		{"k8s CRITICAL limiter without HPA", checkScaling, func(m *model) { drop(m.base, "HorizontalPodAutoscaler", criticalLimiter) },
			"HorizontalPodAutoscaler on Deployment limiter-critical"},
		{"k8s CRITICAL limiter without PDB", checkScaling, func(m *model) { drop(m.base, "PodDisruptionBudget", criticalLimiter) },
			"Deployment limiter-critical: 0 PodDisruptionBudgets select it"},
		{"k8s CRITICAL limiter runs as root", checkWorkloads, func(m *model) {
			var root int64
			deploy(m, criticalLimiter).Spec.Template.Spec.SecurityContext.RunAsUser = &root
		}, "k8s Deployment limiter-critical: pod securityContext must set runAsNonRoot"},
		{"k8s CRITICAL limiter Redis egress blocked", checkNetworkPolicies, func(m *model) {
			e := &m.base.find("NetworkPolicy", "egress-redis").Spec.PodSelector.MatchExpressions[0]
			e.Values = slices.DeleteFunc(e.Values, func(v string) bool { return v == criticalLimiter })
		}, "no NetworkPolicy lets limiter-critical reach port 6379"},
		{"k8s variant env drifts from its program", checkVariants,
			edit("base/limiter-critical/cpu-request.yaml", "          resources:\n",
				"          env:\n            - {name: FLOODGATE_LIMITER_GRPC_GATE_MAX, value: \"8\"}\n          resources:\n"),
			"k8s Deployment limiter-critical: spec.template.spec.containers[0].env differs from Deployment limiter's"},
		{"k8s variant image drifts from its program", checkVariants, func(m *model) {
			rawCtr(deploy(m, criticalLimiter))["image"] = "floodgate/limiter:old"
		}, "spec.template.spec.containers[0].image differs from Deployment limiter's"},
		{"k8s variant probe drifts from its program", checkVariants, func(m *model) {
			dig(rawCtr(deploy(m, "limiter")), "readinessProbe")["periodSeconds"] = 10
		}, "spec.template.spec.containers[0].readinessProbe.periodSeconds differs"},
		{"k8s variant patched apart in the overlay", checkVariants,
			edit("overlays/production/kustomization.yaml", "labelSelector: app.kubernetes.io/component=decision-api}",
				"labelSelector: app.kubernetes.io/name=limiter}"),
			"k8s overlay production Deployment limiter-critical: spec.template.spec.containers[0].env differs"},
		{"k8s variant in its program's Service", checkVariants,
			edit("base/limiter-critical/kustomization.yaml", "includeSelectors: true", "includeSelectors: false"),
			"Service limiter selects its pods and limiter's"},
		{"k8s variant spreads its program's pods", checkVariants, func(m *model) {
			tc := list(dig(deploy(m, criticalLimiter).raw, "spec", "template", "spec")["topologySpreadConstraints"])[0].(map[string]any)
			dig(tc, "labelSelector", "matchLabels")[nameLabel] = "limiter"
		}, "k8s Deployment limiter-critical: its topologySpreadConstraints must spread its own pods"},
		{"k8s variant scaled by its program's HPA", checkVariants, func(m *model) {
			m.base.find("HorizontalPodAutoscaler", criticalLimiter).Spec.ScaleTargetRef.Name = "limiter"
		}, "2 HorizontalPodAutoscalers scale Deployment limiter (limiter, limiter-critical), want one each"},
		{"k8s variant under a ServiceAccount of its own", checkWorkloads, func(m *model) {
			deploy(m, criticalLimiter).Spec.Template.Spec.ServiceAccountName = criticalLimiter
		}, `k8s Deployment limiter-critical: must run as its own ServiceAccount "limiter"`},
		{"k8s variant unreachable from gateways", checkVariants, func(m *model) {
			drop(m.base, "NetworkPolicy", "limiter-critical-from-gateways")
		}, "k8s Deployment limiter-critical: no NetworkPolicy admits namespaceSelector: matchLabels: floodgate.dev/gateway: \"true\" → TCP/8081, as for limiter"},
		{"k8s variant reachable from the deferred worker", checkVariants, func(m *model) {
			np := m.base.find("NetworkPolicy", "limiter-critical-from-gateways")
			np.Spec.Ingress = append(np.Spec.Ingress, netRule{From: []any{map[string]any{"namespaceSelector": map[string]any{}}}})
		}, "a NetworkPolicy admits namespaceSelector: {} → every port, which limiter does not"},
		{"k8s variant without its program's Deployment", checkVariants, func(m *model) { drop(m.base, "Deployment", "limiter") },
			"runs limiter, which has no Deployment limiter of its own to derive from"},
		{"k8s CRITICAL limiter's CPU limit under 3× its HPA's hold", checkCriticalLimiter,
			edit("base/limiter-critical/cpu-request.yaml", "            requests: {cpu: 500m}\n",
				"            requests: {cpu: 500m}\n            limits: {cpu: 500m}\n"),
			"k8s Deployment limiter-critical: CPU limit 500m is under 3× the 200m its HPA holds it at (40 % of 500m)"},
		{"k8s CRITICAL limiter's HPA off CPU", checkCriticalLimiter,
			edit("base/limiter-critical/hpa.yaml", "path: /spec/metrics/0/resource/target/averageUtilization, value: 40}",
				"path: /spec/metrics/0/resource/target/averageUtilization, value: 0}"),
			"k8s Deployment limiter-critical: needs a CPU request, a CPU limit and an HPA on CPU utilization"},
		{"k8s CRITICAL limiter's Service without gRPC", checkCriticalLimiter, func(m *model) {
			m.overlay.find("Service", criticalLimiter).Spec.Ports[1].Port = 9081
		}, "k8s overlay production Service limiter-critical: must select its pods on grpc port 8081"},
		{"k8s PDB missing", checkScaling, func(m *model) { drop(m.base, "PodDisruptionBudget", "detector") }, "0 PodDisruptionBudgets select it"},
		{"k8s PDB blocks drains", checkScaling, func(m *model) {
			m.base.find("PodDisruptionBudget", "dlq-auditor").Spec.MaxUnavailable = nil
			m.base.find("PodDisruptionBudget", "dlq-auditor").Spec.MinAvailable = &intOrString{num: 1}
		}, "blocks every node drain"},
		{"k8s ConfigMap key missing", checkConfig, baseConfig("FLOODGATE_REDIS_ADDRS", "<delete>"),
			"key FLOODGATE_REDIS_ADDRS, which the kustomization does not generate"},
		{"k8s reference left at a generator's name", checkConfig, func(m *model) {
			e := m.container(t, m.base, "Deployment", criticalLimiter).envVar("FLOODGATE_LIMITER_CALLERS")
			e.ValueFrom.SecretKeyRef.Name = "limiter-secrets" // what kustomize resolves to limiter-secrets-<hash>
		}, "k8s Deployment limiter-critical: FLOODGATE_LIMITER_CALLERS refers to Secret limiter-secrets key FLOODGATE_LIMITER_CALLERS, which the kustomization does not generate"},
		{"k8s rules volume of no ConfigMap", checkConfig, func(m *model) {
			o := m.overlay.find("Deployment", "limiter")
			o.Spec.Template.Spec.Volumes[0].ConfigMap.Name = "limiter-rule"
		}, "k8s overlay production Deployment limiter: volume rules mounts ConfigMap limiter-rule, which the kustomization does not generate"},
		{"k8s unused ConfigMap key", checkConfig, baseConfig("FLOODGATE_UNUSED", "x"),
			"k8s floodgate-config: FLOODGATE_UNUSED is used by no workload"},
		{"k8s real secret committed", checkConfig, func(m *model) {
			m.base.setValue(t, "Secret", "floodgate-secrets", "FLOODGATE_PAGERDUTY_ROUTING_KEY", "R0ut1ngKeyFromProd")
		}, "is not a CHANGE-ME placeholder"},
		{"overlay real secret committed", checkConfig, func(m *model) {
			m.overlay.setValue(t, "Secret", "floodgate-kafka-quota", "FLOODGATE_KAFKA_SASL_PASSWORD", "hunter2")
		}, "k8s overlay production Secret floodgate-kafka-quota: FLOODGATE_KAFKA_SASL_PASSWORD is not a CHANGE-ME placeholder"},
		{"k8s topic in config not in migrations", checkConfig, baseConfig("FLOODGATE_DECISIONS_TOPIC", "decisions"),
			`FLOODGATE_DECISIONS_TOPIC="decisions" is not a topic`},
		{"k8s no default deny", checkNetworkPolicies, func(m *model) { drop(m.base, "NetworkPolicy", "default-deny") }, "no default-deny"},
		{"k8s Redis egress blocked", checkNetworkPolicies, func(m *model) { drop(m.base, "NetworkPolicy", "egress-redis") }, "reach port 6379"},
		{"k8s DNS blocked", checkNetworkPolicies, func(m *model) { drop(m.base, "NetworkPolicy", "allow-dns") }, "reach port 53"},
		{"k8s limiter unreachable", checkNetworkPolicies, func(m *model) {
			drop(m.base, "NetworkPolicy", "limiter-from-gateways")
			drop(m.base, "NetworkPolicy", "allow-prometheus")
		}, "no NetworkPolicy admits traffic to limiter port 8080"},
		{"overlay consumer replicas over partitions", checkConsumers, func(m *model) {
			m.overlay.find("Deployment", "quota").Spec.Replicas = ptr(24)
		}, "k8s overlay production Deployment quota: 24 replicas"},
		{"overlay HPA max under min", checkScaling, func(m *model) {
			m.overlay.find("HorizontalPodAutoscaler", "limiter").Spec.MaxReplicas = 5
		}, "k8s overlay production HorizontalPodAutoscaler limiter: maxReplicas 5 below minReplicas 6"},
		{"overlay variable nobody reads", checkWorkloads, func(m *model) {
			c := m.container(t, m.overlay, "Deployment", "detector")
			c.Env = append(c.Env, envVar{Name: "FLOODGATE_DETECTOR_ENFORCE_TYPO", Value: "true"})
		}, "k8s overlay production Deployment detector: FLOODGATE_DETECTOR_ENFORCE_TYPO is set but detector"},
		{"overlay ServiceAccount of no program", checkWorkloads, func(m *model) {
			o := &k8sObject{Kind: "ServiceAccount"}
			o.Metadata.Name = "billing"
			m.overlay.objects = append(m.overlay.objects, o)
		}, "k8s overlay production ServiceAccount billing: is no program's ServiceAccount"},
		{"overlay without the base", checkOverlay, func(m *model) { drop(m.overlay, "NetworkPolicy", "default-deny") },
			"k8s overlay production: renders no NetworkPolicy default-deny, which the base does"},
		{"overlay replication factor 1", checkOverlay, overlayConfig("FLOODGATE_KAFKA_REPLICATION_FACTOR", "1"), "want >= 3"},
		{"overlay keeps DynamoDB Local", checkOverlay, overlayConfig("FLOODGATE_DYNAMODB_ENDPOINT", "http://dynamodb:8000"), "must be empty"},
		{"overlay Kafka on a port the policies block", checkNetworkPolicies, overlayConfig("FLOODGATE_KAFKA_BROKERS", "b-1.example:19092"),
			"k8s overlay production: no NetworkPolicy lets limiter reach port 19092"},
		{"overlay config key nothing uses", checkOverlay, overlayConfig("FLOODGATE_NEW_THING", "1"),
			"FLOODGATE_NEW_THING, which no base workload uses"},
		{"overlay config replaces the base's", checkOverlay,
			edit("overlays/production/kustomization.yaml", "    behavior: merge\n", "    behavior: replace\n"),
			"k8s overlay production: floodgate-config lacks FLOODGATE_ABUSE_TOPIC, which the base sets"},
		{"overlay image of the base", checkOverlay,
			edit("overlays/production/kustomization.yaml",
				"  - {name: floodgate/quota, newName: registry.example.com/floodgate/quota, newTag: \"0.1.0\"}\n", ""),
			`k8s overlay production Deployment quota: image "floodgate/quota:dev" is the base's`},
		{"overlay rules file invalid", checkOverlay, func(m *model) {
			m.overlay.setValue(t, "ConfigMap", "limiter-rules", "rate-limits.yaml", "version: 2\nrules: []\n")
		}, "k8s overlay production Deployment limiter: /etc/floodgate/limiter/rate-limits.yaml does not match schemas/rate-limits.schema.json"},
		{"overlay rules not mounted", checkOverlay, func(m *model) {
			c := m.container(t, m.overlay, "Deployment", criticalLimiter)
			c.VolumeMounts = nil
		}, "k8s overlay production Deployment limiter-critical: FLOODGATE_LIMITER_RULES=/etc/floodgate/limiter/rate-limits.yaml is no file of a ConfigMap mounted in container limiter"},
		{"dashboard metric the code does not export", checkGrafana, func(m *model) {
			for _, d := range m.dashboards {
				d.Panels = append(d.Panels, panel{Title: "x", Targets: []struct {
					Expr string `json:"expr"`
				}{{Expr: "sum(rate(floodgate_limiter_blocks_total[5m]))"}}})
			}
		}, "metric floodgate_limiter_blocks_total is exported by no Go source"},
		{"alert metric the code does not export", checkAlerts, func(m *model) {
			m.alerts.Groups[0].Rules[0].Expr = "sum(rate(floodgate_limiter_blocks_total[5m])) > 0"
		}, "alert FloodgateLimiterRedisUnavailable: metric floodgate_limiter_blocks_total is exported by no Go source"},
		{"alert label the metric lacks", checkAlerts, func(m *model) {
			m.alerts.Groups[0].Rules[0].Expr = "max by (pod_name) (floodgate_limiter_breaker_open) > 0"
		}, `label "pod_name" is not one of`},
		{"alert runbook section missing", checkAlerts, func(m *model) {
			m.runbooks = strings.ReplaceAll(m.runbooks, "### consumer-lag", "### lag")
		}, `alert FloodgateConsumerLag: runbook "docs/runbooks.md#consumer-lag" is not a section`},
		{"dashboard label the metric lacks", checkGrafana, func(m *model) {
			for _, d := range m.dashboards {
				d.Panels = append(d.Panels, panel{Title: "x", Targets: []struct {
					Expr string `json:"expr"`
				}{{Expr: `sum by (principal) (rate(floodgate_limiter_decisions_total{outcome="denied"}[5m]))`}}})
			}
		}, `label "principal" is not one of [tier outcome]`},
		{"monitor selects no Service", checkMonitoring, func(m *model) {
			require.NoError(t, monitor(m, "quota").Spec.Selector.Encode(labelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "quotas"}}))
		}, "ServiceMonitor quota: selects no Service"},
		{"monitor names a port the Service lacks", checkMonitoring, func(m *model) {
			monitor(m, "detector").Spec.Endpoints[0].Port = "metrics"
		}, `names port "metrics", which Service detector does not have (http)`},
		{"monitor scrapes the limiter's gRPC port", checkMonitoring, func(m *model) {
			monitor(m, "limiter").Spec.Endpoints[0].Port = "grpc"
		}, "scrapes limiter port 8081, but its /metrics is on 8080"},
		{"service with /metrics has no monitor", checkMonitoring, func(m *model) {
			drop(m.monitoring, "ServiceMonitor", "console")
		}, "console serves /metrics but no ServiceMonitor or PodMonitor scrapes it"},
		{"CRITICAL limiter has no monitor", checkMonitoring, func(m *model) {
			drop(m.monitoring, "ServiceMonitor", criticalLimiter)
		}, "limiter-critical serves /metrics but no ServiceMonitor or PodMonitor scrapes it"},
		{"pod monitor names a port the container lacks", checkMonitoring, func(m *model) {
			o := monitor(m, "dlq-auditor")
			o.Kind, o.Spec.PodMetricsEndpoints, o.Spec.Endpoints = "PodMonitor", o.Spec.Endpoints, nil
			require.Empty(t, checkMonitoring(m), "a PodMonitor on port http must pass")
			o.Spec.PodMetricsEndpoints[0].Port = "metrics"
		}, `PodMonitor dlq-auditor: names port "metrics", which container dlq-auditor does not declare`},
		{"monitor path not /metrics", checkMonitoring, func(m *model) {
			monitor(m, "adjuster").Spec.Endpoints[0].Path = "/metric"
		}, `path "/metric", want /metrics`},
		{"monitor scrapes what the policies block", checkMonitoring, func(m *model) {
			drop(m.base, "NetworkPolicy", "allow-prometheus")
		}, "no NetworkPolicy admits Prometheus (namespace monitoring) to limiter port 8080"},
		{"monitor in the base needs the CRDs", checkMonitoring, func(m *model) {
			m.base.objects = append(m.base.objects, monitor(m, "quota"))
		}, "needs the Prometheus Operator's CRDs"},
		{"docs missing a build", checkDocs, func(m *model) { m.docs = strings.ReplaceAll(m.docs, "--target quota", "") }, "how to build quota"},
		{"docs missing a table", checkDocs, func(m *model) { m.docs = strings.ReplaceAll(m.docs, "floodgate_quota_ledger", "") }, "table floodgate_quota_ledger"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := loadModel(t)
			require.Empty(t, tt.check(m), "the check must pass before the break")
			tt.break_(m)
			problems := strings.Join(tt.check(m), "\n")
			require.Contains(t, problems, tt.want)
		})
	}
}
