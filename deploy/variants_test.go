package deploy_test

// Variants of a program's Deployment (the CRITICAL limiter, limiter-critical;
// docs/envoy.md, "CRITICAL routes through a cluster of their own"): the same program under
// another name, for other callers. The rules every workload meets run on it through
// m.workloads; checkVariants holds it to its program's own Deployment, so the two cannot drift:
// the same pod spec all but the resources and the pods' name label, in the base and in the
// overlay; pods no selector of the other takes; the same callers from other namespaces and the
// same egress.

import (
	"cmp"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// criticalLimiter is the Deployment and Service Envoy's CRITICAL rate-limit cluster addresses.
const criticalLimiter = "limiter-critical"

const nameLabel = "app.kubernetes.io/name"

// shape is what a variant shares with its program's Deployment: the object's metadata and spec
// (a patch's too) without the replicas, the selector, the name label, the containers' resources
// and the topology spread's selector (each spreads its own pods); nil for no object.
func shape(o *k8sObject) map[string]any {
	if o == nil {
		return nil
	}
	out := map[string]any{"metadata": clone(o.raw["metadata"]), "spec": clone(o.raw["spec"])}
	meta, _ := out["metadata"].(map[string]any)
	delete(meta, "name")
	if labels, ok := meta["labels"].(map[string]any); ok {
		delete(labels, nameLabel)
	}
	spec, _ := out["spec"].(map[string]any)
	delete(spec, "replicas")
	delete(spec, "selector")
	tmpl, _ := spec["template"].(map[string]any)
	if labels, ok := dig(tmpl, "metadata")["labels"].(map[string]any); ok {
		delete(labels, nameLabel)
	}
	pod := dig(tmpl, "spec")
	for _, c := range list(pod["containers"]) {
		if c, ok := c.(map[string]any); ok {
			delete(c, "resources")
		}
	}
	for _, tc := range list(pod["topologySpreadConstraints"]) {
		if tc, ok := tc.(map[string]any); ok {
			delete(tc, "labelSelector")
		}
	}
	return out
}

func clone(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[k] = clone(e)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = clone(e)
		}
		return out
	}
	return v
}

// dig follows keys through nested maps; a missing step yields an empty map.
func dig(m map[string]any, keys ...string) map[string]any {
	for _, k := range keys {
		next, _ := m[k].(map[string]any)
		m = next
	}
	if m == nil {
		return map[string]any{}
	}
	return m
}

func list(v any) []any {
	l, _ := v.([]any)
	return l
}

// diffPaths lists where a and b differ, as dotted paths under at.
func diffPaths(at string, a, b any) []string {
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if aok && bok {
		var out []string
		for _, k := range slices.Sorted(maps.Keys(keySet(am, bm))) {
			out = append(out, diffPaths(at+"."+k, am[k], bm[k])...)
		}
		return out
	}
	al, aok := a.([]any)
	bl, bok := b.([]any)
	if aok && bok && len(al) == len(bl) {
		var out []string
		for i := range al {
			out = append(out, diffPaths(fmt.Sprintf("%s[%d]", at, i), al[i], bl[i])...)
		}
		return out
	}
	if reflect.DeepEqual(a, b) {
		return nil
	}
	return []string{strings.TrimPrefix(at, ".")}
}

func keySet(ms ...map[string]any) map[string]bool {
	out := map[string]bool{}
	for _, m := range ms {
		for k := range m {
			out[k] = true
		}
	}
	return out
}

// patch is the overlay's patch of kind/name, or nil.
func (k *kustomization) patch(kind, name string) *k8sObject {
	for _, p := range k.patches {
		if p.Kind == kind && p.Metadata.Name == name {
			return p
		}
	}
	return nil
}

// selects reports whether o's selector (a Service's map, or a label selector) takes labels.
func selects(o *k8sObject, labels map[string]string) bool {
	if o.Kind == "Service" {
		sel := o.serviceSelector()
		return len(sel) > 0 && (&labelSelector{MatchLabels: sel}).matches(labels)
	}
	sel := o.labelSelector()
	return sel != nil && len(sel.MatchLabels)+len(sel.MatchExpressions) > 0 && sel.matches(labels)
}

