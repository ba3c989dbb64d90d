package app

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/httpapi/openapitest"
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/pkg/tlstest"
	"github.com/floodgate-dev/floodgate/schemas/openapi"
)

func TestConfigFromEnv(t *testing.T) {
	base := map[string]string{"FLOODGATE_CONSOLE_USERS": "users.yaml"}
	cases := []struct {
		name    string
		env     map[string]string
		wantErr string
	}{
		{name: "defaults", env: map[string]string{}},
		{name: "quota URL", env: map[string]string{"FLOODGATE_CONSOLE_QUOTA_URL": "127.0.0.1:8085"}, wantErr: "FLOODGATE_CONSOLE_QUOTA_URL"},
		{name: "adjuster URL", env: map[string]string{"FLOODGATE_CONSOLE_ADJUSTER_URL": "ftp://x"}, wantErr: "FLOODGATE_CONSOLE_ADJUSTER_URL"},
		{name: "dlq URL", env: map[string]string{"FLOODGATE_CONSOLE_DLQ_URL": "http://"}, wantErr: "FLOODGATE_CONSOLE_DLQ_URL"},
		{name: "session secret placeholder", env: map[string]string{"FLOODGATE_CONSOLE_SESSION_SECRET": "CHANGE-ME-console-session-secret-32-bytes-or-more"}, wantErr: "placeholder"},
		{name: "session secret short", env: map[string]string{"FLOODGATE_CONSOLE_SESSION_SECRET": "short"}, wantErr: "FLOODGATE_CONSOLE_SESSION_SECRET: 5 bytes"},
		{name: "users file", env: map[string]string{"FLOODGATE_CONSOLE_USERS": ""}, wantErr: "FLOODGATE_CONSOLE_USERS"},
		{name: "what-if max events", env: map[string]string{"FLOODGATE_CONSOLE_WHATIF_MAX_EVENTS": "2000000"}, wantErr: "FLOODGATE_CONSOLE_WHATIF_MAX_EVENTS: 2000000 not in 0..1000000"},
		{name: "what-if max events not a number", env: map[string]string{"FLOODGATE_CONSOLE_WHATIF_MAX_EVENTS": "lots"}, wantErr: "FLOODGATE_CONSOLE_WHATIF_MAX_EVENTS"},
		{name: "precision settings", env: map[string]string{"FLOODGATE_CONSOLE_PRECISION_THRESHOLDS": "0.9,rapid_fire=0.99", "FLOODGATE_CONSOLE_DATACENTER_RANGES": "198.51.100.0/24,2001:db8::/32"}},
		{name: "verdicts topic", env: map[string]string{"FLOODGATE_VERDICTS_TOPIC": "bad topic"}, wantErr: "FLOODGATE_VERDICTS_TOPIC"},
		{name: "datacenter ranges", env: map[string]string{"FLOODGATE_CONSOLE_DATACENTER_RANGES": "198.51.100.0/99"}, wantErr: "FLOODGATE_CONSOLE_DATACENTER_RANGES"},
		{name: "precision thresholds", env: map[string]string{"FLOODGATE_CONSOLE_PRECISION_THRESHOLDS": "rapid_fire=2"}, wantErr: "FLOODGATE_CONSOLE_PRECISION_THRESHOLDS"},
		{name: "precision min judged", env: map[string]string{"FLOODGATE_CONSOLE_PRECISION_MIN_JUDGED": "0"}, wantErr: "FLOODGATE_CONSOLE_PRECISION_MIN_JUDGED: 0 not in 1..1000000"},
		{name: "precision window", env: map[string]string{"FLOODGATE_CONSOLE_PRECISION_WINDOW": "1000h"}, wantErr: "FLOODGATE_CONSOLE_PRECISION_WINDOW"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{}
			for k, v := range base {
				env[k] = v
			}
			for k, v := range tc.env {
				env[k] = v
			}
			c, err := ConfigFromEnv(func(k string) string { return env[k] })
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, "http://127.0.0.1:8085", c.QuotaURL)
			require.Equal(t, "http://127.0.0.1:8083", c.AdjusterURL)
			require.Equal(t, "http://127.0.0.1:8084", c.DLQURL)
			require.Equal(t, "floodgate/d30", c.InfluxBucket)
			require.Equal(t, "floodgate.verdicts.v1", c.VerdictsTopic)
			networks, prec := c.precisionConfig()
			require.Equal(t, len(c.DatacenterRanges), len(networks.Datacenter))
			require.Equal(t, int64(20), prec.Thresholds.MinJudged)
			require.Equal(t, 7*24*time.Hour, prec.Window)
		})
	}
}

