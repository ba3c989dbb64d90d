package web

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/migrations"
	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
)

// Other services run as real processes (services never import each other):
// their binaries are built once per test binary run.
var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
	buildOut  []byte
)

func serviceBinary(t *testing.T, name string) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "console-test-bin-")
		if buildErr != nil {
			return
		}
		wd, _ := os.Getwd()
		cmd := exec.Command("go", "build", "-o", binDir+"/", "./services/quota", "./services/adjuster", "./services/dlq-auditor")
		cmd.Dir = filepath.Clean(filepath.Join(wd, "..", "..", "..", ".."))
		buildOut, buildErr = cmd.CombinedOutput()
	})
	require.NoError(t, buildErr, "go build: %s", buildOut)
	return filepath.Join(binDir, name)
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// broker starts an in-process Kafka-protocol broker with the migrations' topics.
func broker(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := kafkatest.Start(t, nil)
	ms, err := migrations.Load()
	require.NoError(t, err)
	for _, m := range ms {
		require.NoError(t, migrations.NewKafka([]string{b}, 1, nil).Apply(ctx, m.Kafka.Topics, func(string) {}))
	}
	return b
}

// startProcess runs a service binary until the test ends (SIGINT, then kill);
// its log is printed when the test failed.
func startProcess(t *testing.T, path string, env []string, args ...string) {
	t.Helper()
	var logs bytes.Buffer
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = &logs, &logs
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
		if t.Failed() {
			t.Logf("%s log:\n%s", filepath.Base(path), logs.String())
		}
	})
}

func dynamoEndpoint() string {
	return config.NewEnv(os.Getenv).String("FLOODGATE_DYNAMODB_ENDPOINT", "http://127.0.0.1:8000")
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

func waitReady(t *testing.T, url string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s not ready after 30s", url)
}
