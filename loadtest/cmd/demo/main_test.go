package main

import (
	"bytes"
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDemoPenalizesNoLegitimatePrincipal runs the demo's traffic — people at
// random times, NAT'd users, app pollers, declared bots inside their limits,
// a spamming bot and an account takeover — through the real limiter and
// detector binaries on the local stack, and checks the demo's verdict: no
// legitimate principal penalized, both abusers caught.
func TestDemoPenalizesNoLegitimatePrincipal(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the limiter and the detector against the local stack")
	}
	bin := t.TempDir()
	for _, svc := range []string{"limiter", "detector"} {
		out, err := exec.Command("go", "build", "-o", filepath.Join(bin, svc), "../../../services/"+svc).CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	sum, err := run(ctx, []string{"-duration", "50s", "-users", "20", "-bot-rate", "200", "-bin", bin, "-logs", t.TempDir(),
		"-limiter-addr", freeAddr(t), "-detector-addr", freeAddr(t), "-limiter-grpc-addr", freeAddr(t)}, &out)
	t.Log(out.String())
	require.NoError(t, err)
	require.Greater(t, sum.Legit, 30)
	require.Empty(t, sum.LegitPenalized, "legitimate principals penalized")
	require.Len(t, sum.AbuseCaught, sum.Abusers, "abusers caught")
	require.Contains(t, out.String(), "legitimate principals penalized: 0 of")
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}
