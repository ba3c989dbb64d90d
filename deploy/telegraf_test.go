package deploy_test

import (
	"fmt"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTelegrafPackaging checks Telegraf, the writer of the adjuster's cpu and mem signals, as it
// ships: one deploy/telegraf/telegraf.conf for the local stack, compose and Kubernetes (the
// rendered ConfigMap is the file), one Telegraf version in all three, every variable the file
// reads given by each (or defaulted in it) and none given that it does not read, and in
// Kubernetes a DaemonSet that runs unprivileged with a NetworkPolicy letting it reach InfluxDB.
// TestTelegrafWritesWhatTheAdjusterReads (services/adjuster) runs the file for real.
func TestTelegrafPackaging(t *testing.T) {
	m := loadModel(t)
	conf := string(readFile(t, filepath.Join(m.root, "deploy/telegraf/telegraf.conf")))
	// ${NAME} or ${NAME:-default}: the variables the file reads, and which have no default.
	reads, required := map[string]bool{}, map[string]bool{}
	for _, v := range regexp.MustCompile(`\$\{([A-Z0-9_]+)(:-[^}]*)?\}`).FindAllStringSubmatch(conf, -1) {
		reads[v[1]] = true
		if v[2] == "" {
			required[v[1]] = true
		}
	}
	require.NotEmpty(t, reads)
	// CPU sheds on the median of a 15 s window, which needs three points of each writer
	// (docs/adjuster.md, "Priority shedding"): Telegraf writes every 5 s unless told otherwise,
	// and nothing ships telling it otherwise.
	interval := regexp.MustCompile(`\$\{FLOODGATE_TELEGRAF_INTERVAL:-([^}]*)\}`).FindAllStringSubmatch(conf, -1)
	require.Len(t, interval, 2, "interval and flush_interval")
	for _, d := range interval {
		require.Equal(t, "5s", d[1], "telegraf.conf's default interval")
	}

	stack := string(readFile(t, filepath.Join(m.root, "deploy/local/stack.sh")))
	v := regexp.MustCompile(`(?m)^TELEGRAF_VERSION=(\S+)$`).FindStringSubmatch(stack)
	require.NotNil(t, v, "deploy/local/stack.sh: no TELEGRAF_VERSION")
	image := "telegraf:" + v[1]

	svc := m.compose.Services["telegraf"]
	require.NotNil(t, svc, "compose: no telegraf service")
	require.Equal(t, image, svc.Image, "compose runs the local stack's Telegraf")
	require.Contains(t, svc.Command, "--strict-env-handling")
	require.Equal(t, []string{"./telegraf/telegraf.conf:/etc/telegraf/telegraf.conf:ro"}, svc.Volumes, "the file, and no host path")
	require.True(t, svc.ReadOnly)
	require.NotContains(t, []string{"", "0", "root", "0:0"}, svc.User, "compose telegraf runs as root: the image's entrypoint would setpriv, which cap_drop forbids")
	require.Equal(t, []string{"ALL"}, svc.CapDrop)
	checkEnv(t, "compose telegraf", slices.Collect(maps.Keys(svc.Environment)), reads, required)

	for _, k := range []*rendered{m.base, m.overlay} {
		ds := k.find("DaemonSet", "telegraf")
		require.NotNil(t, ds, "%s: no DaemonSet telegraf", k.where)
		pod := ds.Spec.Template.Spec
		require.Len(t, pod.Containers, 1)
		c := pod.Containers[0]
		require.Equal(t, image, c.Image, "%s: the local stack's Telegraf", k.where)
		require.Contains(t, c.Args, "--strict-env-handling")
		i := slices.Index(c.Args, "--config")
		require.Positive(t, i, "%s: --config", k.where)
		dir, file := filepath.Split(c.Args[i+1])
		require.Equal(t, "telegraf.conf", file)
		var names []string
		tokenRef := ""
		for _, e := range c.Env {
			names = append(names, e.Name)
			switch {
			case e.Name == "FLOODGATE_INFLUX_TOKEN" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
				tokenRef = e.ValueFrom.SecretKeyRef.Key
			case e.Name == "FLOODGATE_TELEGRAF_INTERVAL":
				require.Equal(t, "5s", e.Value, "%s: the shed window needs three points", k.where)
			}
		}
		checkEnv(t, k.where+" DaemonSet telegraf", names, reads, required)
		// Every node holds Telegraf's token: its own (write-only, docs/adjuster.md), never the
		// services' FLOODGATE_INFLUX_TOKEN.
		require.Equal(t, "telegraf-influx-token", tokenRef, "%s: Telegraf's InfluxDB token", k.where)

		// The file it reads is the ConfigMap generated from deploy/telegraf/telegraf.conf.
		cmName := ""
		for _, vm := range c.VolumeMounts {
			if strings.TrimSuffix(vm.MountPath, "/") != strings.TrimSuffix(dir, "/") {
				continue
			}
			for _, v := range pod.Volumes {
				if v.Name == vm.Name && v.ConfigMap != nil {
					cmName = v.ConfigMap.Name
				}
			}
		}
		require.NotEmpty(t, cmName, "%s: no ConfigMap mounted at %s", k.where, dir)
		cm := k.find("ConfigMap", cmName)
		require.NotNil(t, cm, "%s: ConfigMap %s", k.where, cmName)
		data, _ := cm.raw["data"].(map[string]any)
		require.Equal(t, conf, data["telegraf.conf"], "%s: the ConfigMap is deploy/telegraf/telegraf.conf", k.where)

		// Unprivileged, read-only, and no host path: a container's /proc/stat is the node's.
		require.True(t, pod.SecurityContext != nil && pod.SecurityContext.RunAsNonRoot != nil && *pod.SecurityContext.RunAsNonRoot, k.where)
		sc := c.SecurityContext
		require.True(t, sc != nil && sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem, k.where)
		require.True(t, sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation, k.where)
		require.True(t, sc.Capabilities != nil && slices.Contains(sc.Capabilities.Drop, "ALL") && len(sc.Capabilities.Add) == 0, k.where)
		spec, _ := ds.raw["spec"].(map[string]any)
		tmpl, _ := spec["template"].(map[string]any)
		require.NotContains(t, fmt.Sprint(tmpl), "hostPath", k.where)

		// Egress to InfluxDB past the namespace's default deny.
		labels := ds.Spec.Template.Metadata.Labels
		reach := false
		for _, np := range k.kind("NetworkPolicy") {
			if !slices.Contains(np.Spec.PolicyTypes, "Egress") || np.Spec.PodSelector == nil || !np.Spec.PodSelector.matches(labels) {
				continue
			}
			for _, r := range np.Spec.Egress {
				reach = reach || r.allows(8086)
			}
		}
		require.True(t, reach, "%s: no NetworkPolicy lets Telegraf reach InfluxDB on 8086", k.where)
	}
}

// checkEnv requires that the variables set are ones the file reads, and include every one it
// reads without a default.
func checkEnv(t *testing.T, where string, set []string, reads, required map[string]bool) {
	t.Helper()
	for _, n := range set {
		require.True(t, reads[n], "%s sets %s, which telegraf.conf does not read", where, n)
	}
	for n := range required {
		require.Contains(t, set, n, "%s: telegraf.conf reads %s, with no default", where, n)
	}
}
