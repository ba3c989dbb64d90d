// Package admin is the adjuster's authenticated admin API: SREs read and
// change thresholds, dry-run, the kill switch and overrides; viewers read.
// Every change is validated, based on a version the caller has seen (If-Match)
// and written together with its audit record.
package admin

import (
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
)

// Roles. An sre can do everything a viewer can.
const (
	RoleViewer = "viewer"
	RoleSRE    = "sre"
)

// roles orders the API's roles, least privileged first.
func roles() httpapi.Roles { return httpapi.Roles{RoleViewer, RoleSRE} }

// ParseTokens reads FLOODGATE_ADJUSTER_TOKENS, a token spec (pkg/httpapi):
// name:role:sha256hex entries, e.g. "alice:sre:9f86d0…,dash:viewer:60303a…".
func ParseTokens(spec string) (*httpapi.Tokens, error) { return httpapi.ParseTokenSpec(roles(), spec) }

// HashToken returns the hex SHA-256 of a token, as FLOODGATE_ADJUSTER_TOKENS stores it.
func HashToken(token string) string { return httpapi.HashToken(token) }

// NewToken returns a fresh random token ("fga_" + 43 base64url characters).
func NewToken() (string, error) { return httpapi.NewToken("fga_") }
