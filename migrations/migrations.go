// Package migrations holds Floodgate's versioned infrastructure migrations — Kafka
// topics, DynamoDB tables and the InfluxDB database — and applies them.
//
// Each NNNN_name.yaml file is a desired state. Apply reconciles every backend
// against every migration in version order: what is missing is created, what
// differs in a way that can be changed safely (partition count up, topic configs,
// TTL attributes, missing indexes, retention) is changed, and what matches is left
// alone. Applying twice is therefore a no-op, and a wiped local broker gets its
// topics back even though the ledger says the migration ran. The ledger (a
// DynamoDB table) records each version's checksum: an applied file that changed
// afterwards stops the run, because its effect on other environments is unknown.
package migrations

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

//go:embed *.yaml
var files embed.FS

// Migration is one versioned file.
type Migration struct {
	Version  int        `yaml:"version"`
	Name     string     `yaml:"name"`
	Kafka    KafkaSpec  `yaml:"kafka"`
	DynamoDB DynamoSpec `yaml:"dynamodb"`
	InfluxDB InfluxSpec `yaml:"influxdb"`
	File     string     `yaml:"-"`
	Checksum string     `yaml:"-"`
}

// KafkaSpec lists topics.
type KafkaSpec struct {
	Topics []TopicSpec `yaml:"topics"`
}

// TopicSpec is one topic's desired state.
type TopicSpec struct {
	Name       string            `yaml:"name"`
	Partitions int               `yaml:"partitions"`
	Config     map[string]string `yaml:"config"`
}

// DynamoSpec lists tables.
type DynamoSpec struct {
	Tables []TableSpec `yaml:"tables"`
}

// TableSpec is one table's desired state; billing is always on demand.
type TableSpec struct {
	Name         string      `yaml:"name"`
	PartitionKey KeySpec     `yaml:"partition_key"`
	SortKey      *KeySpec    `yaml:"sort_key"`
	TTLAttribute string      `yaml:"ttl_attribute"`
	Indexes      []IndexSpec `yaml:"indexes"`
}

// KeySpec names a key attribute and its type (S, N or B).
type KeySpec struct {
	Name string `yaml:"name"`
	Type string `yaml:"type"`
}

// IndexSpec is a global secondary index projecting all attributes.
type IndexSpec struct {
	Name         string   `yaml:"name"`
	PartitionKey KeySpec  `yaml:"partition_key"`
	SortKey      *KeySpec `yaml:"sort_key"`
}

// InfluxSpec lists InfluxDB 1.x databases (v2 API bucket = "db/rp").
type InfluxSpec struct {
	Databases []DatabaseSpec `yaml:"databases"`
}

// DatabaseSpec is a database and its default retention policy.
type DatabaseSpec struct {
	Name            string              `yaml:"name"`
	RetentionPolicy RetentionPolicySpec `yaml:"retention_policy"`
}

// RetentionPolicySpec is an InfluxDB retention policy; Duration uses InfluxQL units (30d, 12h, INF).
type RetentionPolicySpec struct {
	Name     string `yaml:"name"`
	Duration string `yaml:"duration"`
	Default  bool   `yaml:"default"`
}

var (
	fileName   = regexp.MustCompile(`^(\d{4})_([a-z0-9_]+)\.yaml$`)
	identifier = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)
	influxDur  = regexp.MustCompile(`^(INF|\d+(ns|u|µ|ms|s|m|h|d|w))$`)
)

// Load reads and validates the embedded migrations, sorted by version.
func Load() ([]Migration, error) { return load(files) }

func load(fsys fs.FS) ([]Migration, error) {
	names, err := fs.Glob(fsys, "*.yaml")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	var out []Migration
	for _, name := range names {
		m, err := parse(fsys, name)
		if err != nil {
			return nil, err
		}
		if want := len(out) + 1; m.Version != want {
			return nil, fmt.Errorf("%s: version %d out of sequence, want %d", name, m.Version, want)
		}
		out = append(out, m)
	}
	if len(out) == 0 {
		return nil, errors.New("no migrations found")
	}
	return out, nil
}

