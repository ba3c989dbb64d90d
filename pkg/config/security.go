package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
)

// Secret is a credential read from the environment or a mounted file. It
// prints as "[redacted]" in every fmt verb, in slog and in JSON, so a config
// struct that ends up in a log line or an error never shows it. Reveal gives
// the value to the one client that needs it.
type Secret string

const redacted = "[redacted]"

// Reveal returns the credential itself.
func (s Secret) Reveal() string { return string(s) }

// String hides the value (empty stays empty, so "unset" is still visible).
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

// GoString hides the value from %#v.
func (s Secret) GoString() string { return `config.Secret("` + s.String() + `")` }

// LogValue hides the value from slog.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalText hides the value from encoding/json and friends.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Secret reads a credential from the variable name, or from the file that
// fileName names (a secret mounted as a file, as Kubernetes and Docker do);
// one trailing newline of the file is dropped. Setting both is an error, and
// so is a file that cannot be read. Errors name the variables, never the value.
func (e *Env) Secret(name, fileName string) Secret {
	v := e.get(name) // not trimmed: a password may end in a space
	path := strings.TrimSpace(e.get(fileName))
	switch {
	case v != "" && path != "":
		e.errs = append(e.errs, fmt.Errorf("%s and %s: set one, not both", name, fileName))
		return ""
	case path != "":
		b, err := os.ReadFile(path)
		if err != nil {
			e.errs = append(e.errs, fmt.Errorf("%s=%q: %w", fileName, path, err))
			return ""
		}
		s := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
		if s == "" {
			e.errs = append(e.errs, fmt.Errorf("%s=%q: the file is empty", fileName, path))
		}
		return Secret(s)
	}
	return Secret(v)
}

// TLSVars names the variables of one kind of connection's TLS settings and
// what its far end is called, for the errors that tell an operator which
// variable to fix: config reads them (ReadRedisSecurity, ReadKafkaSecurity)
// and the clients explain a refused connection with them (Refusal).
type TLSVars struct{ peer, addrs, enabled, ca, cert, key, serverName string }

// RedisTLS names the FLOODGATE_REDIS_TLS* variables.
func RedisTLS() TLSVars {
	return TLSVars{peer: "server", addrs: "FLOODGATE_REDIS_ADDRS", enabled: "FLOODGATE_REDIS_TLS", ca: "FLOODGATE_REDIS_TLS_CA_FILE",
		cert: "FLOODGATE_REDIS_TLS_CERT_FILE", key: "FLOODGATE_REDIS_TLS_KEY_FILE", serverName: "FLOODGATE_REDIS_TLS_SERVER_NAME"}
}

// KafkaTLS names the FLOODGATE_KAFKA_TLS* variables.
func KafkaTLS() TLSVars {
	return TLSVars{peer: "broker", addrs: "FLOODGATE_KAFKA_BROKERS", enabled: "FLOODGATE_KAFKA_TLS", ca: "FLOODGATE_KAFKA_TLS_CA_FILE",
		cert: "FLOODGATE_KAFKA_TLS_CERT_FILE", key: "FLOODGATE_KAFKA_TLS_KEY_FILE", serverName: "FLOODGATE_KAFKA_TLS_SERVER_NAME"}
}

