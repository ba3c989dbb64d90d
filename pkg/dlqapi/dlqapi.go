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
