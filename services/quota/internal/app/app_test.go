package app_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/services/quota/internal/app"
	"github.com/floodgate-dev/floodgate/services/quota/internal/ledger"
	"github.com/floodgate-dev/floodgate/services/quota/internal/quotatest"
)

func TestUsageCommand(t *testing.T) {
	db, prefix := quotatest.LedgerTable(t)
	store := ledger.NewStore(db, prefix+dynamo.TableQuotaLedger, 400, time.Now)
	ctx := context.Background()
	id := "cli" + time.Now().Format("150405000000")
	today := time.Now().UTC()
	yesterday := today.Add(-24 * time.Hour)
	_, err := store.ApplyPartition(ctx, "bot:"+id, today.Format(ledger.DayLayout), 0, []ledger.Entry{{Offset: 1, Cost: 7}})
	require.NoError(t, err)
	_, err = store.ApplyPartition(ctx, "bot:"+id, yesterday.Format(ledger.DayLayout), 0, []ledger.Entry{{Offset: 0, Cost: 5}})
	require.NoError(t, err)
	env := func(k string) string {
		switch k {
		case "FLOODGATE_DYNAMODB_TABLE_PREFIX":
			return prefix
		case "FLOODGATE_DYNAMODB_ENDPOINT":
			return quotatest.DynamoEndpoint()
		}
		return os.Getenv(k)
	}
	log := slog.New(slog.DiscardHandler)
	tests := []struct {
		name    string
		args    []string
		want    []string
		wantErr string
	}{
		{"seven days", []string{"usage", "bot:" + id, "--days", "7"}, []string{"principal bot:" + id, today.Format(ledger.DayLayout) + "      7", yesterday.Format(ledger.DayLayout) + "      5", "total     12"}, ""},
		{"flags first", []string{"usage", "--days=1", "bot:" + id}, []string{"total      7"}, ""},
		{"json", []string{"usage", "bot:" + id, "--days", "2", "--json"}, []string{`"total": 12`, `"today": 7`}, ""},
		{"no principal", []string{"usage"}, nil, "want kind:id"},
		{"bad kind", []string{"usage", "robot:x"}, nil, "principal"},
		{"too many days", []string{"usage", "bot:x", "--days", "999"}, nil, "days 999"},
		{"unknown command", []string{"frobnicate"}, nil, "unknown command"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := app.Run(ctx, service.NewEnv("quota", service.Stdio{Args: tc.args, Getenv: env, Stdout: &out}, log))
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			for _, w := range tc.want {
				require.Contains(t, out.String(), w)
			}
		})
	}
}
