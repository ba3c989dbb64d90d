// Package pagertest is the exported contract suite of the detector's pager
// port (detector.Alerter), run against the PagerDuty pager (Events API v2 to
// a local receiver) and the in-memory double alike.
package pagertest

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/services/detector/internal/detector"
)

// UnderTest is an Alerter with a view of what its receiver got and a
// way to make the receiver fail the next n calls.
type UnderTest struct {
	detector.Alerter
	Pages    func() []detector.Page
	FailNext func(n int)
}

// Run is the contract of detector.Alerter: what every pager does (the
// PagerDuty pager against a local receiver, detector.MemAlerter).
func Run(t *testing.T, open func(t *testing.T) UnderTest) {
	ctx := context.Background()
	t.Run("every alert reaches the receiver with its key, summary and details", func(t *testing.T) {
		a := open(t)
		require.NoError(t, a.Alert(ctx, "floodgate:blast_radius:rapid_fire", "enforcement held", map[string]any{"pattern": "rapid_fire"}))
		require.NoError(t, a.Alert(ctx, "floodgate:blast_radius:distributed_ip", "enforcement held again", map[string]any{"pattern": "distributed_ip"}))
		require.Equal(t, []detector.Page{
			{Key: "floodgate:blast_radius:rapid_fire", Summary: "enforcement held", Details: map[string]any{"pattern": "rapid_fire"}},
			{Key: "floodgate:blast_radius:distributed_ip", Summary: "enforcement held again", Details: map[string]any{"pattern": "distributed_ip"}},
		}, a.Pages())
	})
	t.Run("an alert the receiver refused is an error, and the next one goes through", func(t *testing.T) {
		a := open(t)
		a.FailNext(1)
		err := a.Alert(ctx, "floodgate:blast_radius:rapid_fire", "enforcement held", nil)
		require.ErrorContains(t, err, "floodgate:blast_radius:rapid_fire")
		require.Empty(t, a.Pages())
		require.NoError(t, a.Alert(ctx, "floodgate:blast_radius:rapid_fire", "enforcement held", nil))
		require.Len(t, a.Pages(), 1)
	})
}

// PagesOf returns the events a local PagerDuty receiver accepted, as pages.
func PagesOf(recv *stacktest.PagerDuty) []detector.Page {
	var out []detector.Page
	for _, e := range recv.All() {
		payload, _ := e["payload"].(map[string]any)
		details, _ := payload["custom_details"].(map[string]any)
		out = append(out, detector.Page{Key: fmt.Sprint(e["dedup_key"]), Summary: fmt.Sprint(payload["summary"]), Details: details})
	}
	return out
}
