package migrations

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// MSK IAM: the same grants as the Kafka ACLs (Grants), as one IAM policy
// document per service, for clusters whose clients authenticate with IAM
// (FLOODGATE_KAFKA_SASL_MECHANISM=aws-msk-iam), where Kafka ACLs do not
// apply. Each service's IRSA role gets its document; the migrate job's role
// gets MigratePolicy. `migrate -msk-iam-policies DIR` writes them
// (deploy/aws/msk-iam holds the example cluster's), and deploy's packaging
// test regenerates them and fails when a committed file differs.

// ExampleMSKClusterARN is the production overlay's example cluster (AWS's
// documentation account; any cluster UUID).
const ExampleMSKClusterARN = "arn:aws:kafka:us-east-1:123456789012:cluster/floodgate/*"

var mskClusterARN = regexp.MustCompile(`^arn:aws[a-z-]*:kafka:[a-z0-9-]+:[0-9]{12}:cluster/[A-Za-z0-9-]+/[A-Za-z0-9*-]+$`)

// IAMPolicy is an IAM policy document.
type IAMPolicy struct {
	Version   string         `json:"Version"`
	Statement []IAMStatement `json:"Statement"`
}

// IAMStatement is one statement of an IAMPolicy.
type IAMStatement struct {
	Sid      string   `json:"Sid"`
	Effect   string   `json:"Effect"`
	Action   []string `json:"Action"`
	Resource []string `json:"Resource"`
}

// The MSK IAM actions each Kafka ACL operation of Grants stands for.
var (
	// IAMConnect: every client (no ACL needed on a self-managed cluster).
	IAMConnect = []string{"kafka-cluster:Connect", "kafka-cluster:DescribeCluster"}
	// IAMProduce: Topic Write + Describe (producers are not idempotent:
	// kafka-go writers, no WriteDataIdempotently).
	IAMProduce = []string{"kafka-cluster:DescribeTopic", "kafka-cluster:WriteData"}
	// IAMConsume: Topic Read + Describe.
	IAMConsume = []string{"kafka-cluster:DescribeTopic", "kafka-cluster:ReadData"}
	// IAMGroup: Group Read + Describe (join, commit and fetch offsets).
	IAMGroup = []string{"kafka-cluster:AlterGroup", "kafka-cluster:DescribeGroup"}
	// IAMMigrate: what migrate does to the topics of the migrations.
	IAMMigrate = []string{"kafka-cluster:AlterTopic", "kafka-cluster:AlterTopicDynamicConfiguration", "kafka-cluster:CreateTopic",
		"kafka-cluster:DescribeTopic", "kafka-cluster:DescribeTopicDynamicConfiguration"}
)

// mskARNs derives topic and group ARNs from a cluster ARN
// (arn:…:cluster/NAME/UUID → arn:…:topic/NAME/UUID/TOPIC).
type mskARNs struct{ cluster string }

func newMSKARNs(cluster string) (mskARNs, error) {
	if !mskClusterARN.MatchString(cluster) {
		return mskARNs{}, fmt.Errorf("MSK cluster ARN %q: want arn:aws:kafka:REGION:ACCOUNT:cluster/NAME/UUID (UUID may be *)", cluster)
	}
	return mskARNs{cluster: cluster}, nil
}

func (a mskARNs) of(kind string, names []string) []string {
	base := strings.Replace(a.cluster, ":cluster/", ":"+kind+"/", 1)
	out := make([]string, 0, len(names))
	for _, n := range names {
		out = append(out, base+"/"+n)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// MSKIAMPolicies returns each service's policy (by Grant.Service): exactly
// its grants, on the cluster clusterARN.
func MSKIAMPolicies(n ACLNames, clusterARN string) (map[string]IAMPolicy, error) {
	arns, err := newMSKARNs(clusterARN)
	if err != nil {
		return nil, err
	}
	out := map[string]IAMPolicy{}
	for _, g := range Grants(n) {
		p := IAMPolicy{Version: "2012-10-17", Statement: []IAMStatement{
			{Sid: "Connect", Effect: "Allow", Action: IAMConnect, Resource: []string{arns.cluster}},
		}}
		add := func(sid string, actions []string, kind string, names []string) {
			if len(names) > 0 {
				p.Statement = append(p.Statement, IAMStatement{Sid: sid, Effect: "Allow", Action: actions, Resource: arns.of(kind, names)})
			}
		}
		add("Produce", IAMProduce, "topic", g.Produce)
		add("Consume", IAMConsume, "topic", g.Consume)
		add("ConsumerGroups", IAMGroup, "group", g.Groups)
		out[g.Service] = p
	}
	return out, nil
}

// MigratePolicy is the migrate job's policy: create, grow and configure the
// topics of the migrations.
func MigratePolicy(ms []Migration, clusterARN string) (IAMPolicy, error) {
	arns, err := newMSKARNs(clusterARN)
	if err != nil {
		return IAMPolicy{}, err
	}
	var topics []string
	for _, m := range ms {
		for _, t := range m.Kafka.Topics {
			topics = append(topics, t.Name)
		}
	}
	if len(topics) == 0 {
		return IAMPolicy{}, fmt.Errorf("no topics in the migrations")
	}
	return IAMPolicy{Version: "2012-10-17", Statement: []IAMStatement{
		{Sid: "Connect", Effect: "Allow", Action: IAMConnect, Resource: []string{arns.cluster}},
		{Sid: "Topics", Effect: "Allow", Action: IAMMigrate, Resource: arns.of("topic", topics)},
	}}, nil
}

// MarshalPolicy is a policy's file content: indented JSON and a newline.
func MarshalPolicy(p IAMPolicy) ([]byte, error) {
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// PolicyFiles returns every policy file by name: "<service>.json" for each
// service of Grants and "migrate.json".
func PolicyFiles(n ACLNames, ms []Migration, clusterARN string) (map[string][]byte, error) {
	ps, err := MSKIAMPolicies(n, clusterARN)
	if err != nil {
		return nil, err
	}
	mp, err := MigratePolicy(ms, clusterARN)
	if err != nil {
		return nil, err
	}
	ps["migrate"] = mp
	out := map[string][]byte{}
	for svc, p := range ps {
		b, err := MarshalPolicy(p)
		if err != nil {
			return nil, fmt.Errorf("policy of %s: %w", svc, err)
		}
		out[svc+".json"] = b
	}
	return out, nil
}