// Refusal explains err when it is a TLS connection that cannot be set up,
// which retrying does not fix — the peer's certificate does not verify or is
// for another name, the peer does not speak TLS on the port, or it refused
// the handshake, or it speaks TLS where plaintext is configured
// (*TransportMismatchError, either way) — naming the variables to check; ""
// when err is none of these. crypto/tls's messages never quote a key or a password.
func (v TLSVars) Refusal(err error) string {
	var (
		unknownCA x509.UnknownAuthorityError
		hostErr   x509.HostnameError
		invalid   x509.CertificateInvalidError
		verifyErr *tls.CertificateVerificationError
		recordErr tls.RecordHeaderError
		alertErr  tls.AlertError
		mismatch  *TransportMismatchError
		noCert    *ClientCertRequiredError
	)
	switch {
	case err == nil:
		return ""
	case errors.As(err, &mismatch) && mismatch.PeerTLS:
		return fmt.Sprintf("the %s at %s speaks TLS on this port, but %s is not true: set %s=true (and %s for a private CA), or point %s at its plaintext port",
			v.peer, mismatch.Addr, v.enabled, v.enabled, v.ca, v.addrs)
	case errors.As(err, &mismatch):
		return fmt.Sprintf("the %s at %s speaks plaintext on this port, but %s is true: set %s=false, or point %s at its TLS port",
			v.peer, mismatch.Addr, v.enabled, v.enabled, v.addrs)
	case errors.As(err, &noCert):
		return fmt.Sprintf("the %s at %s asks for a client certificate and none is configured: set %s and %s", v.peer, noCert.Addr, v.cert, v.key)
	case errors.As(err, &hostErr): // before verifyErr, which wraps it
		return fmt.Sprintf("the %s's TLS certificate is for another name: check %s or %s", v.peer, v.addrs, v.serverName)
	case errors.As(err, &unknownCA), errors.As(err, &invalid), errors.As(err, &verifyErr):
		return fmt.Sprintf("the %s's TLS certificate does not verify: check %s (the CA that signed the %s's certificate; unset = the system's roots)", v.peer, v.ca, v.peer)
	case errors.As(err, &recordErr):
		return fmt.Sprintf("the %s does not speak TLS on this port: check %s and the port in %s", v.peer, v.enabled, v.addrs)
	case errors.As(err, &alertErr), strings.Contains(err.Error(), "remote error: tls:"):
		return fmt.Sprintf("the %s refused the TLS handshake (a client certificate it does not accept?): check %s and %s", v.peer, v.cert, v.key)
	}
	return ""
}

// tls reads TLS settings: nil when the enabling variable is false (plaintext).
// The CA file replaces the system roots (a private CA); cert and key together
// are the client certificate for mutual TLS; server name overrides the name
// checked in the server's certificate (by default the host dialed). Files are
// read now, so a missing or malformed one stops start-up naming its variable.
func (e *Env) tls(v TLSVars) *tls.Config {
	on := e.Bool(v.enabled, false)
	ca, cert, key, name := e.String(v.ca, ""), e.String(v.cert, ""), e.String(v.key, ""), e.String(v.serverName, "")
	if !on {
		for _, set := range []struct{ name, value string }{{v.ca, ca}, {v.cert, cert}, {v.key, key}, {v.serverName, name}} {
			if set.value != "" {
				e.errs = append(e.errs, fmt.Errorf("%s is set but %s is not true: set %s=true to use TLS", set.name, v.enabled, v.enabled))
			}
		}
		return nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: name}
	if ca != "" {
		c.RootCAs = e.caPool(v.ca, ca)
	}
	switch {
	case (cert == "") != (key == ""):
		e.errs = append(e.errs, fmt.Errorf("%s and %s: set both (a client certificate and its key) or neither", v.cert, v.key))
	case cert != "":
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			// LoadX509KeyPair's errors describe the files, never the key's bytes.
			e.errs = append(e.errs, fmt.Errorf("%s=%q and %s=%q: %w", v.cert, cert, v.key, key, err))
		} else {
			c.Certificates = []tls.Certificate{pair}
		}
	}
	return c
}

// caPool reads the PEM certificates of the file path, which the variable
// name names; nil, with the error recorded naming the variable, when the
// file cannot be read or holds no certificate.
func (e *Env) caPool(name, path string) *x509.CertPool {
	pem, err := os.ReadFile(path)
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("%s=%q: %w", name, path, err))
		return nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		e.errs = append(e.errs, fmt.Errorf("%s=%q: no PEM certificate in the file", name, path))
		return nil
	}
	return pool
}

// Kafka SASL mechanisms (FLOODGATE_KAFKA_SASL_MECHANISM).
const (
	SASLPlain       = "plain"
	SASLScramSHA256 = "scram-sha-256"
	SASLScramSHA512 = "scram-sha-512"
	SASLAWSMSKIAM   = "aws-msk-iam"
)

