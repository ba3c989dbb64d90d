package envoyrls

import (
	"context"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/promtest"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// TestEnvoyUnknownDomainAnswersOKWithoutALimit: with an envoy ratelimit
// configuration loaded, a call in envoy ratelimit's shape for a domain the
// configuration does not have is OK without a limit — a descriptor's own
// `limit` override too — nothing is counted in Redis and no event is
// published, while the metric counts it; a call in Floodgate's own shape for
// such a domain keeps its mapping and its errors; an empty domain is still
// an error.
func TestEnvoyUnknownDomainAnswersOKWithoutALimit(t *testing.T) {
	const conf = `domain: DOMAIN
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
`
	f := newEnvoyExt(t, conf, envoyExtOpts{})
	other := redistest.Unique(t, "unknown")
	u := redistest.Unique(t, "u")
	over := limitertest.Descriptor("user", u)
	over.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_MINUTE}
	for i := range 3 {
		r, err := f.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: other,
			Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.Descriptor("user", u), over}})
		require.NoError(t, err, "call %d", i)
		require.Equal(t, rlsv3.RateLimitResponse_OK, r.GetOverallCode(), "call %d", i)
		require.Len(t, r.GetStatuses(), 2)
		for _, st := range r.GetStatuses() {
			require.Equal(t, rlsv3.RateLimitResponse_OK, st.GetCode())
			require.Nil(t, st.GetCurrentLimit(), "no limit")
			require.Zero(t, st.GetLimitRemaining())
			require.Nil(t, st.GetDurationUntilReset())
		}
		require.Empty(t, r.GetResponseHeadersToAdd())
	}
	require.InDelta(t, 3, promtest.Value(t, f.reg, "floodgate_limiter_envoy_unknown_domain_total", nil), 0)
	require.Empty(t, f.pub.Messages(), "no decision for a domain without configuration")
	keys, err := f.rdb.Keys(context.Background(), "*"+other+"*").Result()
	require.NoError(t, err)
	require.Empty(t, keys, "nothing counted")

	// The configured domain still limits the same user: 1 a minute.
	require.Equal(t, "OK OVER_LIMIT", f.run(t, 2, limitertest.Descriptor("user", u)))

	// Floodgate's own shape for an unconfigured domain: mapped as before,
	// so a call missing its required keys is still refused.
	_, err = f.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: other,
		Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.Descriptor(KeyPrincipalKind, "user", KeyPrincipalID, u)}})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	_, err = f.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
		Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.Descriptor("user", u)}})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "an empty domain: %v", err)
	require.InDelta(t, 3, promtest.Value(t, f.reg, "floodgate_limiter_envoy_unknown_domain_total", nil), 0)
}
