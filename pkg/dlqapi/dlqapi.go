// Package dlqapi holds the JSON documents of the dlq-auditor's API
// (docs/dlq.md) that the auditor writes and the console reads. One
// definition serves both, so a field the auditor adds or renames is what the
// console decodes.
package dlqapi

// PurgeItem is one record's outcome in a purge: its id and "purged" or
// "not_found".
type PurgeItem struct {
	ID     string `json:"id"`
	Status string `json:"status"`
}

// PurgeResult is POST /v1/purges' answer: how many stored records were
// deleted, and each asked-for record's outcome in the order asked.
type PurgeResult struct {
	Purged int         `json:"purged"`
	Items  []PurgeItem `json:"items"`
}

// ReplayItem is one record's outcome in a replay.
type ReplayItem struct {
	ID              string `json:"id"`
	Status          string `json:"status"`
	Canary          bool   `json:"canary,omitempty"`
	SourceTopic     string `json:"source_topic,omitempty"`
	SourcePartition int    `json:"source_partition,omitempty"`
	NewOffset       int64  `json:"new_offset,omitempty"` // where the replayed copy landed
	Error           string `json:"error,omitempty"`
}

// ReplayResult is POST /v1/replays' answer.
type ReplayResult struct {
	ReplayID    string       `json:"replay_id"`
	Published   int          `json:"published"`
	Failed      int          `json:"failed"`
	Aborted     bool         `json:"aborted"`
	AbortReason string       `json:"abort_reason,omitempty"`
	Items       []ReplayItem `json:"items"`
}
