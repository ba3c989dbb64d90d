package cputime

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
)

// TestProfile: the endpoint's body lands in the file; an answer other than
// 200 is an error naming the status.
func TestProfile(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/debug/pprof/allocs" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte("pprof bytes"))
	}))
	defer srv.Close()
	path := filepath.Join(t.TempDir(), "allocs.pprof")
	if err := Profile(context.Background(), srv.URL+"/debug/pprof/allocs", path); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "pprof bytes" {
		t.Fatalf("file holds %q (%v), want the body", b, err)
	}
	if err := Profile(context.Background(), srv.URL+"/nothing", path); err == nil {
		t.Fatal("a 404 was not an error")
	}
}
