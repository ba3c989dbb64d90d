package deploy_test

// The Kubernetes packaging as a cluster receives it: deploy/k8s's kustomizations rendered
// in-process with kustomize's own code (sigs.k8s.io/kustomize/api/krusty, what `kubectl
// kustomize` runs) from an in-memory copy of deploy/k8s. The checks read the render, so
// generated names, patches, name suffixes and label transforms are kustomize's, not a guess at
// them; no kubectl is needed.

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// The kustomizations the checks render, relative to the repository root.
const (
	k8sDir        = "deploy/k8s"
	baseDir       = k8sDir + "/base"
	overlayDir    = k8sDir + "/overlays/production"
	monitoringDir = k8sDir + "/monitoring"
	telegrafDir   = "deploy/telegraf"
)

// rendered is the output of one kustomization.
type rendered struct {
	dir     string // the kustomization, relative to the repository root
	where   string // how problems name it
	objects []*k8sObject
}

// k8sSources copies root's deploy/k8s, and deploy/telegraf that the base includes, into an
// in-memory filesystem, at the same paths under /.
func k8sSources(root string) (filesys.FileSystem, error) {
	fsys := filesys.MakeFsInMemory()
	for _, dir := range []string{k8sDir, telegrafDir} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			return fsys.WriteFile("/"+rel(root, path), b)
		})
		if err != nil {
			return nil, err
		}
	}
	return fsys, nil
}

// renderAll renders the base, the production overlay and the monitoring objects of fsys, as
// `kubectl kustomize DIR` prints them.
func renderAll(fsys filesys.FileSystem) (map[string][]byte, error) {
	opts := krusty.MakeDefaultOptions()
	opts.Reorder = krusty.ReorderOptionLegacy // kubectl's order
	out := map[string][]byte{}
	for _, dir := range []string{baseDir, overlayDir, monitoringDir} {
		rm, err := krusty.MakeKustomizer(opts).Run(fsys, "/"+dir)
		if err != nil {
			return nil, fmt.Errorf("kustomize %s: %w", dir, err)
		}
		if out[dir], err = rm.AsYaml(); err != nil {
			return nil, fmt.Errorf("kustomize %s: %w", dir, err)
		}
	}
	return out, nil
}

// committed are the renders of the files as they are, made once; loadModel decodes a fresh copy
// for each test, which may break it.
var committed = sync.OnceValues(func() (map[string][]byte, error) {
	root, err := filepath.Abs("..")
	if err != nil {
		return nil, err
	}
	fsys, err := k8sSources(root)
	if err != nil {
		return nil, err
	}
	return renderAll(fsys)
})

// setRenders decodes renders into m's base, overlay and monitoring.
func (m *model) setRenders(t *testing.T, renders map[string][]byte) {
	t.Helper()
	m.base = decodeRender(t, baseDir, "k8s", renders[baseDir])
	m.overlay = decodeRender(t, overlayDir, "k8s overlay production", renders[overlayDir])
	m.monitoring = decodeRender(t, monitoringDir, "k8s monitoring", renders[monitoringDir])
}

// rerender renders the sources again after edit has changed them (a path relative to the
// repository root → its new content), for a test that breaks a kustomization rather than its
// output.
func (m *model) rerender(t *testing.T, edit map[string]func(string) string) {
	t.Helper()
	fsys, err := k8sSources(m.root)
	require.NoError(t, err)
	for path, f := range edit {
		b, err := fsys.ReadFile("/" + path)
		require.NoError(t, err)
		changed := f(string(b))
		require.NotEqual(t, string(b), changed, "the edit of %s changes nothing", path)
		require.NoError(t, fsys.WriteFile("/"+path, []byte(changed)))
	}
	renders, err := renderAll(fsys)
	require.NoError(t, err)
	m.setRenders(t, renders)
}

