package score

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

func TestParamsLevels(t *testing.T) {
	doc := []byte(`
defaults:
  rapid_fire_threshold: 6
overrides:
  - kind: user
    person_sustain: 4s
  - route: /channels/{channel_id}/messages
    rapid_fire_rate: 3
  - kind: user
    route: /channels/{channel_id}/messages
    person_min_denials: 40
`)
	tu, err := ParseTuned(DefaultConfig(), doc, 7)
	require.NoError(t, err)
	require.Equal(t, int64(7), tu.Version)
	route := "/channels/{channel_id}/messages"
	u := tu.Config(events.PrincipalUser, route)
	require.Equal(t, 6.0, u.Threshold, "defaults")
	require.Equal(t, 4*time.Second, u.PersonSustain, "kind")
	require.Equal(t, 3.0, u.Floor, "route")
	require.Equal(t, 40, u.PersonMinDenials, "kind and route")
	b := tu.Config(events.PrincipalBot, route)
	require.Equal(t, 3.0, b.Floor)
	require.Equal(t, 5*time.Second, b.PersonSustain, "another kind keeps the base")
	require.Equal(t, 20, b.PersonMinDenials)
	all := tu.Config(events.PrincipalUser, AllRoutes)
	require.Equal(t, 2.0, all.Floor, "over all routes: the kind's")
	require.Equal(t, 4*time.Second, all.PersonSustain)
	other := tu.Config(events.PrincipalAnonymous, "/other")
	require.Equal(t, DefaultConfig().PersonSustain, other.PersonSustain)
	require.Equal(t, 6.0, other.Threshold)

	// The document writes back as it reads.
	p, err := ParseParams(doc)
	require.NoError(t, err)
	again, err := ParseParams(p.Marshal())
	require.NoError(t, err)
	require.Equal(t, p, again)
	require.Contains(t, p.Describe(), "kind=user route=/channels/{channel_id}/messages: person_min_denials 40")
}

func TestParamsRefused(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown field":      "defaults:\n  rapid_fire_treshold: 6\n",
		"bad kind":           "overrides:\n  - kind: robot\n    rapid_fire_rate: 3\n",
		"bad route":          "overrides:\n  - route: channels\n    rapid_fire_rate: 3\n",
		"no level":           "overrides:\n  - rapid_fire_rate: 3\n",
		"duplicate":          "overrides:\n  - kind: bot\n    rapid_fire_rate: 3\n  - kind: bot\n    rapid_fire_rate: 4\n",
		"threshold below 1":  "defaults:\n  rapid_fire_threshold: 0.5\n",
		"sustain not whole":  "overrides:\n  - kind: user\n    person_sustain: 1500ms\n",
		"sustain not a time": "overrides:\n  - kind: user\n    person_sustain: soon\n",
		"fanout past ips":    "overrides:\n  - kind: user\n    ip_min_distinct: 4\n",
		"not yaml":           "defaults: [",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ParseTuned(DefaultConfig(), []byte(doc), 2)
			require.Error(t, err)
		})
	}
	tu, err := ParseTuned(DefaultConfig(), nil, 1)
	require.NoError(t, err, "an empty document is the base")
	require.Equal(t, DefaultConfig(), tu.Config(events.PrincipalUser, "/x"))
}

// TestParamsMoveADetection: a person holding twice the line for 3 s over
// all routes is rapid fire with a 1 s sustain and not with the default 5 s;
// a document raising users' sustain to 5 s avoids it, and one naming bots
// only does not.
func TestKnobsSetAndGet(t *testing.T) {
	var k Knobs
	require.NoError(t, k.Set("rapid_fire_rate", "2.5"))
	require.NoError(t, k.Set("ip_min_distinct", "7"))
	require.NoError(t, k.Set("person_sustain", "4s"))
	require.Equal(t, Knobs{RapidFireRate: new(2.5), IPMinDistinct: new(7), PersonSustain: "4s"}, k)
	for name, want := range map[string]string{"rapid_fire_rate": "2.5", "ip_min_distinct": "7", "person_sustain": "4s"} {
		got, ok := k.get(name)
		require.True(t, ok, name)
		require.Equal(t, want, got, name)
	}
	for _, name := range []string{"rapid_fire_threshold", "fanout_min_networks", "nope"} {
		_, ok := k.get(name)
		require.False(t, ok, "%s is not set", name)
	}

	require.EqualError(t, k.Set("rapid_fire_threshold", "high"), `rapid_fire_threshold: "high" is not a number`)
	require.EqualError(t, k.Set("fanout_min_networks", "many"), `fanout_min_networks: "many" is not an integer`)
	require.EqualError(t, k.Set("rapid_fire_treshold", "6"), `"rapid_fire_treshold" is not a detector parameter`)
	require.Nil(t, k.RapidFireThreshold, "a refused value leaves the knob unset")
}

func TestParamsMoveADetection(t *testing.T) {
	base := DefaultConfig()
	base.PersonSustain = time.Second
	run := func(tu *Tuned) int {
		s := New(base, NewIPStore(base))
		s.SetTuned(tu)
		start := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
		n := 0
		ip := netip.MustParseAddr("198.51.100.7")
		for ms := 0; ms < 20_000; ms += 40 { // 25/s for 20 s
			d := events.Decision{TS: start.Add(time.Duration(ms) * time.Millisecond), Principal: events.Principal{Kind: events.PrincipalUser, ID: "u1"},
				IP: ip, Method: "GET", Route: "/r" + string(rune('a'+ms/40%4)), Allowed: true}
			for _, det := range s.Observe(&d, nil) {
				if det.Penalize {
					n++
				}
			}
		}
		return n
	}
	require.Positive(t, run(nil), "the mistuned base detects the person")
	users, err := ParseTuned(base, []byte("overrides:\n  - kind: user\n    person_sustain: 30s\n"), 2)
	require.NoError(t, err)
	require.Zero(t, run(users))
	bots, err := ParseTuned(base, []byte("overrides:\n  - kind: bot\n    person_sustain: 30s\n"), 3)
	require.NoError(t, err)
	require.Positive(t, run(bots))
}
