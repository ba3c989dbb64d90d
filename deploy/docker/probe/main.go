// Command probe is the container health check of the Floodgate images.
//
//	probe http://127.0.0.1:8080/healthz
//
// The final images are distroless (no shell, no curl), so Docker's HEALTHCHECK and
// docker compose's healthcheck run this static binary instead. It exits 0 when the
// URL answers 2xx within the timeout and 1 otherwise, printing why.
//
// An https URL of a loopback address (probe https://127.0.0.1:8080/healthz, the
// ports under FLOODGATE_HTTP_TLS_*) is asked without verifying the server's
// certificate, which names the service, not 127.0.0.1: the probe asks the process
// beside it whether it is alive, not who it is. Any other https URL is verified.
package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"
)

func main() {
	if err := run(context.Background(), os.Args[1:], 3*time.Second); err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, timeout time.Duration) error {
	if len(args) != 1 {
		return fmt.Errorf("usage: probe <url>, got %d arguments", len(args))
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, args[0], nil)
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	client := http.DefaultClient
	if req.URL.Scheme == "https" && loopback(req.URL.Hostname()) {
		client = &http.Client{Transport: &http.Transport{
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}, //nolint:gosec // a liveness probe of the process beside it
		}}
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("get %s: %w", args[0], err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("get %s: status %d", args[0], resp.StatusCode)
	}
	return nil
}

// loopback reports whether host is localhost or a loopback address.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
