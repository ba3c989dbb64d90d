package rollout

import "strings"

// DiffLine is one line of a line diff: Op is ' ' (in both), '-' (only in
// the old text) or '+' (only in the new one).
type DiffLine struct {
	Op   byte
	Text string
}

// maxDiffCells bounds the diff's table (old lines × new lines); past it the
// diff is the whole old text removed and the whole new text added.
const maxDiffCells = 4_000_000

// Diff returns the line diff from old to new (longest common subsequence).
func Diff(old, new string) []DiffLine {
	a, b := splitLines(old), splitLines(new)
	if len(a)*len(b) > maxDiffCells {
		out := make([]DiffLine, 0, len(a)+len(b))
		for _, l := range a {
			out = append(out, DiffLine{'-', l})
		}
		for _, l := range b {
			out = append(out, DiffLine{'+', l})
		}
		return out
	}
	// lcs[i][j] = length of the LCS of a[i:] and b[j:]
	lcs := make([][]int32, len(a)+1)
	for i := range lcs {
		lcs[i] = make([]int32, len(b)+1)
	}
	for i := len(a) - 1; i >= 0; i-- {
		for j := len(b) - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out []DiffLine
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		switch {
		case a[i] == b[j]:
			out = append(out, DiffLine{' ', a[i]})
			i, j = i+1, j+1
		case lcs[i+1][j] >= lcs[i][j+1]:
			out = append(out, DiffLine{'-', a[i]})
			i++
		default:
			out = append(out, DiffLine{'+', b[j]})
			j++
		}
	}
	for ; i < len(a); i++ {
		out = append(out, DiffLine{'-', a[i]})
	}
	for ; j < len(b); j++ {
		out = append(out, DiffLine{'+', b[j]})
	}
	return out
}

// DiffStat counts the added and removed lines of d.
func DiffStat(d []DiffLine) (added, removed int) {
	for _, l := range d {
		switch l.Op {
		case '+':
			added++
		case '-':
			removed++
		}
	}
	return added, removed
}

// FormatDiff renders d as unified-diff-style lines ("+x", "-y", " z").
func FormatDiff(d []DiffLine) string {
	var b strings.Builder
	for _, l := range d {
		b.WriteByte(l.Op)
		b.WriteString(l.Text)
		b.WriteByte('\n')
	}
	return b.String()
}

func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(strings.TrimSuffix(s, "\n"), "\n")
}
