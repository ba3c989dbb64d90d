// Command migrate applies Floodgate's versioned migrations to Kafka, DynamoDB and InfluxDB.
//
//	go run ./migrations/cmd/migrate [-only kafka,dynamodb,influxdb]
//	go run ./migrations/cmd/migrate -msk-iam-policies DIR [-msk-cluster-arn ARN]
//
// It reads the same environment as the services (FLOODGATE_KAFKA_BROKERS,
// FLOODGATE_DYNAMODB_ENDPOINT, FLOODGATE_INFLUX_URL, ...) and is safe to run again.
// -msk-iam-policies writes the MSK IAM policy documents with the grants of
// the Kafka ACLs (migrations/mskiam.go) into DIR and contacts nothing.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/floodgate-dev/floodgate/migrations"
	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv); err != nil {
		slog.Error("migrate", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv config.Getenv) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	only := fs.String("only", "kafka,dynamodb,influxdb", "backends to reconcile (the ledger is written only when all three run)")
	timeout := fs.Duration("timeout", 2*time.Minute, "give up after this long")
	policies := fs.String("msk-iam-policies", "", "write one MSK IAM policy per service (the Kafka ACLs' grants) and migrate.json into this directory, then exit")
	clusterARN := fs.String("msk-cluster-arn", migrations.ExampleMSKClusterARN, "the MSK cluster of -msk-iam-policies")
	if err := fs.Parse(args); err != nil {
		return err
	}
	env := config.NewEnv(getenv)
	brokers := env.List("FLOODGATE_KAFKA_BROKERS", config.DefaultKafkaBrokers)
	rf := env.Int("FLOODGATE_KAFKA_REPLICATION_FACTOR", 1)
	kafkaSec := config.ReadKafkaSecurity(env)
	ddbEndpoint := env.String("FLOODGATE_DYNAMODB_ENDPOINT", "")
	prefix := env.String("FLOODGATE_DYNAMODB_TABLE_PREFIX", "")
	influxURL := env.String("FLOODGATE_INFLUX_URL", config.DefaultInfluxURL)
	influxToken := env.String("FLOODGATE_INFLUX_TOKEN", "")
	acls := env.Bool("FLOODGATE_KAFKA_ACLS", false)
	aclNames := migrations.ACLNames{
		UserPrefix:     env.String("FLOODGATE_KAFKA_ACL_USER_PREFIX", "floodgate-"),
		DecisionsTopic: env.String("FLOODGATE_DECISIONS_TOPIC", config.DefaultDecisionsTopic),
		AbuseTopic:     env.String("FLOODGATE_ABUSE_TOPIC", config.DefaultAbuseTopic),
		RulesTopic:     env.String("FLOODGATE_RULES_TOPIC", ""),
		DeferredTopic:  env.String("FLOODGATE_DEFERRED_TOPIC", ""),
	}
	if err := env.Err(); err != nil {
		return err
	}
	backends := strings.Split(*only, ",")
	for _, b := range backends {
		if !slices.Contains([]string{"kafka", "dynamodb", "influxdb"}, b) {
			return fmt.Errorf("-only: %q is not one of kafka|dynamodb|influxdb", b)
		}
	}
	ms, lerr := migrations.Load()
	if lerr != nil {
		return lerr
	}
	if *policies != "" {
		return writePolicies(*policies, aclNames, ms, *clusterARN)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	r := &migrations.Runner{Now: time.Now, Report: func(line string) { fmt.Println(line) }}
	if slices.Contains(backends, "kafka") {
		sec, serr := stream.Secure(ctx, brokers, kafkaSec, 10*time.Second, slog.Default())
		if serr != nil {
			return fmt.Errorf("kafka: %w", serr)
		}
		r.Kafka = migrations.NewKafka(brokers, rf, sec)
	}
	if slices.Contains(backends, "dynamodb") {
		client, derr := dynamo.NewClient(ctx, dynamo.Options{Endpoint: ddbEndpoint})
		if derr != nil {
			return derr
		}
		r.Dynamo = &migrations.Dynamo{Client: client, Prefix: prefix}
	}
	if slices.Contains(backends, "influxdb") {
		r.Influx = &migrations.Influx{URL: influxURL, Token: influxToken}
	}
	if err := r.Apply(ctx, ms); err != nil {
		return err
	}
	if acls && r.Kafka != nil { // after the topics exist
		return r.Kafka.ApplyACLs(ctx, migrations.ACLEntries(aclNames, migrations.Grants(aclNames)), r.Report)
	}
	return nil
}

// writePolicies writes the MSK IAM policy documents into dir.
func writePolicies(dir string, n migrations.ACLNames, ms []migrations.Migration, clusterARN string) error {
	files, err := migrations.PolicyFiles(n, ms, clusterARN)
	if err != nil {
		return fmt.Errorf("-msk-iam-policies: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("-msk-iam-policies: %w", err)
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if err := os.WriteFile(filepath.Join(dir, name), files[name], 0o644); err != nil {
			return fmt.Errorf("-msk-iam-policies: %w", err)
		}
		fmt.Println("wrote", filepath.Join(dir, name))
	}
	return nil
}
