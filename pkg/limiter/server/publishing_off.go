//go:build floodgate_noevents

package server

// Publishing: see publishing.go. This build publishes no decision event.
const Publishing = false
