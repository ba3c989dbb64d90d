package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func TestParseConfig(t *testing.T) {
	noEnv := func(string) string { return "" }
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string
		check   func(t *testing.T, c config)
	}{
		{name: "defaults", check: func(t *testing.T, c config) {
			if c.Port != 9092 || c.Brokers != 1 || c.DataDir != "" || c.Sync || c.MinSessionTimeout != time.Second {
				t.Errorf("defaults = %+v", c)
			}
		}},
		{name: "env", env: map[string]string{"FLOODGATE_BROKER_PORT": "19092", "FLOODGATE_BROKER_BROKERS": "3"},
			check: func(t *testing.T, c config) {
				if c.Port != 19092 || c.Brokers != 3 {
					t.Errorf("got port %d brokers %d, want 19092 and 3", c.Port, c.Brokers)
				}
			}},
		{name: "flag beats env", args: []string{"-port", "29092"}, env: map[string]string{"FLOODGATE_BROKER_PORT": "19092"},
			check: func(t *testing.T, c config) {
				if c.Port != 29092 {
					t.Errorf("port = %d, want 29092", c.Port)
				}
			}},
		{name: "bad env", env: map[string]string{"FLOODGATE_BROKER_PORT": "x"}, wantErr: "FLOODGATE_BROKER_PORT"},
		{name: "sync needs data dir", args: []string{"-sync"}, wantErr: "-sync needs -data-dir"},
		{name: "ports past 65535", args: []string{"-port", "65535", "-brokers", "2"}, wantErr: "ports must lie"},
		{name: "min above max session", args: []string{"-group-min-session-timeout", "10m"}, wantErr: "need 0 < min <= max"},
		{name: "bad log level", args: []string{"-log-level", "loud"}, wantErr: "-log-level"},
		{name: "check wants host port", args: []string{"-check", "9092"}, wantErr: "want host:port"},
		{name: "stray argument", args: []string{"extra"}, wantErr: "unexpected arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			getenv := noEnv
			if tt.env != nil {
				getenv = func(k string) string { return tt.env[k] }
			}
			c, err := parseConfig(tt.args, getenv, io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseConfig: %v", err)
			}
			tt.check(t, c)
		})
	}
}

// TestServePersistsAndNeverAutoCreates runs the broker on a free loopback port
// with a data dir, checks it, creates a topic, produces, restarts the broker
// and reads the record back.
func TestServePersistsAndNeverAutoCreates(t *testing.T) {
	port := freePort(t)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	args := []string{"-port", strconv.Itoa(port), "-data-dir", t.TempDir(), "-log-level", "warn"}

	stop := startBroker(t, args)
	var out bytes.Buffer
	if err := run(t.Context(), []string{"-check", addr}, noEnv, &out, io.Discard); err != nil {
		t.Fatalf("check: %v", err)
	}
	if !strings.HasPrefix(out.String(), "ok addr="+addr) {
		t.Errorf("check output %q", out.String())
	}

	cl := newClient(t, addr)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()

	// A metadata request that asks for auto-creation must not create.
	md := kmsg.NewPtrMetadataRequest()
	md.AllowAutoTopicCreation = true
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr("auto.created")
	md.Topics = append(md.Topics, mt)
	mdResp, err := md.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("metadata: %v", err)
	}
	if got := kerr.ErrorForCode(mdResp.Topics[0].ErrorCode); !errors.Is(got, kerr.UnknownTopicOrPartition) {
		t.Fatalf("metadata for a missing topic: %v, want UNKNOWN_TOPIC_OR_PARTITION", got)
	}

	ct := kmsg.NewPtrCreateTopicsRequest()
	topic := kmsg.NewCreateTopicsRequestTopic()
	topic.Topic, topic.NumPartitions, topic.ReplicationFactor = "persisted", 1, 1
	ct.Topics = append(ct.Topics, topic)
	ctResp, err := ct.RequestWith(ctx, cl)
	if err != nil || ctResp.Topics[0].ErrorCode != 0 {
		t.Fatalf("create topic: %v, code %d", err, ctResp.Topics[0].ErrorCode)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "persisted", Value: []byte("kept")}).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
	cl.Close()
	stop()

	startBroker(t, args)
	consumer := newClient(t, addr, kgo.ConsumeTopics("persisted"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	fetches := consumer.PollRecords(ctx, 1)
	if err := fetches.Err0(); err != nil {
		t.Fatalf("poll after restart: %v", err)
	}
	if recs := fetches.Records(); len(recs) != 1 || string(recs[0].Value) != "kept" {
		t.Fatalf("after restart got %d records, want the one produced before", len(recs))
	}
}

func noEnv(string) string { return "" }

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startBroker runs the broker until the returned stop (also run at cleanup).
func startBroker(t *testing.T, args []string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, noEnv, io.Discard, io.Discard) }()
	addr := "127.0.0.1:" + args[1]
	deadline := time.Now().Add(5 * time.Second)
	for {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("broker not listening on %s", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("broker run: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

func newClient(t *testing.T, addr string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addr)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}
