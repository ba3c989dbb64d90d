package dynamo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Tuning proposals (docs/detector.md, Tuning proposals): the detector's
// `propose` command builds them from reviewers' false-positive verdicts and
// proves each by replaying recorded decisions; the console lists them and an
// SRE applies one through a detector parameters rollout. Each is one item of
// floodgate_runtime_config, pk ProposalPrefix + id, its fields as JSON in
// attribute "doc" (the detector writes, the console reads and marks one
// applied).

// ProposalPrefix starts the pk of a tuning proposal.
const ProposalPrefix = "detector#proposal#"

// ProposalChange is one parameter a proposal moves.
type ProposalChange struct {
	Param string `json:"param"` // the parameters document's name, e.g. person_sustain
	From  string `json:"from"`
	To    string `json:"to"`
}

// Proposal is one tuning proposal with its replay evidence.
type Proposal struct {
	ID        string    `json:"id"`
	CreatedAt time.Time `json:"created_at"`
	CreatedBy string    `json:"created_by"`
	// The class it was built for: a pattern on a principal kind (and a
	// route template when set), and how many false-positive verdicts of it.
	Pattern      string           `json:"pattern"`
	Kind         string           `json:"kind"`
	Route        string           `json:"route,omitempty"`
	FromVerdicts int              `json:"from_verdicts"`
	Changes      []ProposalChange `json:"changes"`
	// Params is the detector parameters document (YAML) an apply rolls out;
	// BaseVersion the parameters version it was built on (0: none).
	Params      string `json:"params"`
	BaseVersion int64  `json:"base_version"`
	// The replay: the recorded decisions of [From, To) through the detector
	// with the proposal, against the verdicts on the detections made with
	// the parameters in force.
	SpanFrom  time.Time `json:"span_from"`
	SpanTo    time.Time `json:"span_to"`
	Decisions int       `json:"decisions"`
	Evidence  Evidence  `json:"evidence"`
	Meets     bool      `json:"meets"` // the targets (≥ 90 % of the class's false positives avoided, ≥ 99.5 % of confirmed kept)
	// Set when an SRE applied it: the parameters version of its rollout.
	AppliedVersion int64  `json:"applied_version,omitempty"`
	AppliedBy      string `json:"applied_by,omitempty"`
	AppliedAt      string `json:"applied_at,omitempty"`
}

// Evidence is a proposal's replay counts.
type Evidence struct {
	Confirmed      int `json:"confirmed"`       // confirmed detections judged
	ConfirmedKept  int `json:"confirmed_kept"`  // of those, still detected with the proposal
	FalsePositives int `json:"false_positives"` // false-positive detections judged
	FPAvoided      int `json:"fp_avoided"`      // of those, no longer detected
	ClassFPs       int `json:"class_fps"`       // false positives of the proposal's class
	ClassFPAvoided int `json:"class_fp_avoided"`
	NewDetections  int `json:"new_detections"` // principals detected with the proposal only (unjudged)
}

// KeptShare is the share of confirmed detections kept (1 with none).
func (e Evidence) KeptShare() float64 {
	if e.Confirmed == 0 {
		return 1
	}
	return float64(e.ConfirmedKept) / float64(e.Confirmed)
}

// ClassAvoidedShare is the share of the class's false positives avoided.
func (e Evidence) ClassAvoidedShare() float64 {
	if e.ClassFPs == 0 {
		return 0
	}
	return float64(e.ClassFPAvoided) / float64(e.ClassFPs)
}

// Class names the proposal's class: "rapid_fire/user on /x".
func (p Proposal) Class() string {
	s := p.Pattern + "/" + p.Kind
	if p.Route != "" {
		s += " on " + p.Route
	}
	return s
}

// ErrProposalApplied: the proposal was applied already (or does not exist).
var ErrProposalApplied = errors.New("the proposal does not exist or was applied already")

// maxProposalDoc bounds a stored proposal.
const maxProposalDoc = 128 << 10

