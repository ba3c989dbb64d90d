package config_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/tlstest"
)

func envOf(vars map[string]string) *config.Env {
	return config.NewEnv(func(k string) string { return vars[k] })
}

// TestSecretNeverPrints: a Secret shows "[redacted]" through every way a
// config struct reaches a log or an error, and Reveal gives the value.
func TestSecretNeverPrints(t *testing.T) {
	const pw = "hunter2-the-password"
	s := config.RedisSecurity{Username: "app", Password: config.Secret(pw)}
	k := config.KafkaSecurity{SASLMechanism: config.SASLPlain, SASLUsername: "app", SASLPassword: config.Secret(pw)}
	var logs bytes.Buffer
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("config", "redis", s.Password, "kafka", k.SASLPassword)
	slog.New(slog.NewTextHandler(&logs, nil)).Info("config", "redis", s.Password)
	j, err := json.Marshal(k)
	require.NoError(t, err)
	for _, out := range []string{
		fmt.Sprintf("%v", s), fmt.Sprintf("%+v", s), fmt.Sprintf("%#v", s), fmt.Sprintf("%s", s.Password),
		fmt.Sprintf("%v", k), fmt.Sprintf("%+v", k), fmt.Sprintf("%q", k.SASLPassword), fmt.Sprint(k.SASLPassword),
		fmt.Errorf("wrapped: %v", k).Error(), logs.String(), string(j), s.Describe(), k.Describe(),
	} {
		require.NotContains(t, out, pw)
	}
	require.Contains(t, fmt.Sprintf("%+v", s), "[redacted]")
	require.Equal(t, pw, s.Password.Reveal())
	require.Equal(t, "", config.Secret("").String(), "an unset secret stays visibly unset")
}

func TestSecretFromFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "pw")
	require.NoError(t, os.WriteFile(file, []byte("from-file-pw\n"), 0o600))

	e := envOf(map[string]string{"FLOODGATE_REDIS_PASSWORD_FILE": file})
	s := config.ReadRedisSecurity(e)
	require.NoError(t, e.Err())
	require.Equal(t, "from-file-pw", s.Password.Reveal(), "one trailing newline dropped")

	e = envOf(map[string]string{"FLOODGATE_REDIS_PASSWORD_FILE": file, "FLOODGATE_REDIS_PASSWORD": "inline-pw"})
	config.ReadRedisSecurity(e)
	require.ErrorContains(t, e.Err(), "FLOODGATE_REDIS_PASSWORD and FLOODGATE_REDIS_PASSWORD_FILE: set one, not both")
	require.NotContains(t, e.Err().Error(), "inline-pw")

	e = envOf(map[string]string{"FLOODGATE_KAFKA_SASL_MECHANISM": "scram-sha-512", "FLOODGATE_KAFKA_SASL_USERNAME": "u",
		"FLOODGATE_KAFKA_SASL_PASSWORD_FILE": filepath.Join(dir, "missing")})
	config.ReadKafkaSecurity(e)
	require.ErrorContains(t, e.Err(), "FLOODGATE_KAFKA_SASL_PASSWORD_FILE=")
}

