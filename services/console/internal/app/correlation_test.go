package app

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/migrations/migrationstest"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/services/console/internal/auth"
	"github.com/floodgate-dev/floodgate/services/console/internal/consoletest"
)

// One request through the console into the dlq-auditor and the adjuster:
// the same correlation id (X-Request-Id) is in all three services' logs,
// and an id the console minted reaches the service it called.
func TestCorrelationIDCrossesServices(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the local stack; run `make test`")
	}
	redistest.Client(t) // fails loudly when the local Redis is missing
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := t.TempDir()
	out, err := stacktest.GoBuild(bin, "adjuster", "dlq-auditor")
	require.NoError(t, err, "go build: %s", out)

	// A broker with the migrations' topics, DynamoDB tables under a prefix.
	broker := consoletest.Broker(t)
	_, prefix := migrationstest.DynamoTables(t, "corr")
	endpoint := migrationstest.DynamoEndpoint()
	common := []string{"FLOODGATE_KAFKA_BROKERS=" + broker, "FLOODGATE_DYNAMODB_ENDPOINT=" + endpoint,
		"FLOODGATE_DYNAMODB_TABLE_PREFIX=" + prefix, "FLOODGATE_LOG_LEVEL=info"}

	adjAddr, dlqAddr, consoleAddr := consoletest.FreeAddr(t), consoletest.FreeAddr(t), consoletest.FreeAddr(t)
	adjToken, err := httpapi.NewToken("fga_")
	require.NoError(t, err)
	var consoleLogs stacktest.Log
	adjLogs := stacktest.Exec(t, filepath.Join(bin, "adjuster"), append([]string{
		"FLOODGATE_ADJUSTER_ADDR=" + adjAddr, "FLOODGATE_ADJUSTER_TOKENS=console:sre:" + httpapi.HashToken(adjToken),
		"FLOODGATE_ADJUSTER_SCALES_KEY=" + redistest.Unique(t, "fg:test:corr:scales"), "FLOODGATE_ADJUSTER_SHED_KEY=" + redistest.Unique(t, "fg:test:corr:shed"),
	}, common...))
	dlqToken, err := httpapi.NewToken("fgdlq_")
	require.NoError(t, err)
	tokensFile := filepath.Join(t.TempDir(), "dlq-tokens")
	require.NoError(t, os.WriteFile(tokensFile, []byte("console sre "+httpapi.HashToken(dlqToken)+"\n"), 0o600))
	dlqLogs := stacktest.Exec(t, filepath.Join(bin, "dlq-auditor"), append([]string{
		"FLOODGATE_DLQ_ADDR=" + dlqAddr, "FLOODGATE_DLQ_TOKENS_FILE=" + tokensFile,
		"FLOODGATE_DLQ_GROUP=" + redistest.Unique(t, "corr-auditor"),
	}, common...))

	// The console, in-process, on the runner with a JSON log like its binary's.
	consoleToken, sum, err := auth.NewToken()
	require.NoError(t, err)
	users := filepath.Join(t.TempDir(), "users.yaml")
	require.NoError(t, os.WriteFile(users, []byte("users: []\ntokens:\n"+auth.TokenLine("ops-bot", auth.RoleSRE, sum)+"\n"), 0o600))
	env := map[string]string{
		"FLOODGATE_CONSOLE_ADDR": consoleAddr, "FLOODGATE_CONSOLE_USERS": users,
		"FLOODGATE_CONSOLE_ADJUSTER_URL": "http://" + adjAddr, "FLOODGATE_CONSOLE_ADJUSTER_TOKEN": adjToken,
		"FLOODGATE_CONSOLE_DLQ_URL": "http://" + dlqAddr, "FLOODGATE_CONSOLE_DLQ_TOKEN": dlqToken,
		"FLOODGATE_KAFKA_BROKERS": broker, "FLOODGATE_DYNAMODB_ENDPOINT": endpoint, "FLOODGATE_DYNAMODB_TABLE_PREFIX": prefix,
	}
	getenv := func(k string) string { return env[k] }
	log, err := service.NewLogger(getenv, &consoleLogs)
	require.NoError(t, err)
	consoleCtx, stopConsole := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- Run(consoleCtx, service.NewEnv("console", service.Stdio{Getenv: getenv}, log)) }()
	t.Cleanup(func() {
		stopConsole()
		require.NoError(t, <-done)
	})
	consoletest.WaitReady(t, "http://"+adjAddr+"/readyz")
	consoletest.WaitReady(t, "http://"+dlqAddr+"/readyz")
	consoletest.WaitReady(t, "http://"+consoleAddr+"/readyz")
	defer func() {
		if t.Failed() {
			t.Logf("console log:\n%s\nadjuster log:\n%s\ndlq-auditor log:\n%s", consoleLogs.String(), adjLogs.String(), dlqLogs.String())
		}
	}()

	get := func(path, id string) *http.Response {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+consoleAddr+path, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+consoleToken)
		if id != "" {
			req.Header.Set(httpapi.HeaderRequestID, id)
		}
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res
	}
	logged := func(logs *stacktest.Log, id string) bool {
		return strings.Contains(logs.String(), `"correlation_id":"`+id+`"`)
	}

	id := "trace-" + redistest.Unique(t, "corr")
	res := get("/sre/dlq", id) // the console calls the dlq-auditor
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Equal(t, id, res.Header.Get(httpapi.HeaderRequestID))
	res = get("/sre/adjuster", id) // and the adjuster
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Equal(t, id, res.Header.Get(httpapi.HeaderRequestID))
	require.Eventually(t, func() bool { return logged(&consoleLogs, id) && logged(dlqLogs, id) && logged(adjLogs, id) },
		10*time.Second, 50*time.Millisecond, "correlation id %s missing from a service's log", id)

	// An id the console mints (the caller sent none) goes along too.
	res = get("/sre/dlq", "")
	minted := res.Header.Get(httpapi.HeaderRequestID)
	require.True(t, httpapi.ValidRequestID(minted), "no id minted: %q", minted)
	require.Eventually(t, func() bool { return logged(&consoleLogs, minted) && logged(dlqLogs, minted) },
		10*time.Second, 50*time.Millisecond, "minted id %s did not reach the dlq-auditor", minted)
	require.False(t, logged(adjLogs, minted), "the adjuster was not called")
}