func decodeRender(t *testing.T, dir, where string, raw []byte) *rendered {
	t.Helper()
	k := &rendered{dir: dir, where: where}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if err != nil {
			require.ErrorContains(t, err, "EOF", dir)
			break
		}
		var o k8sObject
		require.NoError(t, doc.Decode(&o), dir)
		require.NoError(t, doc.Decode(&o.raw), dir)
		k.objects = append(k.objects, &o)
	}
	require.NotEmpty(t, k.objects, "kustomize %s rendered nothing", dir)
	return k
}

func (k *rendered) find(kind, name string) *k8sObject {
	for _, o := range k.objects {
		if o.Kind == kind && o.Metadata.Name == name {
			return o
		}
	}
	return nil
}

func (k *rendered) kind(kind string) []*k8sObject {
	var out []*k8sObject
	for _, o := range k.objects {
		if o.Kind == kind {
			out = append(out, o)
		}
	}
	return out
}

// hashSuffix is the hash of its content kustomize appends to a generated ConfigMap's or
// Secret's name (hex digits, some replaced by consonants).
var hashSuffix = regexp.MustCompile(`-[24-9bcdfghkmt]{10}$`)

// generatorName is the name of the generator that made o: its name less the content hash.
func generatorName(o *k8sObject) string {
	return hashSuffix.ReplaceAllString(o.Metadata.Name, "")
}

// generated is the ConfigMap or Secret generator name made, or nil.
func (k *rendered) generated(kind, name string) *k8sObject {
	for _, o := range k.kind(kind) {
		if generatorName(o) == name {
			return o
		}
	}
	return nil
}

// namespace is where k's namespaced objects go.
func (k *rendered) namespace() string {
	for _, o := range k.objects {
		if o.Metadata.Namespace != "" {
			return o.Metadata.Namespace
		}
	}
	return ""
}

// values are a ConfigMap's data, or a Secret's decoded; a value that is not base64 stays as is.
func (o *k8sObject) values() map[string]string {
	out := map[string]string{}
	for key, v := range o.Data {
		if o.Kind == "Secret" {
			if b, err := base64.StdEncoding.DecodeString(v); err == nil {
				v = string(b)
			}
		}
		out[key] = v
	}
	return out
}

// setValue sets (value "<delete>": deletes) key of the ConfigMap or Secret generator name made.
func (k *rendered) setValue(t *testing.T, kind, name, key, value string) {
	t.Helper()
	o := k.generated(kind, name)
	require.NotNil(t, o, "%s: %s %s", k.dir, kind, name)
	if value == "<delete>" {
		require.Contains(t, o.Data, key)
		delete(o.Data, key)
		return
	}
	if kind == "Secret" {
		value = base64.StdEncoding.EncodeToString([]byte(value))
	}
	if o.Data == nil {
		o.Data = map[string]string{}
	}
	o.Data[key] = value
}

// keyRef resolves a configMapKeyRef or secretKeyRef: the value, and whether k holds the key.
func (k *rendered) keyRef(kind string, r *keyRef) (string, bool) {
	o := k.find(kind, r.Name)
	if o == nil {
		return "", false
	}
	v, ok := o.values()[r.Key]
	return v, ok
}

// env resolves the variables of w's container: literal values, ConfigMap keys from the
// ConfigMap they name, "<ref>" for Secrets and fields.
func (k *rendered) env(w workload) map[string]string {
	out := map[string]string{}
	c := w.main()
	if c == nil {
		return out
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			out[e.Name] = e.Value
		case e.ValueFrom.ConfigMapKeyRef != nil:
			out[e.Name], _ = k.keyRef("ConfigMap", e.ValueFrom.ConfigMapKeyRef)
		default:
			out[e.Name] = "<ref>"
		}
	}
	return out
}

// config is the floodgate-config ConfigMap's data, nil without one.
func (k *rendered) config() map[string]string {
	if o := k.generated("ConfigMap", "floodgate-config"); o != nil {
		return o.values()
	}
	return nil
}
