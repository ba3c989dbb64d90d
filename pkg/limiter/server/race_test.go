//go:build race

package server

// raceEnabled: built with -race, whose sync.Pool drops some of what it is
// given back on purpose, so allocation counts do not hold.
const raceEnabled = true
