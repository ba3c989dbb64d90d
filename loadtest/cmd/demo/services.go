package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/stream"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
)

// secrets are what the demo makes for one run: the API tokens the console
// (and the demo's narration) present to the quota, adjuster and dlq-auditor
// APIs, the console's session secret and two sign-in accounts. Nothing is
// stored beyond the run: the files holding their hashes are removed at the end.
type secrets struct {
	QuotaToken, AdjusterToken, DLQToken string
	SessionSecret                       string
	Accounts                            []account
}

// account is a console user made for the demo.
type account struct {
	Name, Role, Password string
}

func newSecrets() (secrets, error) {
	var s secrets
	for _, t := range []struct {
		dst    *string
		prefix string
	}{{&s.QuotaToken, "fgq_"}, {&s.AdjusterToken, "fga_"}, {&s.DLQToken, "fgdlq_"}, {&s.SessionSecret, ""}} {
		tok, err := httpapi.NewToken(t.prefix)
		if err != nil {
			return s, err
		}
		*t.dst = tok
	}
	for _, a := range []struct{ name, role string }{{"demo-analyst", "analyst"}, {"demo-sre", "sre"}} {
		b := make([]byte, 15) // 20 characters of base64url: within bcrypt's 72 bytes, above the console's 12
		if _, err := rand.Read(b); err != nil {
			return s, fmt.Errorf("generate password: %w", err)
		}
		s.Accounts = append(s.Accounts, account{Name: a.name, Role: a.role, Password: base64.RawURLEncoding.EncodeToString(b)})
	}
	return s, nil
}

// writeUsersFile writes the console's users file (mode 0600) with the demo
// accounts; the console binary's own `console user add` hashes each password
// (bcrypt), so the file is exactly what an operator would make.
func writeUsersFile(consoleBin, path string, accounts []account) error {
	var b strings.Builder
	b.WriteString("# made by the demo for one run; removed when it stops\nusers:\n")
	for _, a := range accounts {
		cmd := exec.Command(consoleBin, "user", "add", a.Name, a.Role)
		cmd.Stdin = strings.NewReader(a.Password + "\n")
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("console user add %s: %w: %s", a.Name, err, strings.TrimSpace(errOut.String()))
		}
		for _, line := range strings.Split(out.String(), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "- ") {
				b.WriteString(line + "\n")
			}
		}
	}
	b.WriteString("tokens: []\n")
	return os.WriteFile(path, []byte(b.String()), 0o600)
}

// startGroupsAtEnd commits, for a consumer group that has never run, the
// current end of every partition of topics: the group then reads only what
// arrives from now on, as the detector's FLOODGATE_DETECTOR_START_OFFSET=last
// does, instead of the whole history earlier runs and benchmarks left on the
// topics. (A simple commit, generation -1, as for a group with no members.)
func startGroupsAtEnd(ctx context.Context, sec *stream.Security, brokers []string, group string, topics []string) error {
	if len(topics) == 0 {
		return nil
	}
	cl := sec.Client(brokers, 0)
	meta, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: topics})
	if err != nil {
		return fmt.Errorf("metadata of %s: %w", strings.Join(topics, ", "), err)
	}
	reqs := map[string][]kafka.OffsetRequest{}
	for _, t := range meta.Topics {
		if t.Error != nil {
			return fmt.Errorf("metadata of %s: %w", t.Name, t.Error)
		}
		for _, p := range t.Partitions {
			reqs[t.Name] = append(reqs[t.Name], kafka.LastOffsetOf(p.ID))
		}
	}
	offs, err := cl.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: reqs})
	if err != nil {
		return fmt.Errorf("end offsets: %w", err)
	}
	commits := map[string][]kafka.OffsetCommit{}
	for t, ps := range offs.Topics {
		for _, p := range ps {
			if p.Error != nil {
				return fmt.Errorf("end offset of %s/%d: %w", t, p.Partition, p.Error)
			}
			commits[t] = append(commits[t], kafka.OffsetCommit{Partition: p.Partition, Offset: p.LastOffset})
		}
	}
	res, err := cl.OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: group, GenerationID: -1, Topics: commits})
	if err != nil {
		return fmt.Errorf("commit %s at the end: %w", group, err)
	}
	for t, ps := range res.Topics {
		for _, p := range ps {
			if p.Error != nil {
				return fmt.Errorf("commit %s on %s/%d: %w", group, t, p.Partition, p.Error)
			}
		}
	}
	return nil
}

// dlqTopics lists the broker's dead-letter topics (*.dlq), which the
// dlq-auditor reads.
func dlqTopics(ctx context.Context, sec *stream.Security, brokers []string) ([]string, error) {
	cl := sec.Client(brokers, 0)
	meta, err := cl.Metadata(ctx, &kafka.MetadataRequest{})
	if err != nil {
		return nil, fmt.Errorf("list topics: %w", err)
	}
	var out []string
	for _, t := range meta.Topics {
		if strings.HasSuffix(t.Name, ".dlq") {
			out = append(out, t.Name)
		}
	}
	return out, nil
}