// callersFromNamespaces lists who may connect to pods with labels from other namespaces, as
// "peer → port": a rule without `from` is "anyone". In-namespace callers (podSelector peers)
// are left out: they name one Service, and a variant serves other callers than its program's.
func callersFromNamespaces(policies []*k8sObject, labels map[string]string) []string {
	var out []string
	for _, np := range policies {
		if !slices.Contains(np.Spec.PolicyTypes, "Ingress") || !np.Spec.PodSelector.matches(labels) {
			continue
		}
		for _, r := range np.Spec.Ingress {
			var peers []string
			if len(r.From) == 0 {
				peers = []string{"anyone"}
			}
			for _, f := range r.From {
				if p, ok := f.(map[string]any); ok && p["namespaceSelector"] != nil {
					b, _ := yaml.Marshal(p)
					peers = append(peers, strings.Join(strings.Fields(string(b)), " "))
				}
			}
			for _, peer := range peers {
				if len(r.Ports) == 0 {
					out = append(out, peer+" → every port")
				}
				for _, p := range r.Ports {
					out = append(out, fmt.Sprintf("%s → %s/%d", peer, cmp.Or(p.Protocol, "TCP"), p.Port.num))
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// egressPorts are the ports named by any egress rule (and DNS) that pods with labels may reach.
func egressPorts(policies []*k8sObject, labels map[string]string) []int {
	ports := []int{53}
	for _, np := range policies {
		for _, r := range np.Spec.Egress {
			for _, p := range r.Ports {
				ports = append(ports, p.Port.num)
			}
		}
	}
	var out []int
	for _, p := range ports {
		if egressAllowed(policies, labels, p) && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

func checkVariants(m *model) []string {
	var out []string
	for _, w := range m.workloads(m.base) {
		if !w.variant() {
			continue
		}
		own := m.own(m.base, w)
		if own == nil {
			out = append(out, fmt.Sprintf("k8s %s %s: runs %s, which has no %s %s of its own to copy", w.obj.Kind, w.name(), w.prog.name, w.obj.Kind, w.prog.name))
			continue
		}
		out = append(out, m.variantSpec(w, *own)...)
		out = append(out, m.variantSelectors(w, *own)...)
		out = append(out, m.variantNetwork(w, *own)...)
	}
	return out
}

// variantSpec: w's pod spec is own's, in the base and in the overlay's patches, but for shape's
// exceptions; its topology spread selects its own pods.
func (m *model) variantSpec(w, own workload) []string {
	var out []string
	where := fmt.Sprintf("k8s %s %s", w.obj.Kind, w.name())
	why := fmt.Sprintf("differs from %s %s's (a variant differs from its program's only in name, labels and resources)", own.obj.Kind, own.name())
	for _, p := range diffPaths("", shape(own.obj), shape(w.obj)) {
		out = append(out, fmt.Sprintf("%s: %s %s", where, p, why))
	}
	ownPatch, patch := m.overlay.patch(own.obj.Kind, own.name()), m.overlay.patch(w.obj.Kind, w.name())
	switch {
	case (ownPatch == nil) != (patch == nil):
		out = append(out, fmt.Sprintf("k8s overlay production: patches one of %s %s and %s, not both", w.obj.Kind, own.name(), w.name()))
	case patch != nil:
		for _, p := range diffPaths("", shape(ownPatch), shape(patch)) {
			out = append(out, fmt.Sprintf("k8s overlay production %s %s: %s %s", w.obj.Kind, w.name(), p, why))
		}
	}
	for _, tc := range list(dig(w.obj.raw, "spec", "template", "spec")["topologySpreadConstraints"]) {
		var sel labelSelector
		tcm, _ := tc.(map[string]any)
		b, _ := yaml.Marshal(dig(tcm, "labelSelector"))
		if yaml.Unmarshal(b, &sel) != nil || len(sel.MatchLabels)+len(sel.MatchExpressions) == 0 || !sel.matches(w.obj.Spec.Template.Metadata.Labels) {
			out = append(out, where+": its topologySpreadConstraints must spread its own pods (labelSelector)")
		}
	}
	return out
}

// variantSelectors: no Service, PodDisruptionBudget or Deployment takes the pods of both, so
// the program's callers never reach the variant's pods and neither's budget counts the other's.
func (m *model) variantSelectors(w, own workload) []string {
	var out []string
	labels, ownLabels := w.obj.Spec.Template.Metadata.Labels, own.obj.Spec.Template.Metadata.Labels
	for _, kind := range []string{"Service", "PodDisruptionBudget", "Deployment"} {
		for _, o := range m.base.kind(kind) {
			if selects(o, labels) && selects(o, ownLabels) {
				out = append(out, fmt.Sprintf("k8s %s %s: %s %s selects its pods and %s's: give it a %s label of its own", w.obj.Kind, w.name(), kind, o.Metadata.Name, own.name(), nameLabel))
			}
		}
	}
	return out
}

// variantNetwork: the same callers from other namespaces (the gateways, Prometheus) and the
// same egress as own.
func (m *model) variantNetwork(w, own workload) []string {
	var out []string
	where := fmt.Sprintf("k8s %s %s", w.obj.Kind, w.name())
	policies := m.base.kind("NetworkPolicy")
	labels, ownLabels := w.obj.Spec.Template.Metadata.Labels, own.obj.Spec.Template.Metadata.Labels
	want, got := callersFromNamespaces(policies, ownLabels), callersFromNamespaces(policies, labels)
	for _, c := range want {
		if !slices.Contains(got, c) {
			out = append(out, fmt.Sprintf("%s: no NetworkPolicy admits %s, as for %s", where, c, own.name()))
		}
	}
	for _, c := range got {
		if !slices.Contains(want, c) {
			out = append(out, fmt.Sprintf("%s: a NetworkPolicy admits %s, which %s does not", where, c, own.name()))
		}
	}
	if wantE, gotE := egressPorts(policies, ownLabels), egressPorts(policies, labels); !slices.Equal(wantE, gotE) {
		out = append(out, fmt.Sprintf("%s: may reach ports %v, %s %v", where, gotE, own.name(), wantE))
	}
	return out
}

// TestCriticalLimiter: the Deployment and Service Envoy's CRITICAL cluster addresses
// (docs/envoy.md) are the limiter's, container and all, with a CPU budget of their own.
func TestCriticalLimiter(t *testing.T) {
	m := loadModel(t)
	o := m.base.find("Deployment", criticalLimiter)
	require.NotNil(t, o, "deploy/k8s/base/limiter-critical.yaml: Deployment %s", criticalLimiter)
	w := workload{o, m.programOf(o)}
	require.NotNil(t, w.prog)
	require.Equal(t, "limiter", w.prog.name, "it runs the limiter")
	own := m.own(m.base, w)
	require.NotNil(t, own)

	// The pod spec, container (image, env, ports, probes, lifecycle, security) included, is the
	// limiter's but for resources and the name label; in production too.
	require.Equal(t, shape(own.obj), shape(w.obj), "deploy/k8s/base: %s against limiter", criticalLimiter)
	require.NotNil(t, m.overlay.patch("Deployment", criticalLimiter), "the overlay patches it as it patches the limiter")
	require.Equal(t, shape(m.overlay.patch("Deployment", "limiter")), shape(m.overlay.patch("Deployment", criticalLimiter)),
		"deploy/k8s/overlays/production: %s against limiter", criticalLimiter)
	require.Empty(t, checkVariants(m))

	svc := m.base.find("Service", criticalLimiter)
	require.NotNil(t, svc, "Envoy's CRITICAL cluster addresses Service %s", criticalLimiter)
	require.True(t, slices.ContainsFunc(svc.Spec.Ports, func(p struct {
		Name       string      `yaml:"name"`
		Port       int         `yaml:"port"`
		TargetPort intOrString `yaml:"targetPort"`
	}) bool {
		return p.Name == "grpc" && p.Port == 8081
	}), "Service %s: grpc port 8081, the address docs/envoy.md gives Envoy", criticalLimiter)

	// A CPU limit well above what it uses: at least 3× the CPU its HPA holds it at. A 0.5-core
	// limit at 14–19 % of a core (about 3×) met the CRITICAL p99 target, 0.25 core did not
	// (docs/chaos.md, 2026-12-02 01:00–02:12).
	c := w.main()
	require.NotNil(t, c)
	request, limit := millicores(t, c.Resources.Requests["cpu"]), millicores(t, c.Resources.Limits["cpu"])
	h := m.base.autoscaler(criticalLimiter)
	require.NotNil(t, h)
	var target int
	for _, mt := range list(dig(h.raw, "spec")["metrics"]) {
		mm, _ := mt.(map[string]any)
		if r := dig(mm, "resource"); r["name"] == "cpu" {
			target, _ = dig(r, "target")["averageUtilization"].(int)
		}
	}
	require.Positive(t, target, "HorizontalPodAutoscaler %s: a CPU utilization target", criticalLimiter)
	used := request * target / 100
	require.GreaterOrEqual(t, limit, 3*used, "CPU limit %dm against %dm held by the HPA (%d %% of %dm)", limit, used, target, request)
}

// millicores parses a CPU quantity ("2", "500m", "0.5").
func millicores(t *testing.T, q string) int {
	t.Helper()
	if v, ok := strings.CutSuffix(q, "m"); ok {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, q)
		return n
	}
	f, err := strconv.ParseFloat(q, 64)
	require.NoError(t, err, q)
	return int(f * 1000)
}
