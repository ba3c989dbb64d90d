package main

import (
	"context"
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

	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{name: "healthy", args: []string{srv.URL + "/healthz"}},
		{name: "not ready", args: []string{srv.URL + "/readyz"}, wantErr: "status 503"},
		{name: "timeout", args: []string{srv.URL + "/slow"}, wantErr: "deadline exceeded"},
		{name: "refused", args: []string{"http://127.0.0.1:1/healthz"}, wantErr: "connect"},
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