func parse(fsys fs.FS, name string) (Migration, error) {
	raw, err := fs.ReadFile(fsys, name)
	if err != nil {
		return Migration{}, err
	}
	match := fileName.FindStringSubmatch(path.Base(name))
	if match == nil {
		return Migration{}, fmt.Errorf("%s: file name must look like 0001_name.yaml", name)
	}
	var m Migration
	dec := yaml.NewDecoder(strings.NewReader(string(raw)))
	dec.KnownFields(true)
	if err := dec.Decode(&m); err != nil {
		return Migration{}, fmt.Errorf("%s: %w", name, err)
	}
	sum := sha256.Sum256(raw)
	m.File, m.Checksum = name, hex.EncodeToString(sum[:])
	if v, _ := strconv.Atoi(match[1]); v != m.Version {
		return Migration{}, fmt.Errorf("%s: version field %d does not match the file name", name, m.Version)
	}
	if m.Name != match[2] {
		return Migration{}, fmt.Errorf("%s: name field %q does not match the file name", name, m.Name)
	}
	if err := m.Validate(); err != nil {
		return Migration{}, fmt.Errorf("%s: %w", name, err)
	}
	return m, nil
}

// Validate checks every field a backend would otherwise reject halfway through a run.
func (m Migration) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	seen := map[string]bool{}
	for i, t := range m.Kafka.Topics {
		f := fmt.Sprintf("kafka.topics[%d]", i)
		if !identifier.MatchString(t.Name) {
			bad("%s.name: %q is not a valid topic name", f, t.Name)
		}
		if seen["topic/"+t.Name] {
			bad("%s.name: %q listed twice", f, t.Name)
		}
		seen["topic/"+t.Name] = true
		if t.Partitions < 1 || t.Partitions > 1000 {
			bad("%s.partitions: %d not in 1..1000", f, t.Partitions)
		}
		if v, ok := t.Config["retention.ms"]; ok {
			if n, err := strconv.ParseInt(v, 10, 64); err != nil || (n < 1 && n != -1) {
				bad("%s.config.retention.ms: %q is not a positive number of milliseconds or -1", f, v)
			}
		}
	}
	for i, t := range m.DynamoDB.Tables {
		f := fmt.Sprintf("dynamodb.tables[%d]", i)
		if !identifier.MatchString(t.Name) || len(t.Name) < 3 {
			bad("%s.name: %q is not a valid table name", f, t.Name)
		}
		if seen["table/"+t.Name] {
			bad("%s.name: %q listed twice", f, t.Name)
		}
		seen["table/"+t.Name] = true
		errs = append(errs, validKey(f+".partition_key", &t.PartitionKey), validKey(f+".sort_key", t.SortKey))
		for j, ix := range t.Indexes {
			g := fmt.Sprintf("%s.indexes[%d]", f, j)
			if !identifier.MatchString(ix.Name) || len(ix.Name) < 3 {
				bad("%s.name: %q is not a valid index name", g, ix.Name)
			}
			errs = append(errs, validKey(g+".partition_key", &ix.PartitionKey), validKey(g+".sort_key", ix.SortKey))
		}
	}
	for i, d := range m.InfluxDB.Databases {
		f := fmt.Sprintf("influxdb.databases[%d]", i)
		if !identifier.MatchString(d.Name) {
			bad("%s.name: %q is not a valid database name", f, d.Name)
		}
		if !identifier.MatchString(d.RetentionPolicy.Name) {
			bad("%s.retention_policy.name: %q is not a valid name", f, d.RetentionPolicy.Name)
		}
		if !influxDur.MatchString(d.RetentionPolicy.Duration) {
			bad("%s.retention_policy.duration: %q is not an InfluxQL duration such as 30d or INF", f, d.RetentionPolicy.Duration)
		}
	}
	return errors.Join(errs...)
}

func validKey(field string, k *KeySpec) error {
	if k == nil {
		return nil
	}
	if k.Name == "" {
		return fmt.Errorf("%s.name: required", field)
	}
	switch k.Type {
	case "S", "N", "B":
		return nil
	}
	return fmt.Errorf("%s.type: %q is not one of S|N|B", field, k.Type)
}

// Record is one row of the migrations ledger.
type Record struct {
	Version   int
	Name      string
	Checksum  string
	AppliedAt time.Time
}
