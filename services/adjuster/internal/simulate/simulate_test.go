package simulate

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/services/adjuster/internal/control"
)

func TestReadCSVRejects(t *testing.T) {
	const head = "ts,cpu,mem,error_rate,abuse_rate\n"
	cases := []struct{ name, in, want string }{
		{"wrong header", "time,cpu,mem,error_rate,abuse_rate\n", "want"},
		{"bad time", head + "yesterday,0.1,0.1,0,0\n", "line 2: ts"},
		{"out of range", head + "2026-05-01T12:00:00Z,1.5,0.1,0,0\n", "line 2: cpu"},
		{"not increasing", head + "2026-05-01T12:00:00Z,0.1,0.1,0,0\n2026-05-01T12:00:00Z,0.1,0.1,0,0\n", "line 3"},
		{"too few cells", head + "2026-05-01T12:00:00Z,0.1\n", "wrong number of fields"},
		{"no rows", head, "no rows"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadCSV(strings.NewReader(tc.in))
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestReplayIncident(t *testing.T) {
	f, err := os.Open("../../testdata/incident.csv")
	require.NoError(t, err)
	defer f.Close()
	rows, err := ReadCSV(f)
	require.NoError(t, err)
	require.Len(t, rows, 240)

	res, err := Run(control.Defaults(), rows, nil)
	require.NoError(t, err)
	require.Len(t, res.Ticks, 240)
	var first control.Change
	stale := 0
	for _, tk := range res.Ticks {
		if first.Rule == "" && len(tk.Changes) > 0 {
			first = tk.Changes[0]
		}
		if len(tk.Stale) > 0 {
			stale++
			for _, ch := range tk.Changes {
				require.Less(t, ch.New, ch.Old+1e-9, "nothing rises while a signal is stale")
			}
		}
	}
	require.Equal(t, control.RuleCPUHigh, first.Rule)
	require.Positive(t, stale, "the memory gap goes stale")
	last := res.Ticks[len(res.Ticks)-1]
	require.Equal(t, map[string]float64{"global": 1, "tier:ip": 1}, last.Scales, "recovered after the incident")

	// A candidate with a milder cut never goes below 0.3 on this series.
	cand := control.Defaults()
	cand.Scopes["global"] = control.Bounds{Min: 0.3, Max: 1}
	res2, err := Run(cand, rows, nil)
	require.NoError(t, err)
	for _, tk := range res2.Ticks {
		require.GreaterOrEqual(t, tk.Scales["global"], 0.3)
	}

	var svg, page, csv bytes.Buffer
	require.NoError(t, res.SVG(&svg, "t <&>"))
	require.True(t, strings.HasPrefix(svg.String(), "<svg"))
	require.Contains(t, svg.String(), "t &lt;&amp;&gt;")
	require.Contains(t, svg.String(), "cpu_high 0.85")
	require.NoError(t, res.HTML(&page, "t"))
	require.Contains(t, page.String(), "<td>cpu_high</td>")
	require.NoError(t, WriteCSV(&csv, rows))
	again, err := ReadCSV(&csv)
	require.NoError(t, err)
	require.Equal(t, len(rows), len(again))
	require.Equal(t, rows[0].At, again[0].At)
}

func FuzzReadCSV(f *testing.F) {
	f.Add("ts,cpu,mem,error_rate,abuse_rate\n2026-05-01T12:00:00Z,0.5,,0.01,0\n")
	f.Add("ts,cpu,mem,error_rate,abuse_rate\n#c\n2026-05-01T12:00:00Z,\"0.5\",1,0,0\n")
	f.Fuzz(func(t *testing.T, in string) {
		rows, err := ReadCSV(strings.NewReader(in))
		if err != nil {
			return
		}
		for i, r := range rows {
			if i > 0 {
				require.True(t, r.At.After(rows[i-1].At))
			}
			for _, name := range control.AllSignals {
				if rd := r.Signals.Get(name); rd.OK {
					require.True(t, rd.Value >= 0 && rd.Value <= 1)
				}
			}
		}
	})
}
