package app

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/migrations"
	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/services/console/internal/auth"
)

// syncBuffer is a log sink shared by a process and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

func waitOK(t *testing.T, url string) {
	t.Helper()
	require.Eventually(t, func() bool {
		res, err := http.Get(url)
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	}, 30*time.Second, 50*time.Millisecond, "%s never became ready", url)
}

// buildServices builds the other services' binaries (services never import
// each other: they run as processes).
func buildServices(t *testing.T, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	wd, err := os.Getwd()
	require.NoError(t, err)
	args := []string{"build", "-o", dir + "/"}
	for _, n := range names {
		args = append(args, "./services/"+n)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = filepath.Join(wd, "..", "..", "..", "..")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return dir
}

// startService runs a service binary until the test ends (SIGTERM, then
// kill); its log (stderr) goes to logs.
func startService(t *testing.T, path string, env []string, logs io.Writer) {
	t.Helper()
	cmd := exec.Command(path)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
}

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
	bin := buildServices(t, "adjuster", "dlq-auditor")

	// A broker with the migrations' topics, DynamoDB tables under a prefix.
	broker := kafkatest.Start(t, nil)
	endpoint := config.NewEnv(os.Getenv).String("FLOODGATE_DYNAMODB_ENDPOINT", "http://127.0.0.1:8000")
	ddb, err := dynamo.NewClient(ctx, dynamo.Options{Endpoint: endpoint})
	require.NoError(t, err)
	prefix := fmt.Sprintf("corr%d_", time.Now().UnixNano())
	ms, err := migrations.Load()
	require.NoError(t, err)
	r := &migrations.Runner{Kafka: migrations.NewKafka([]string{broker}, 1, nil), Dynamo: &migrations.Dynamo{Client: ddb, Prefix: prefix},
		Now: time.Now, Report: func(string) {}}
	require.NoError(t, r.Apply(ctx, ms), "migrations (is the local stack up? make up)")
	t.Cleanup(func() {
		out, err := ddb.ListTables(context.Background(), &dynamodb.ListTablesInput{})
		if err != nil {
			return
		}
		for _, name := range out.TableNames {
			if strings.HasPrefix(name, prefix) {
				_, _ = ddb.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(name)})
			}
		}
	})
	common := []string{"FLOODGATE_KAFKA_BROKERS=" + broker, "FLOODGATE_DYNAMODB_ENDPOINT=" + endpoint,
		"FLOODGATE_DYNAMODB_TABLE_PREFIX=" + prefix, "FLOODGATE_LOG_LEVEL=info"}

	adjAddr, dlqAddr, consoleAddr := freePort(t), freePort(t), freePort(t)
	adjToken, err := httpapi.NewToken("fga_")
	require.NoError(t, err)
	var adjLogs, dlqLogs, consoleLogs syncBuffer
	startService(t, filepath.Join(bin, "adjuster"), append([]string{
		"FLOODGATE_ADJUSTER_ADDR=" + adjAddr, "FLOODGATE_ADJUSTER_TOKENS=console:sre:" + httpapi.HashToken(adjToken),
		"FLOODGATE_ADJUSTER_SCALES_KEY=" + redistest.Unique(t, "fg:test:corr:scales"), "FLOODGATE_ADJUSTER_SHED_KEY=" + redistest.Unique(t, "fg:test:corr:shed"),
	}, common...), &adjLogs)
	dlqToken, err := httpapi.NewToken("fgdlq_")
	require.NoError(t, err)
	tokensFile := filepath.Join(t.TempDir(), "dlq-tokens")
	require.NoError(t, os.WriteFile(tokensFile, []byte("console sre "+httpapi.HashToken(dlqToken)+"\n"), 0o600))
	startService(t, filepath.Join(bin, "dlq-auditor"), append([]string{
		"FLOODGATE_DLQ_ADDR=" + dlqAddr, "FLOODGATE_DLQ_TOKENS_FILE=" + tokensFile,
		"FLOODGATE_DLQ_GROUP=" + redistest.Unique(t, "corr-auditor"),
	}, common...), &dlqLogs)

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
	waitOK(t, "http://"+adjAddr+"/readyz")
	waitOK(t, "http://"+dlqAddr+"/readyz")
	waitOK(t, "http://"+consoleAddr+"/readyz")
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
	logged := func(logs *syncBuffer, id string) bool {
		return strings.Contains(logs.String(), `"correlation_id":"`+id+`"`)
	}

	id := "trace-" + redistest.Unique(t, "corr")
	res := get("/sre/dlq", id) // the console calls the dlq-auditor
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Equal(t, id, res.Header.Get(httpapi.HeaderRequestID))
	res = get("/sre/adjuster", id) // and the adjuster
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Equal(t, id, res.Header.Get(httpapi.HeaderRequestID))
	require.Eventually(t, func() bool { return logged(&consoleLogs, id) && logged(&dlqLogs, id) && logged(&adjLogs, id) },
		10*time.Second, 50*time.Millisecond, "correlation id %s missing from a service's log", id)

	// An id the console mints (the caller sent none) goes along too.
	res = get("/sre/dlq", "")
	minted := res.Header.Get(httpapi.HeaderRequestID)
	require.True(t, httpapi.ValidRequestID(minted), "no id minted: %q", minted)
	require.Eventually(t, func() bool { return logged(&consoleLogs, minted) && logged(&dlqLogs, minted) },
		10*time.Second, 50*time.Millisecond, "minted id %s did not reach the dlq-auditor", minted)
	require.False(t, logged(&adjLogs, minted), "the adjuster was not called")
}