// SASLMechanisms are the allowed values of FLOODGATE_KAFKA_SASL_MECHANISM.
var SASLMechanisms = []string{SASLPlain, SASLScramSHA256, SASLScramSHA512, SASLAWSMSKIAM}

// KafkaSecurity is how every Kafka client of a service encrypts and
// authenticates its connections. The zero value is plaintext without
// authentication (the local stack). pkg/stream turns it into kafka-go and
// franz-go settings (stream.NewSecurity).
type KafkaSecurity struct {
	// TLS is nil for plaintext (FLOODGATE_KAFKA_TLS and its files).
	TLS *tls.Config
	// SASLMechanism is empty (none) or one of SASLMechanisms.
	SASLMechanism string
	// SASLUsername and SASLPassword are for plain and scram-*.
	SASLUsername string
	SASLPassword Secret
	// AWSRegion is the MSK cluster's region for aws-msk-iam; empty = the AWS
	// SDK's own (AWS_REGION). Credentials come from the SDK's default chain
	// (IRSA web identity, instance role, AWS_ACCESS_KEY_ID…).
	AWSRegion string
}

// ReadKafkaSecurity reads the Kafka transport settings; problems are
// collected in e like every other variable's.
func ReadKafkaSecurity(e *Env) KafkaSecurity {
	s := KafkaSecurity{
		TLS:           e.tls(KafkaTLS()),
		SASLMechanism: strings.ToLower(e.String("FLOODGATE_KAFKA_SASL_MECHANISM", "")),
		SASLUsername:  e.String("FLOODGATE_KAFKA_SASL_USERNAME", ""),
		SASLPassword:  e.Secret("FLOODGATE_KAFKA_SASL_PASSWORD", "FLOODGATE_KAFKA_SASL_PASSWORD_FILE"),
		AWSRegion:     e.String("FLOODGATE_KAFKA_AWS_REGION", ""),
	}
	e.errs = append(e.errs, s.validate()...)
	return s
}

func (s KafkaSecurity) validate() []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	switch s.SASLMechanism {
	case "":
		if s.SASLUsername != "" || s.SASLPassword != "" {
			bad("FLOODGATE_KAFKA_SASL_USERNAME / FLOODGATE_KAFKA_SASL_PASSWORD are set but FLOODGATE_KAFKA_SASL_MECHANISM is not (want one of %s)", strings.Join(SASLMechanisms, ", "))
		}
		if s.AWSRegion != "" {
			bad("FLOODGATE_KAFKA_AWS_REGION is set but FLOODGATE_KAFKA_SASL_MECHANISM is not %s", SASLAWSMSKIAM)
		}
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
		if s.SASLUsername == "" {
			bad("FLOODGATE_KAFKA_SASL_USERNAME: required with FLOODGATE_KAFKA_SASL_MECHANISM=%s", s.SASLMechanism)
		}
		if s.SASLPassword == "" {
			bad("FLOODGATE_KAFKA_SASL_PASSWORD (or FLOODGATE_KAFKA_SASL_PASSWORD_FILE): required with FLOODGATE_KAFKA_SASL_MECHANISM=%s", s.SASLMechanism)
		}
		if s.AWSRegion != "" {
			bad("FLOODGATE_KAFKA_AWS_REGION is only used with FLOODGATE_KAFKA_SASL_MECHANISM=%s", SASLAWSMSKIAM)
		}
	case SASLAWSMSKIAM:
		if s.SASLUsername != "" || s.SASLPassword != "" {
			bad("FLOODGATE_KAFKA_SASL_USERNAME / FLOODGATE_KAFKA_SASL_PASSWORD are not used with %s (credentials come from the AWS SDK's default chain); unset them", SASLAWSMSKIAM)
		}
		if s.TLS == nil {
			bad("FLOODGATE_KAFKA_TLS: must be true with FLOODGATE_KAFKA_SASL_MECHANISM=%s (MSK's IAM listener is TLS-only, port 9098)", SASLAWSMSKIAM)
		}
	default:
		bad("FLOODGATE_KAFKA_SASL_MECHANISM=%q: want one of %s, or empty for none", s.SASLMechanism, strings.Join(SASLMechanisms, ", "))
	}
	return errs
}