// TestReadSecurityErrors: every inconsistent setting stops start-up with an
// error naming its variable, and the defaults are plaintext without auth.
func TestReadSecurityErrors(t *testing.T) {
	ca := tlstest.NewCA(t, "cfg")
	client := ca.Client("c")
	garbage := filepath.Join(t.TempDir(), "garbage.pem")
	require.NoError(t, os.WriteFile(garbage, []byte("not a certificate"), 0o600))

	e := envOf(nil)
	k, r := config.ReadKafkaSecurity(e), config.ReadRedisSecurity(e)
	require.NoError(t, e.Err())
	require.Nil(t, k.TLS)
	require.Nil(t, r.TLS)
	require.Equal(t, "plaintext", k.Describe())
	require.Equal(t, "plaintext", r.Describe())

	for _, tc := range []struct {
		name string
		vars map[string]string
		want string
	}{
		{"unknown mechanism", map[string]string{"FLOODGATE_KAFKA_SASL_MECHANISM": "gssapi"}, `FLOODGATE_KAFKA_SASL_MECHANISM="gssapi": want one of plain, scram-sha-256, scram-sha-512, aws-msk-iam`},
		{"scram without user", map[string]string{"FLOODGATE_KAFKA_SASL_MECHANISM": "scram-sha-256", "FLOODGATE_KAFKA_SASL_PASSWORD": "p"}, "FLOODGATE_KAFKA_SASL_USERNAME: required"},
		{"plain without password", map[string]string{"FLOODGATE_KAFKA_SASL_MECHANISM": "plain", "FLOODGATE_KAFKA_SASL_USERNAME": "u"}, "FLOODGATE_KAFKA_SASL_PASSWORD (or FLOODGATE_KAFKA_SASL_PASSWORD_FILE): required"},
		{"user without mechanism", map[string]string{"FLOODGATE_KAFKA_SASL_USERNAME": "u"}, "FLOODGATE_KAFKA_SASL_MECHANISM is not"},
		{"iam without tls", map[string]string{"FLOODGATE_KAFKA_SASL_MECHANISM": "aws-msk-iam"}, "FLOODGATE_KAFKA_TLS: must be true"},
		{"iam with a password", map[string]string{"FLOODGATE_KAFKA_SASL_MECHANISM": "aws-msk-iam", "FLOODGATE_KAFKA_TLS": "true", "FLOODGATE_KAFKA_SASL_PASSWORD": "p"}, "are not used with aws-msk-iam"},
		{"ca without tls", map[string]string{"FLOODGATE_KAFKA_TLS_CA_FILE": ca.CertFile}, "FLOODGATE_KAFKA_TLS_CA_FILE is set but FLOODGATE_KAFKA_TLS is not true"},
		{"tls not a bool", map[string]string{"FLOODGATE_REDIS_TLS": "yes please"}, `FLOODGATE_REDIS_TLS="yes please": want true or false`},
		{"missing ca", map[string]string{"FLOODGATE_REDIS_TLS": "true", "FLOODGATE_REDIS_TLS_CA_FILE": "/nonexistent/ca.pem"}, `FLOODGATE_REDIS_TLS_CA_FILE="/nonexistent/ca.pem"`},
		{"ca without pem", map[string]string{"FLOODGATE_KAFKA_TLS": "true", "FLOODGATE_KAFKA_TLS_CA_FILE": garbage}, "FLOODGATE_KAFKA_TLS_CA_FILE=" + fmt.Sprintf("%q", garbage) + ": no PEM certificate"},
		{"cert without key", map[string]string{"FLOODGATE_REDIS_TLS": "true", "FLOODGATE_REDIS_TLS_CERT_FILE": client.CertFile}, "FLOODGATE_REDIS_TLS_CERT_FILE and FLOODGATE_REDIS_TLS_KEY_FILE: set both"},
		{"key that is not a key", map[string]string{"FLOODGATE_KAFKA_TLS": "true", "FLOODGATE_KAFKA_TLS_CERT_FILE": client.CertFile, "FLOODGATE_KAFKA_TLS_KEY_FILE": garbage}, "FLOODGATE_KAFKA_TLS_CERT_FILE="},
		{"redis user without password", map[string]string{"FLOODGATE_REDIS_USERNAME": "app"}, "FLOODGATE_REDIS_PASSWORD (or FLOODGATE_REDIS_PASSWORD_FILE): required with FLOODGATE_REDIS_USERNAME"},
		{"sentinel user without password", map[string]string{"FLOODGATE_REDIS_SENTINEL_USERNAME": "s"}, "FLOODGATE_REDIS_SENTINEL_PASSWORD (or FLOODGATE_REDIS_SENTINEL_PASSWORD_FILE): required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := envOf(tc.vars)
			config.ReadKafkaSecurity(e)
			config.ReadRedisSecurity(e)
			require.ErrorContains(t, e.Err(), tc.want)
		})
	}

	e = envOf(map[string]string{"FLOODGATE_REDIS_TLS": "true", "FLOODGATE_REDIS_TLS_CA_FILE": ca.CertFile,
		"FLOODGATE_REDIS_TLS_CERT_FILE": client.CertFile, "FLOODGATE_REDIS_TLS_KEY_FILE": client.KeyFile,
		"FLOODGATE_REDIS_TLS_SERVER_NAME": "redis.internal", "FLOODGATE_REDIS_USERNAME": "app", "FLOODGATE_REDIS_PASSWORD": "p"})
	r = config.ReadRedisSecurity(e)
	require.NoError(t, e.Err())
	require.Equal(t, "redis.internal", r.TLS.ServerName)
	require.Len(t, r.TLS.Certificates, 1)
	require.NotNil(t, r.TLS.RootCAs)
	require.Equal(t, "mtls+auth/app", r.Describe())
}
