package gateway

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events/eventstest"
)

// TestRouterRealAPIs compiles the real public API templates of
// pkg/events/testdata/routes into one router and checks that a request built
// from each template (parameters filled in) is matched back to it.
func TestRouterRealAPIs(t *testing.T) {
	total := 0
	for api, lines := range eventstest.RouteCorpus(t) {
		var routes []Route // one router per API: two APIs may spell one path two ways
		for _, line := range lines {
			rt, err := ParseRoute(line)
			require.NoError(t, err, line)
			routes = append(routes, rt)
		}
		r, err := NewRouter(routes, "")
		require.NoError(t, err, api)
		for _, rt := range routes {
			// Fill every parameter with a value no literal of the corpus holds.
			path := fillParams(rt.Template, "x9Q")
			m := r.Match(rt.Method, path)
			require.Equal(t, rt.Template, m.Template, "%s: %s %s (as %s)", api, rt.Method, rt.Template, path)
		}
		total += len(routes)
	}
	require.GreaterOrEqual(t, total, 200)
}

func fillParams(tmpl, v string) string {
	var b strings.Builder
	for {
		i := strings.IndexByte(tmpl, '{')
		if i < 0 {
			b.WriteString(tmpl)
			return b.String()
		}
		j := strings.IndexByte(tmpl, '}')
		b.WriteString(tmpl[:i])
		b.WriteString(v)
		tmpl = tmpl[j+1:]
	}
}

func TestRouterMixedSegmentsAndEncoding(t *testing.T) {
	r, err := NewRouter([]Route{
		{Method: "GET", Template: "/users/@me"},
		{Method: "GET", Template: "/users/{user_id}", Resource: "user:{user_id}"},
		{Method: "GET", Template: "/2010-04-01/Accounts/{AccountSid}/Messages/{Sid}.json", Resource: "message:{Sid}"},
		{Method: "GET", Template: "/2010-04-01/Accounts/{AccountSid}/Messages.json"},
		{Method: "POST", Template: "/v1/{name}:cancel", Resource: "op:{name}"},
		{Method: "GET", Template: "/files/{name}.{ext}", Resource: "file:{name}"},
		{Method: "GET", Template: "/a%40b"},
	}, "")
	require.NoError(t, err)
	cases := []struct {
		method, path string
		want         Match
	}{
		{"GET", "/users/@me", Match{Template: "/users/@me", Cost: 1}},
		{"GET", "/users/%40me", Match{Template: "/users/@me", Cost: 1}},
		{"GET", "/users/42", Match{Template: "/users/{user_id}", Resource: "user:42", Cost: 1}},
		{"GET", "/2010-04-01/Accounts/AC1/Messages/SM9.json", Match{Template: "/2010-04-01/Accounts/{AccountSid}/Messages/{Sid}.json", Resource: "message:SM9", Cost: 1}},
		{"GET", "/2010-04-01/Accounts/AC1/Messages.json", Match{Template: "/2010-04-01/Accounts/{AccountSid}/Messages.json", Cost: 1}},
		{"GET", "/2010-04-01/Accounts/AC1/Messages/.json", Match{Template: "/{unmatched}", Cost: 1}},
		{"POST", "/v1/op-7:cancel", Match{Template: "/v1/{name}:cancel", Resource: "op:op-7", Cost: 1}},
		{"POST", "/v1/op-7:cancelled", Match{Template: "/{unmatched}", Cost: 1}},
		{"GET", "/files/report.tar.gz", Match{Template: "/files/{name}.{ext}", Resource: "file:report", Cost: 1}},
		{"GET", "/a@b", Match{Template: "/a%40b", Cost: 1}},
		{"GET", "/users/a%2Fb", Match{Template: "/users/{user_id}", Resource: "user:a%2Fb", Cost: 1}},
	}
	for _, tc := range cases {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			require.Equal(t, tc.want, r.Match(tc.method, tc.path))
		})
	}
}
