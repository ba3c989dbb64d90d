package deploy_test

// Variants of a program's Deployment (the CRITICAL limiter, limiter-critical; docs/envoy.md,
// "CRITICAL routes through a cluster of their own"): the same program under another name, for
// other callers. deploy/k8s/base/limiter-critical derives it from the limiter's manifests with
// kustomize (a name suffix, a name label, patches of its CPU request and HPA); what comes out is
// held here, in the base's render and in the production overlay's. The rules every workload
// meets run on it through m.workloads; checkVariants holds it to its program's own Deployment:
// the same pod spec but for the resources and the pods' name label; pods no selector of the
// other takes and an autoscaler of its own; the same callers from other namespaces and the same
// egress.

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
// without the name, the name label (the object's, its selector's, its pods' and its topology
// spread's), the replicas and the containers' resources; nil for no object.
func shape(o *k8sObject) map[string]any {
	if o == nil {
		return nil
	}
	out := map[string]any{"metadata": clone(o.raw["metadata"]), "spec": clone(o.raw["spec"])}
	meta, spec := dig(out, "metadata"), dig(out, "spec")
	delete(meta, "name")
	delete(dig(meta, "labels"), nameLabel)
	delete(spec, "replicas")
	delete(dig(spec, "selector", "matchLabels"), nameLabel)
	delete(dig(spec, "template", "metadata", "labels"), nameLabel)
	pod := dig(spec, "template", "spec")
	for _, c := range list(pod["containers"]) {
		if c, ok := c.(map[string]any); ok {
			delete(c, "resources")
		}
	}
	for _, tc := range list(pod["topologySpreadConstraints"]) {
		if tc, ok := tc.(map[string]any); ok {
			delete(dig(tc, "labelSelector", "matchLabels"), nameLabel)
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

// selects reports whether o's selector (a Service's map, or a label selector) takes labels.
func selects(o *k8sObject, labels map[string]string) bool {
	if o.Kind == "Service" {
		return selectsPods(o, labels)
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
	for _, k := range m.renders() {
		for _, w := range m.workloads(k) {
			if !w.variant() {
				continue
			}
			own := m.own(k, w)
			if own == nil {
				out = append(out, fmt.Sprintf("%s %s %s: runs %s, which has no %s %s of its own to derive from", k.where, w.obj.Kind, w.name(), w.prog.name, w.obj.Kind, w.prog.name))
				continue
			}
			out = append(out, variantSpec(k, w, *own)...)
			out = append(out, variantSelectors(k, w, *own)...)
			out = append(out, variantNetwork(k, w, *own)...)
		}
	}
	return out
}

// variantSpec: w's pod spec is own's but for shape's exceptions; its topology spread selects its
// own pods.
func variantSpec(k *rendered, w, own workload) []string {
	var out []string
	where := fmt.Sprintf("%s %s %s", k.where, w.obj.Kind, w.name())
	for _, p := range diffPaths("", shape(own.obj), shape(w.obj)) {
		out = append(out, fmt.Sprintf("%s: %s differs from %s %s's (a variant differs from its program's only in name, name label and resources)", where, p, own.obj.Kind, own.name()))
	}
	for _, tc := range list(dig(w.obj.raw, "spec", "template", "spec")["topologySpreadConstraints"]) {
		var sel labelSelector
		tcm, _ := tc.(map[string]any)
		b, _ := yaml.Marshal(dig(tcm, "labelSelector"))
		if yaml.Unmarshal(b, &sel) != nil || len(sel.MatchLabels)+len(sel.MatchExpressions) == 0 || !sel.matches(w.labels()) || sel.matches(own.labels()) {
			out = append(out, where+": its topologySpreadConstraints must spread its own pods (labelSelector)")
		}
	}
	return out
}

// variantSelectors: no Service, PodDisruptionBudget or Deployment takes the pods of both, so
// the program's callers never reach the variant's pods and neither's budget counts the other's;
// no two HorizontalPodAutoscalers scale one of them.
func variantSelectors(k *rendered, w, own workload) []string {
	var out []string
	for _, kind := range []string{"Service", "PodDisruptionBudget", "Deployment"} {
		for _, o := range k.kind(kind) {
			if selects(o, w.labels()) && selects(o, own.labels()) {
				out = append(out, fmt.Sprintf("%s %s %s: %s %s selects its pods and %s's: give it a %s label of its own", k.where, w.obj.Kind, w.name(), kind, o.Metadata.Name, own.name(), nameLabel))
			}
		}
	}
	for _, d := range []workload{own, w} {
		var hpas []string
		for _, h := range k.kind("HorizontalPodAutoscaler") {
			if t := h.Spec.ScaleTargetRef; t != nil && t.Kind == d.obj.Kind && t.Name == d.name() {
				hpas = append(hpas, h.Metadata.Name)
			}
		}
		if len(hpas) > 1 {
			out = append(out, fmt.Sprintf("%s %s %s: %d HorizontalPodAutoscalers scale Deployment %s (%s), want one each", k.where, w.obj.Kind, w.name(), len(hpas), d.name(), strings.Join(hpas, ", ")))
		}
	}
	return out
}

// variantNetwork: the same callers from other namespaces (the gateways, Prometheus) and the
// same egress as own.
func variantNetwork(k *rendered, w, own workload) []string {
	var out []string
	where := fmt.Sprintf("%s %s %s", k.where, w.obj.Kind, w.name())
	policies := k.kind("NetworkPolicy")
	want, got := callersFromNamespaces(policies, own.labels()), callersFromNamespaces(policies, w.labels())
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
	if wantE, gotE := egressPorts(policies, own.labels()), egressPorts(policies, w.labels()); !slices.Equal(wantE, gotE) {
		out = append(out, fmt.Sprintf("%s: may reach ports %v, %s %v", where, gotE, own.name(), wantE))
	}
	return out
}

// checkCriticalLimiter: the Deployment and Service Envoy's CRITICAL cluster addresses
// (docs/envoy.md: limiter-critical.floodgate.svc:8081) run the limiter, with a CPU limit well
// above what it uses: at least 3× the CPU its HPA holds it at. A 0.5-core limit at 14–19 % of a
// core (about 3×) met the CRITICAL p99 target, 0.25 core did not (docs/chaos.md, 2026-12-02
// 01:00–02:12).
func checkCriticalLimiter(m *model) []string {
	var out []string
	for _, k := range m.renders() {
		where := fmt.Sprintf("%s Deployment %s", k.where, criticalLimiter)
		o := k.find("Deployment", criticalLimiter)
		p := m.programOf(o)
		if p == nil || p.name != "limiter" {
			out = append(out, where+": missing, or runs no limiter")
			continue
		}
		w := workload{o, p}
		svc := k.find("Service", criticalLimiter)
		if svc == nil || !selectsPods(svc, w.labels()) || !slices.ContainsFunc(svc.Spec.Ports, func(p struct {
			Name       string      `yaml:"name"`
			Port       int         `yaml:"port"`
			TargetPort intOrString `yaml:"targetPort"`
		}) bool {
			return p.Name == "grpc" && p.Port == 8081
		}) {
			out = append(out, fmt.Sprintf("%s Service %s: must select its pods on grpc port 8081, the address docs/envoy.md gives Envoy", k.where, criticalLimiter))
		}
		c := w.main()
		if c == nil {
			continue // checkWorkloads says so
		}
		request, okR := millicores(c.Resources.Requests["cpu"])
		limit, okL := millicores(c.Resources.Limits["cpu"])
		target := 0
		if h := k.autoscaler(criticalLimiter); h != nil {
			for _, mt := range list(dig(h.raw, "spec")["metrics"]) {
				mm, _ := mt.(map[string]any)
				if r := dig(mm, "resource"); r["name"] == "cpu" {
					target, _ = dig(r, "target")["averageUtilization"].(int)
				}
			}
		}
		if !okR || !okL || target <= 0 {
			out = append(out, where+": needs a CPU request, a CPU limit and an HPA on CPU utilization")
			continue
		}
		if used := request * target / 100; limit < 3*used {
			out = append(out, fmt.Sprintf("%s: CPU limit %dm is under 3× the %dm its HPA holds it at (%d %% of %dm)", where, limit, used, target, request))
		}
	}
	return out
}

// millicores parses a CPU quantity ("2", "500m", "0.5").
func millicores(q string) (int, bool) {
	if v, ok := strings.CutSuffix(q, "m"); ok {
		n, err := strconv.Atoi(v)
		return n, err == nil
	}
	f, err := strconv.ParseFloat(q, 64)
	return int(f * 1000), err == nil
}

// TestCriticalLimiter: the Deployment and Service Envoy's CRITICAL cluster addresses
// (docs/envoy.md) are the limiter's, container and all, with a CPU budget of their own, in the
// base and in production.
func TestCriticalLimiter(t *testing.T) {
	m := loadModel(t)
	for _, k := range m.renders() {
		t.Run(k.dir, func(t *testing.T) {
			for _, kind := range []string{"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"} {
				for _, name := range []string{"limiter", criticalLimiter} {
					require.NotNil(t, k.find(kind, name), "%s %s", kind, name)
				}
			}
			o := k.find("Deployment", criticalLimiter)
			w := workload{o, m.programOf(o)}
			require.NotNil(t, w.prog)
			require.Equal(t, "limiter", w.prog.name, "it runs the limiter")
			require.NotNil(t, w.main(), "in a container named limiter")
			require.Equal(t, "limiter", w.pod().ServiceAccountName, "as the limiter's ServiceAccount")
			require.Equal(t, criticalLimiter, w.labels()[nameLabel])
			own := m.own(k, w)
			require.NotNil(t, own)

			// The pod spec, container (image, env, ports, probes, lifecycle, security, volumes)
			// included, is the limiter's but for resources and the name label.
			require.Equal(t, shape(own.obj), shape(w.obj), "%s against limiter", criticalLimiter)
			require.NotEqual(t, own.main().Resources, w.main().Resources, "its own CPU budget")
		})
	}
	require.Empty(t, checkCriticalLimiter(m))
	require.Empty(t, checkVariants(m))
}
