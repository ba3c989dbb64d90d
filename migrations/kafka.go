package migrations

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// Kafka reconciles topics through the Kafka admin API.
type Kafka struct {
	Client *kafka.Client
	// ReplicationFactor for new topics: 1 on the local broker, 3 on a production cluster.
	ReplicationFactor int
}

// NewKafka returns a reconciler talking to brokers. It has its own transport:
// kafka-go's shared DefaultTransport caches cluster metadata for seconds, and a
// reconciler must see the topics as they are now. sec is the TLS and SASL
// of its connections (nil: plaintext).
func NewKafka(brokers []string, replicationFactor int, sec *stream.Security) *Kafka {
	t := sec.Transport()
	t.MetadataTTL = time.Second
	return &Kafka{
		Client:            &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 15 * time.Second, Transport: t},
		ReplicationFactor: replicationFactor,
	}
}

// Apply makes every topic in specs exist with at least its partitions and its configs.
func (k *Kafka) Apply(ctx context.Context, specs []TopicSpec, report func(string)) error {
	if len(specs) == 0 {
		return nil
	}
	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.Name
	}
	meta, err := k.Client.Metadata(ctx, &kafka.MetadataRequest{Topics: names})
	if err != nil {
		return fmt.Errorf("kafka metadata: %w", err)
	}
	existing := map[string]int{}
	for _, t := range meta.Topics {
		if t.Error == nil {
			existing[t.Name] = len(t.Partitions)
		}
	}

	var create []kafka.TopicConfig
	for _, s := range specs {
		have, ok := existing[s.Name]
		switch {
		case !ok:
			create = append(create, kafka.TopicConfig{
				Topic:             s.Name,
				NumPartitions:     s.Partitions,
				ReplicationFactor: k.ReplicationFactor,
				ConfigEntries:     configEntries(s.Config),
			})
		case have < s.Partitions:
			if err := k.growPartitions(ctx, s.Name, s.Partitions); err != nil {
				return err
			}
			report(fmt.Sprintf("kafka topic %s: partitions %d -> %d", s.Name, have, s.Partitions))
		case have > s.Partitions:
			report(fmt.Sprintf("kafka topic %s: has %d partitions, migration asks %d; Kafka cannot shrink, left as is", s.Name, have, s.Partitions))
		}
		if ok {
			changed, err := k.alignConfig(ctx, s)
			if err != nil {
				return err
			}
			if len(changed) > 0 {
				report(fmt.Sprintf("kafka topic %s: config set %v", s.Name, changed))
			} else if have >= s.Partitions {
				report(fmt.Sprintf("kafka topic %s: ok", s.Name))
			}
		}
	}
	if len(create) == 0 {
		return nil
	}
	resp, err := k.Client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: create})
	if err != nil {
		return fmt.Errorf("kafka create topics: %w", err)
	}
	for _, t := range create {
		if err := resp.Errors[t.Topic]; err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
			return fmt.Errorf("kafka create topic %s: %w", t.Topic, err)
		}
		report(fmt.Sprintf("kafka topic %s: created with %d partitions", t.Topic, t.NumPartitions))
	}
	return nil
}

func (k *Kafka) growPartitions(ctx context.Context, topic string, count int) error {
	resp, err := k.Client.CreatePartitions(ctx, &kafka.CreatePartitionsRequest{
		Topics: []kafka.TopicPartitionsConfig{{Name: topic, Count: int32(count)}},
	})
	if err == nil {
		err = resp.Errors[topic]
	}
	if err != nil {
		return fmt.Errorf("kafka grow %s to %d partitions: %w", topic, count, err)
	}
	return nil
}

// alignConfig sets the configs whose current value differs and returns their names.
func (k *Kafka) alignConfig(ctx context.Context, s TopicSpec) ([]string, error) {
	if len(s.Config) == 0 {
		return nil, nil
	}
	keys := make([]string, 0, len(s.Config))
	for name := range s.Config {
		keys = append(keys, name)
	}
	sort.Strings(keys)
	desc, err := k.Client.DescribeConfigs(ctx, &kafka.DescribeConfigsRequest{
		Resources: []kafka.DescribeConfigRequestResource{{
			ResourceType: kafka.ResourceTypeTopic, ResourceName: s.Name, ConfigNames: keys,
		}},
	})
	if err != nil {
		return nil, fmt.Errorf("kafka describe configs of %s: %w", s.Name, err)
	}
	current := map[string]string{}
	for _, r := range desc.Resources {
		if r.Error != nil {
			return nil, fmt.Errorf("kafka describe configs of %s: %w", s.Name, r.Error)
		}
		for _, e := range r.ConfigEntries {
			current[e.ConfigName] = e.ConfigValue
		}
	}
	var set []kafka.IncrementalAlterConfigsRequestConfig
	var changed []string
	for _, name := range keys {
		if v := s.Config[name]; current[name] != v {
			set = append(set, kafka.IncrementalAlterConfigsRequestConfig{Name: name, Value: v, ConfigOperation: kafka.ConfigOperationSet})
			changed = append(changed, name)
		}
	}
	if len(set) == 0 {
		return nil, nil
	}
	resp, err := k.Client.IncrementalAlterConfigs(ctx, &kafka.IncrementalAlterConfigsRequest{
		Resources: []kafka.IncrementalAlterConfigsRequestResource{{
			ResourceType: kafka.ResourceTypeTopic, ResourceName: s.Name, Configs: set,
		}},
	})
	if err != nil {
		return nil, fmt.Errorf("kafka alter configs of %s: %w", s.Name, err)
	}
	for _, r := range resp.Resources {
		if r.Error != nil {
			return nil, fmt.Errorf("kafka alter configs of %s: %w", s.Name, r.Error)
		}
	}
	return changed, nil
}

func configEntries(cfg map[string]string) []kafka.ConfigEntry {
	keys := make([]string, 0, len(cfg))
	for name := range cfg {
		keys = append(keys, name)
	}
	sort.Strings(keys)
	out := make([]kafka.ConfigEntry, len(keys))
	for i, name := range keys {
		out[i] = kafka.ConfigEntry{ConfigName: name, ConfigValue: cfg[name]}
	}
	return out
}
