package usageapi_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/httpapi/openapitest"
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/schemas/openapi"
	"github.com/floodgate-dev/floodgate/services/quota/internal/ledger"
	"github.com/floodgate-dev/floodgate/services/quota/internal/quotatest"
	"github.com/floodgate-dev/floodgate/services/quota/internal/usageapi"
)

// TestOpenAPIDocumentMatchesServer holds the usage API to
// schemas/openapi/quota.yaml: the routes the service mounts are exactly
// the document's, and real answers from the ledger on DynamoDB Local
// (usage, refusals, a ledger that is not there) match it.
func TestOpenAPIDocumentMatchesServer(t *testing.T) {
	d := openapitest.LoadBundled(t, openapi.Quota)

	db, prefix := quotatest.LedgerTable(t)
	now := time.Now().UTC()
	store := ledger.NewStore(db, prefix+dynamo.TableQuotaLedger, 400, func() time.Time { return now })
	_, err := store.ApplyPartition(context.Background(), "bot:oa", now.Format(ledger.DayLayout), 0, []ledger.Entry{{Offset: 1, Cost: 3}, {Offset: 2, Cost: 4}})
	require.NoError(t, err)
	tok, err := httpapi.NewToken("fgq_")
	require.NoError(t, err)
	tokens, err := usageapi.ParseTokens("console:reader:" + httpapi.HashToken(tok))
	require.NoError(t, err)

	serve := func(r ledger.UsageReader) *httptest.Server {
		mux := httpapi.NewMux()
		usageapi.Register(mux, r, tokens, func() time.Time { return now }, nil)
		return d.Serve(t, service.API{Handler: mux, Health: true}, httpapi.Options{})
	}
	srv := serve(store)

	auth := http.Header{"Authorization": {"Bearer " + tok}}
	res := d.Do(t, nil, srv.URL, openapitest.Request{Method: "GET", Path: "/v1/usage/bot/oa?days=3", Header: auth})
	require.Equal(t, http.StatusOK, res.Status, string(res.Body))
	require.EqualValues(t, 7, res.JSON(t)["today"])
	res = d.Do(t, nil, srv.URL, openapitest.Request{Method: "GET", Path: "/v1/usage/user/nobody", Header: auth})
	require.Equal(t, http.StatusOK, res.Status)
	res = d.Do(t, nil, srv.URL, openapitest.Request{Method: "GET", Path: "/v1/usage/robot/x", Header: auth, Invalid: true})
	require.Equal(t, http.StatusBadRequest, res.Status)
	res = d.Do(t, nil, srv.URL, openapitest.Request{Method: "GET", Path: "/v1/usage/bot/oa?days=401", Header: auth, Invalid: true})
	require.Equal(t, http.StatusBadRequest, res.Status)
	res = d.Do(t, nil, srv.URL, openapitest.Request{Method: "GET", Path: "/v1/usage/bot/oa", Header: http.Header{"Authorization": {"Bearer fgq_wrong"}}})
	require.Equal(t, http.StatusUnauthorized, res.Status)

	// A ledger table that is not there: 503, the store's error kept out of the answer.
	gone := serve(ledger.NewStore(db, prefix+"missing", 400, func() time.Time { return now }))
	res = d.Do(t, nil, gone.URL, openapitest.Request{Method: "GET", Path: "/v1/usage/bot/oa", Header: auth})
	require.Equal(t, http.StatusServiceUnavailable, res.Status)

	for _, p := range []string{"/healthz", "/readyz", "/metrics", httpapi.OpenAPIPath} {
		d.Do(t, nil, srv.URL, openapitest.Request{Method: "GET", Path: p})
	}
	d.CheckCovered(t)
}
