package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDemoTraffic runs the demo's people, services and abusers through the
// real limiter and detector binaries on the local stack (its own topics,
// groups and ports) for 45 s, and requires that no legitimate principal was
// penalized and both abusers were.
func TestDemoTraffic(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the local stack and ~1 minute")
	}
	dir := t.TempDir()
	for _, svc := range []string{"limiter", "detector"} {
		b := exec.Command("go", "build", "-o", filepath.Join(dir, svc), "github.com/floodgate-dev/floodgate/services/"+svc)
		b.Stderr = os.Stderr
		require.NoError(t, b.Run(), svc)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	sum, err := run(ctx, []string{"-duration", "45s", "-bin", dir, "-logs", dir,
		"-limiter-addr", freeAddr(t), "-detector-addr", freeAddr(t), "-topics", fmt.Sprintf("floodgate.demotest.%d", time.Now().UnixNano())},
		os.Getenv, &out)
	t.Log(out.String())
	if err != nil {
		for _, svc := range []string{"limiter", "detector"} {
			b, _ := os.ReadFile(filepath.Join(dir, "demo-"+svc+".log"))
			t.Logf("%s log (last 2 KB):\n%s", svc, b[max(0, len(b)-2048):])
		}
	}
	require.NoError(t, err)
	require.Equal(t, 30+20+10+4, sum.Legit)
	require.Zero(t, sum.LegitPenalized, "legitimate principals penalized: %v", sum.LegitPenalizedIDs)
	require.Equal(t, 2, sum.Abusive)
	require.Equal(t, 2, sum.AbusersCaught, "abusers missed: %v", sum.AbusersMissed)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}
