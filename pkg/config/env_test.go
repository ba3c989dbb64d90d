package config

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestEnvParsesAndNamesBadVariables(t *testing.T) {
	vars := map[string]string{
		"A_LIST": " x:1 , ,y:2 ", "A_INT": "12", "A_DUR": "250ms", "A_BOOL": "true", "A_FLOAT": "0.5",
		"BAD_INT": "twelve", "BAD_DUR": "5 minutes",
	}
	e := NewEnv(func(k string) string { return vars[k] })
	if got := e.List("A_LIST", "d"); strings.Join(got, "|") != "x:1|y:2" {
		t.Fatalf("List = %q", got)
	}
	if e.Int("A_INT", 1) != 12 || e.Duration("A_DUR", 0) != 250*time.Millisecond || !e.Bool("A_BOOL", false) || e.Float("A_FLOAT", 0) != 0.5 {
		t.Fatal("typed values not parsed")
	}
	if e.String("UNSET", "def") != "def" || e.Int("UNSET", 7) != 7 {
		t.Fatal("defaults not applied")
	}
	if err := e.Err(); err != nil {
		t.Fatalf("no error expected yet: %v", err)
	}
	e.Int("BAD_INT", 1)
	e.Duration("BAD_DUR", time.Second)
	err := e.Err()
	if err == nil || !strings.Contains(err.Error(), "BAD_INT") || !strings.Contains(err.Error(), "BAD_DUR") {
		t.Fatalf("want both bad variables named, got %v", err)
	}
}

func TestCheckNamesFields(t *testing.T) {
	var c Check
	c.Require(true, "OK_FIELD", "never")
	if c.Err() != nil {
		t.Fatal("passing requirement reported")
	}
	c.Require(false, "FLOODGATE_X", "%d: must be positive", -1)
	if err := c.Err(); err == nil || err.Error() != "FLOODGATE_X: -1: must be positive" {
		t.Fatalf("got %v", err)
	}
}

type validatedConfig struct{ n int }

func (c validatedConfig) Validate() error {
	if c.n < 0 {
		return errors.New("N: must not be negative")
	}
	return nil
}

func TestValidated(t *testing.T) {
	readErr := errors.New("FLOODGATE_N: not a number")
	nested := errors.New("FLOODGATE_M: not a duration")
	tests := []struct {
		name string
		c    validatedConfig
		errs []error
		want validatedConfig
		err  []string
	}{
		{"valid", validatedConfig{3}, []error{nil}, validatedConfig{3}, nil},
		{"reading failed: zero config, every reading error", validatedConfig{3}, []error{readErr, nil, nested}, validatedConfig{}, []string{"FLOODGATE_N", "FLOODGATE_M"}},
		{"read but invalid", validatedConfig{-1}, nil, validatedConfig{-1}, []string{"N: must not be negative"}},
		{"reading errors come before Validate", validatedConfig{-1}, []error{readErr}, validatedConfig{}, []string{"FLOODGATE_N"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Validated(tt.c, tt.errs...)
			require.Equal(t, tt.want, got)
			if tt.err == nil {
				require.NoError(t, err)
				return
			}
			for _, want := range tt.err {
				require.ErrorContains(t, err, want)
			}
		})
	}
}

func TestDefaultFillsWhatIsNotPositive(t *testing.T) {
	t.Parallel()
	for _, v := range []time.Duration{0, -time.Second} {
		Default(&v, time.Minute)
		require.Equal(t, time.Minute, v)
	}
	set := 3
	Default(&set, 64)
	require.Equal(t, 3, set, "a positive value is kept")
	ratio := 0.0
	Default(&ratio, 0.5)
	require.Equal(t, 0.5, ratio)
}
