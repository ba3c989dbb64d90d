package deploy_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var (
	// A variable name in code: a complete FLOODGATE_ string literal.
	codeVar = regexp.MustCompile(`"(FLOODGATE_[A-Z0-9_]*[A-Z0-9])"`)
	// A variable name in the docs, possibly with alternations:
	// FLOODGATE_DETECTOR_<RAPID_FIRE|BOT_LIKE>_MODE, FLOODGATE_X_{A,B}_TAGS.
	docVar = regexp.MustCompile(`FLOODGATE_[A-Z0-9_]*(?:(?:<[A-Z0-9_|]+>|\{[A-Z0-9_,]+\})[A-Z0-9_]*)*`)
	alt    = regexp.MustCompile(`<([A-Z0-9_|]+)>|\{([A-Z0-9_,]+)\}`)
)

// expand spells out a documented name's alternations.
func expand(name string) []string {
	m := alt.FindStringSubmatchIndex(name)
	if m == nil {
		return []string{name}
	}
	var choices, sep string
	if m[2] >= 0 {
		choices, sep = name[m[2]:m[3]], "|"
	} else {
		choices, sep = name[m[4]:m[5]], ","
	}
	var out []string
	for _, c := range strings.Split(choices, sep) {
		out = append(out, expand(name[:m[0]]+c+name[m[1]:])...)
	}
	return out
}

// TestEveryVariableIsDocumented: every FLOODGATE_* variable a program reads
// (a string literal in non-test Go code) is named in the docs (docs/*.md,
// README.md, deploy/local/README.md, schemas/**/*.md) — a new setting without
// documentation fails here, naming it.
func TestEveryVariableIsDocumented(t *testing.T) {
	root := ".."
	inCode := map[string][]string{}
	require.NoError(t, filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".local" || d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range codeVar.FindAllStringSubmatch(string(b), -1) {
			inCode[m[1]] = append(inCode[m[1]], path)
		}
		return nil
	}))
	require.Greater(t, len(inCode), 100, "the walk found the programs' variables")

	documented := map[string]bool{}
	var docs []string
	for _, pattern := range []string{"docs/*.md", "README.md", "deploy/local/README.md", "schemas/*.md", "schemas/*/*.md"} {
		m, err := filepath.Glob(filepath.Join(root, pattern))
		require.NoError(t, err)
		docs = append(docs, m...)
	}
	for _, f := range docs {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, name := range docVar.FindAllString(string(b), -1) {
			for _, n := range expand(name) {
				documented[n] = true
			}
		}
	}
	var missing []string
	for name, where := range inCode {
		if !documented[name] {
			missing = append(missing, name+" (read in "+where[0]+")")
		}
	}
	slices.Sort(missing)
	require.Empty(t, missing, "variables the code reads that no doc names (docs/configuration.md lists the shared ones, docs/<service>.md the rest)")
}

func TestExpandAlternations(t *testing.T) {
	require.Equal(t, []string{"FLOODGATE_D_A_MODE", "FLOODGATE_D_B_MODE"}, expand("FLOODGATE_D_<A|B>_MODE"))
	require.Equal(t, []string{"FLOODGATE_X_H_T", "FLOODGATE_X_I_T"}, expand("FLOODGATE_X_{H,I}_T"))
	require.Equal(t, []string{"FLOODGATE_Y"}, expand("FLOODGATE_Y"))
}
