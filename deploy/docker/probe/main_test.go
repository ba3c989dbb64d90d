package main

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRun(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz":
			w.WriteHeader(http.StatusOK)
		case "/slow":
			<-r.Context().Done()
		default:
			http.Error(w, "not ready", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	tlsSrv := httptest.NewTLSServer(srv.Config.Handler) // a certificate no system root signed
	defer tlsSrv.Close()
	_, port, err := net.SplitHostPort(tlsSrv.Listener.Addr().String())
	require.NoError(t, err)

	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{name: "healthy", args: []string{srv.URL + "/healthz"}},
		{name: "not ready", args: []string{srv.URL + "/readyz"}, wantErr: "status 503"},
		{name: "timeout", args: []string{srv.URL + "/slow"}, wantErr: "deadline exceeded"},
		{name: "refused", args: []string{"http://127.0.0.1:1/healthz"}, wantErr: "connect"},
		{name: "https on loopback: alive, whoever it says it is", args: []string{tlsSrv.URL + "/healthz"}},
		{name: "https on localhost", args: []string{"https://localhost:" + port + "/healthz"}},
		{name: "https not ready", args: []string{tlsSrv.URL + "/readyz"}, wantErr: "status 503"},
		{name: "plaintext to a TLS port", args: []string{"http://" + tlsSrv.Listener.Addr().String() + "/healthz"}, wantErr: "status 400"},
		{name: "no url", args: nil, wantErr: "usage"},
		{name: "two urls", args: []string{"a", "b"}, wantErr: "usage"},
		{name: "bad url", args: []string{"http://[::1"}, wantErr: "build request"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := run(context.Background(), tt.args, 200*time.Millisecond)
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

// Only the process beside the probe is asked without verifying its
// certificate.
func TestLoopback(t *testing.T) {
	for host, want := range map[string]bool{"127.0.0.1": true, "127.0.0.53": true, "::1": true, "localhost": true,
		"10.0.0.1": false, "limiter.floodgate.svc": false, "": false, "localhost.example": false} {
		require.Equal(t, want, loopback(host), host)
	}
}
