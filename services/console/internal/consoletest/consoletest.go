// Package consoletest runs the console's neighbours for its integration
// tests: the other services are real processes built from this module
// (services never import each other), on loopback addresses of their own.
package consoletest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/migrations"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
)

// Broker starts an in-process Kafka-protocol broker (pkg/kafkatest) with
// the migrations' topics and returns its address.
func Broker(t testing.TB) string {
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

// FreeAddr returns a loopback address ("127.0.0.1:port") nothing listens on now.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

// WaitReady waits up to 30 s for url to answer 200 and fails the test when it does not.
func WaitReady(t testing.TB, url string) {
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

// Build builds the named services (./services/<name>) of this module into
// dir, one binary each named after its service; out is go build's output.
func Build(dir string, names ...string) (out []byte, err error) {
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return nil, fmt.Errorf("go env GOMOD: %w", err)
	}
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, n := range names {
		args = append(args, "./services/"+n)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = filepath.Dir(strings.TrimSpace(string(gomod)))
	return cmd.CombinedOutput()
}