// Describe is a one-line summary for start-up logs: never a credential.
func (s KafkaSecurity) Describe() string {
	out := "plaintext"
	if s.TLS != nil {
		out = "tls"
		if len(s.TLS.Certificates) > 0 {
			out = "mtls"
		}
	}
	if s.SASLMechanism != "" {
		out += "+sasl/" + s.SASLMechanism
	}
	return out
}

// RedisSecurity is how every Redis client of a service encrypts and
// authenticates its connections: standalone, cluster or through Sentinel.
// The zero value is plaintext without AUTH (the local stack).
type RedisSecurity struct {
	// Username and Password are sent with AUTH (an ACL user; no username is
	// the "default" user, as with requirepass).
	Username string
	Password Secret
	// SentinelUsername and SentinelPassword authenticate to the sentinels
	// themselves, which have their own ACLs (Sentinel mode only).
	SentinelUsername string
	SentinelPassword Secret
	// TLS is nil for plaintext. With Sentinel it is used for the sentinels
	// and the data nodes alike (go-redis has one TLS setting).
	TLS *tls.Config
}

// ReadRedisSecurity reads the Redis transport settings into e.
func ReadRedisSecurity(e *Env) RedisSecurity {
	s := RedisSecurity{
		Username:         e.String("FLOODGATE_REDIS_USERNAME", ""),
		Password:         e.Secret("FLOODGATE_REDIS_PASSWORD", "FLOODGATE_REDIS_PASSWORD_FILE"),
		SentinelUsername: e.String("FLOODGATE_REDIS_SENTINEL_USERNAME", ""),
		SentinelPassword: e.Secret("FLOODGATE_REDIS_SENTINEL_PASSWORD", "FLOODGATE_REDIS_SENTINEL_PASSWORD_FILE"),
		TLS:              e.tls(RedisTLS()),
	}
	if s.Username != "" && s.Password == "" {
		e.errs = append(e.errs, fmt.Errorf("FLOODGATE_REDIS_PASSWORD (or FLOODGATE_REDIS_PASSWORD_FILE): required with FLOODGATE_REDIS_USERNAME"))
	}
	if s.SentinelUsername != "" && s.SentinelPassword == "" {
		e.errs = append(e.errs, fmt.Errorf("FLOODGATE_REDIS_SENTINEL_PASSWORD (or FLOODGATE_REDIS_SENTINEL_PASSWORD_FILE): required with FLOODGATE_REDIS_SENTINEL_USERNAME"))
	}
	return s
}

// Describe is a one-line summary for start-up logs: never a credential.
func (s RedisSecurity) Describe() string {
	parts := []string{"plaintext"}
	if s.TLS != nil {
		parts[0] = "tls"
		if len(s.TLS.Certificates) > 0 {
			parts[0] = "mtls"
		}
	}
	if s.Password != "" {
		user := s.Username
		if user == "" {
			user = "default"
		}
		parts = append(parts, "auth/"+user)
	}
	return strings.Join(parts, "+")
}

// Backends are the Redis and the Kafka brokers a service needs before it can
// start (service.Runner.Connect), with how it reaches them. Services embed
// them in their Config and read them with backends.Read.
type Backends struct {
	RedisAddrs    []string      // FLOODGATE_REDIS_ADDRS
	RedisSecurity RedisSecurity // FLOODGATE_REDIS_USERNAME, FLOODGATE_REDIS_PASSWORD, FLOODGATE_REDIS_TLS*
	KafkaBrokers  []string      // FLOODGATE_KAFKA_BROKERS
	KafkaSecurity KafkaSecurity // FLOODGATE_KAFKA_TLS*, FLOODGATE_KAFKA_SASL_* (docs/configuration.md)
}