// TestRunServesReadiness runs the console against the local stack: /readyz is 200
// while it serves, and Run returns cleanly when its context ends.
func TestRunServesReadiness(t *testing.T) {
	addr := startConsole(t, nil)
	want, err := openapi.JSON(openapi.Console)
	require.NoError(t, err)
	openapitest.CheckServed(t, "http://"+addr, want)
	resp, err := http.Get("http://" + addr + "/login")
	require.NoError(t, err)
	resp.Body.Close()
	require.NotEmpty(t, resp.Cookies())
	for _, c := range resp.Cookies() {
		require.False(t, c.Secure, "plaintext, FLOODGATE_CONSOLE_SECURE_COOKIES unset: %s", c.Name)
	}
}

// TestRunOverTLS serves the console over TLS (FLOODGATE_HTTP_TLS_*, the
// runner's): its handlers see the connection's TLS, so the cookies it sets
// are Secure without FLOODGATE_CONSOLE_SECURE_COOKIES.
func TestRunOverTLS(t *testing.T) {
	ca := tlstest.NewCA(t, "console")
	pair := ca.Server("console")
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
	addr := startConsole(t, map[string]string{"FLOODGATE_HTTP_TLS_CERT_FILE": pair.CertFile, "FLOODGATE_HTTP_TLS_KEY_FILE": pair.KeyFile}, client)
	resp, err := client.Get("https://" + addr + "/login")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NotEmpty(t, resp.Cookies())
	for _, c := range resp.Cookies() {
		require.True(t, c.Secure, "%s over TLS", c.Name)
	}
}

// startConsole runs the console app with an empty users file and more
// settings from env until the test ends, and waits until /readyz answers
// 200 (over https when a client is given).
func startConsole(t *testing.T, env map[string]string, client ...*http.Client) string {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the local stack; run `make test`")
	}
	users := filepath.Join(t.TempDir(), "users.yaml")
	require.NoError(t, os.WriteFile(users, []byte("users: []\ntokens: []\n"), 0o600))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	all := map[string]string{"FLOODGATE_CONSOLE_USERS": users, "FLOODGATE_CONSOLE_ADDR": addr,
		"FLOODGATE_DYNAMODB_ENDPOINT": "http://127.0.0.1:8000"}
	if v := os.Getenv("FLOODGATE_DYNAMODB_ENDPOINT"); v != "" {
		all["FLOODGATE_DYNAMODB_ENDPOINT"] = v
	}
	for k, v := range env {
		all[k] = v
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, service.NewEnv("console", service.Stdio{Getenv: func(k string) string { return all[k] }}, slog.New(slog.DiscardHandler)))
	}()
	t.Cleanup(func() {
		cancel()
		stacktest.Returned(t, done, 15*time.Second, "Run returns after its context ended")
	})
	c, url := http.DefaultClient, "http://"+addr+"/readyz"
	if len(client) > 0 {
		c, url = client[0], "https://"+addr+"/readyz"
	}
	require.Eventually(t, func() bool {
		resp, err := c.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 20*time.Second, 50*time.Millisecond, "the console never became ready")
	return addr
}

// TestRemotesWithoutTokens: the adjuster's and the dlq-auditor's clients
// are nil without their tokens, each absence logged once; with them, all
// three are made.
func TestRemotesWithoutTokens(t *testing.T) {
	cfg, err := ConfigFromEnv(stacktest.Getenv(map[string]string{"FLOODGATE_CONSOLE_USERS": "users.yaml"}))
	require.NoError(t, err)
	var logs stacktest.Log
	rem, err := newRemotes(cfg, logs.Logger(slog.LevelInfo))
	require.NoError(t, err)
	require.NotNil(t, rem.quota)
	require.Nil(t, rem.adjuster)
	require.Nil(t, rem.dlq)
	require.Contains(t, logs.String(), "FLOODGATE_CONSOLE_ADJUSTER_TOKEN is not set")
	require.Contains(t, logs.String(), "FLOODGATE_CONSOLE_DLQ_TOKEN is not set")

	cfg.AdjusterToken, cfg.DLQToken = "fga_x", "fgdlq_x"
	logs = stacktest.Log{}
	rem, err = newRemotes(cfg, logs.Logger(slog.LevelInfo))
	require.NoError(t, err)
	require.NotNil(t, rem.adjuster)
	require.NotNil(t, rem.dlq)
	require.Empty(t, logs.String())
}