// PutProposal stores p (a new id each time).
func PutProposal(ctx context.Context, c *dynamodb.Client, table string, p Proposal) error {
	doc, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("encode proposal %s: %w", p.ID, err)
	}
	if len(doc) > maxProposalDoc {
		return fmt.Errorf("proposal %s: %d bytes, at most %d", p.ID, len(doc), maxProposalDoc)
	}
	_, err = c.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: map[string]types.AttributeValue{
		"pk": &types.AttributeValueMemberS{Value: ProposalPrefix + p.ID}, "doc": &types.AttributeValueMemberS{Value: string(doc)},
	}, ConditionExpression: aws.String("attribute_not_exists(pk)")})
	if err != nil {
		return fmt.Errorf("store proposal %s: %w", p.ID, err)
	}
	return nil
}

// ListProposals returns every stored proposal, newest first.
func ListProposals(ctx context.Context, c *dynamodb.Client, table string) ([]Proposal, error) {
	var out []Proposal
	pages := dynamodb.NewScanPaginator(c, &dynamodb.ScanInput{TableName: aws.String(table),
		FilterExpression:          aws.String("begins_with(pk, :p)"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":p": &types.AttributeValueMemberS{Value: ProposalPrefix}}})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("list proposals: %w", err)
		}
		for _, it := range page.Items {
			p, err := decodeProposal(it)
			if err != nil {
				return nil, err
			}
			out = append(out, p)
		}
	}
	for i := 1; i < len(out); i++ { // newest first; a handful of items
		for j := i; j > 0 && out[j].CreatedAt.After(out[j-1].CreatedAt); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out, nil
}

// GetProposal reads proposal id (false when there is none).
func GetProposal(ctx context.Context, c *dynamodb.Client, table, id string) (Proposal, bool, error) {
	out, err := c.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: ProposalPrefix + id}}})
	if err != nil {
		return Proposal{}, false, fmt.Errorf("get proposal %s: %w", id, err)
	}
	if out.Item == nil {
		return Proposal{}, false, nil
	}
	p, err := decodeProposal(out.Item)
	return p, err == nil, err
}

// MarkProposalApplied records that proposal id was rolled out as version v
// by who; a proposal applied already is refused (ErrProposalApplied).
func MarkProposalApplied(ctx context.Context, c *dynamodb.Client, table, id string, v int64, who string, at time.Time) error {
	out, err := c.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: ProposalPrefix + id}}})
	if err != nil {
		return fmt.Errorf("get proposal %s: %w", id, err)
	}
	if out.Item == nil {
		return ErrProposalApplied
	}
	p, err := decodeProposal(out.Item)
	if err != nil {
		return err
	}
	if p.AppliedVersion != 0 {
		return ErrProposalApplied
	}
	old := Str(out.Item["doc"])
	p.AppliedVersion, p.AppliedBy, p.AppliedAt = v, who, at.UTC().Format(time.RFC3339)
	doc, err := json.Marshal(p)
	if err != nil {
		return err
	}
	_, err = c.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: map[string]types.AttributeValue{
		"pk": &types.AttributeValueMemberS{Value: ProposalPrefix + id}, "doc": &types.AttributeValueMemberS{Value: string(doc)},
	}, ConditionExpression: aws.String("doc = :old"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":old": &types.AttributeValueMemberS{Value: old}}})
	var cond *types.ConditionalCheckFailedException
	if errors.As(err, &cond) {
		return ErrProposalApplied
	}
	if err != nil {
		return fmt.Errorf("mark proposal %s applied: %w", id, err)
	}
	return nil
}

func decodeProposal(it map[string]types.AttributeValue) (Proposal, error) {
	var p Proposal
	pk := Str(it["pk"])
	if err := json.Unmarshal([]byte(Str(it["doc"])), &p); err != nil {
		return p, fmt.Errorf("decode proposal %s: %w", pk, err)
	}
	p.ID = strings.TrimPrefix(pk, ProposalPrefix)
	return p, nil
}
