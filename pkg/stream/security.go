package stream

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	mskiam "github.com/segmentio/kafka-go/sasl/aws_msk_iam_v2"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
	"github.com/twmb/franz-go/pkg/kgo"
	kgosasl "github.com/twmb/franz-go/pkg/sasl"
	kgoaws "github.com/twmb/franz-go/pkg/sasl/aws"
	kgoplain "github.com/twmb/franz-go/pkg/sasl/plain"
	kgoscram "github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/floodgate-dev/floodgate/pkg/config"
)

// Security is the TLS and SASL of every Kafka connection a service makes:
// kafka-go's Transport (writers, clients), its Dialer (consumer groups,
// readers) and franz-go's client (the partition reader) get the same
// settings from here. A nil *Security is plaintext without authentication.
// It is immutable and safe for concurrent use.
type Security struct {
	desc  string
	tls   *tls.Config
	mech  sasl.Mechanism    // kafka-go
	franz kgosasl.Mechanism // franz-go
}

// tlsConf is the clients' TLS settings, nil for plaintext (and for no
// Security at all).
func (s *Security) tlsConf() *tls.Config {
	if s == nil {
		return nil
	}
	return s.tls
}

// NewSecurity builds the clients' settings from c (read by
// config.ReadKafkaSecurity). For aws-msk-iam it loads the AWS SDK's default
// configuration (region and credential chain; credentials are fetched at
// each connection, so rotated ones are picked up). Errors name the
// variables.
func NewSecurity(ctx context.Context, c config.KafkaSecurity) (*Security, error) {
	if c.TLS == nil && c.SASLMechanism == "" {
		return nil, nil // plaintext: every client keeps kafka-go's and franz-go's defaults
	}
	s := &Security{desc: c.Describe(), tls: c.TLS}
	user, pass := c.SASLUsername, c.SASLPassword.Reveal()
	switch c.SASLMechanism {
	case "":
	case config.SASLPlain:
		s.mech = plain.Mechanism{Username: user, Password: pass}
		s.franz = kgoplain.Auth{User: user, Pass: pass}.AsMechanism()
	case config.SASLScramSHA256, config.SASLScramSHA512:
		algo, franz := scram.SHA256, kgoscram.Auth{User: user, Pass: pass}.AsSha256Mechanism()
		if c.SASLMechanism == config.SASLScramSHA512 {
			algo, franz = scram.SHA512, kgoscram.Auth{User: user, Pass: pass}.AsSha512Mechanism()
		}
		m, err := scram.Mechanism(algo, user, pass)
		if err != nil {
			// scram.Mechanism fails only on a username or password SASLprep
			// rejects; its error quotes neither.
			return nil, fmt.Errorf("FLOODGATE_KAFKA_SASL_USERNAME / FLOODGATE_KAFKA_SASL_PASSWORD: %w", err)
		}
		s.mech, s.franz = m, franz
	case config.SASLAWSMSKIAM:
		var opts []func(*awsconfig.LoadOptions) error
		if c.AWSRegion != "" {
			opts = append(opts, awsconfig.WithRegion(c.AWSRegion))
		}
		cfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
		if err != nil {
			return nil, fmt.Errorf("FLOODGATE_KAFKA_SASL_MECHANISM=%s: load the AWS configuration: %w", config.SASLAWSMSKIAM, err)
		}
		if cfg.Region == "" {
			return nil, fmt.Errorf("FLOODGATE_KAFKA_AWS_REGION (or AWS_REGION): required with FLOODGATE_KAFKA_SASL_MECHANISM=%s", config.SASLAWSMSKIAM)
		}
		s.mech = mskiam.NewMechanism(cfg)
		creds := aws.NewCredentialsCache(cfg.Credentials)
		s.franz = kgoaws.ManagedStreamingIAM(func(ctx context.Context) (kgoaws.Auth, error) {
			v, err := creds.Retrieve(ctx)
			if err != nil {
				return kgoaws.Auth{}, fmt.Errorf("aws credentials for kafka: %w", err)
			}
			return kgoaws.Auth{AccessKey: v.AccessKeyID, SecretKey: v.SecretAccessKey, SessionToken: v.SessionToken}, nil
		})
	default:
		return nil, fmt.Errorf("FLOODGATE_KAFKA_SASL_MECHANISM=%q: want one of %s", c.SASLMechanism, strings.Join(config.SASLMechanisms, ", "))
	}
	return s, nil
}

// String is the summary for logs ("tls+sasl/scram-sha-512"); never a credential.
func (s *Security) String() string {
	if s == nil {
		return "plaintext"
	}
	return s.desc
}

// Transport returns a new kafka-go Transport with these settings (for
// writers and clients). Set MetadataTTL and the like on the result.
func (s *Security) Transport() *kafka.Transport {
	t := &kafka.Transport{}
	if s != nil {
		t.TLS, t.SASL = s.tls, s.mech
	}
	return t
}

// Dialer returns a new kafka-go Dialer with these settings (for consumer
// groups, readers and kafka.Conn), otherwise like kafka.DefaultDialer.
func (s *Security) Dialer() *kafka.Dialer {
	d := &kafka.Dialer{Timeout: 10 * time.Second, DualStack: true}
	if s != nil {
		d.TLS, d.SASLMechanism = s.tls, s.mech
	}
	return d
}

// Client returns a kafka-go Client of brokers with these settings. With a
// nil Security it uses kafka-go's shared default transport, as before.
func (s *Security) Client(brokers []string, timeout time.Duration) *kafka.Client {
	c := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: timeout}
	if s != nil {
		c.Transport = s.Transport()
	}
	return c
}

// kgoOpts are the franz-go client options for these settings.
func (s *Security) kgoOpts() []kgo.Opt {
	if s == nil {
		return nil
	}
	var opts []kgo.Opt
	if s.tls != nil {
		opts = append(opts, kgo.DialTLSConfig(s.tls.Clone()))
	}
	if s.franz != nil {
		opts = append(opts, kgo.SASL(s.franz))
	}
	return opts
}

// Secure is what a service does at start-up: it builds the settings
// (NewSecurity) and, when there are any, checks once that brokers accept
// them (CheckAccess, within timeout), so wrong credentials or a wrong CA stop
// start-up with an error naming the variable instead of every client
// retrying forever. Plaintext without authentication (the local stack) is
// not checked, as before.
func Secure(ctx context.Context, brokers []string, c config.KafkaSecurity, timeout time.Duration, log *slog.Logger) (*Security, error) {
	sec, err := NewSecurity(ctx, c)
	if err != nil {
		return nil, err
	}
	if sec == nil { // plaintext: only whether the brokers speak TLS instead (issue 37)
		return nil, checkPlaintext(ctx, brokers, timeout)
	}
	if err := CheckAccess(ctx, brokers, sec, timeout, log); err != nil {
		return nil, err
	}
	log.Info("kafka security", "security", sec.String())
	return sec, nil
}

// ErrKafkaAccess marks a start-up check that reached a broker and was
// refused: TLS that does not verify, or credentials the broker rejects.
// Retrying does not help; the configuration must change.
var ErrKafkaAccess = errors.New("kafka access refused")

// CheckAccess asks brokers for metadata once, within timeout, with the
// service's settings. It returns an error wrapping ErrKafkaAccess, naming
// the variables to fix, when the connection is refused for its security
// (an untrusted certificate, TLS against a plaintext listener, SASL
// authentication failed or a mechanism the broker lacks); nil when the
// brokers answered; and, when they could not be reached at all, logs a
// warning and returns nil: a broker that is down is not a configuration
// error, and the clients retry. Error messages never carry a credential.
func CheckAccess(ctx context.Context, brokers []string, sec *Security, timeout time.Duration, log *slog.Logger) error {
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// The Dialer, not the Transport: kafka-go's Transport reports a refused
	// SASL exchange as the broker closing the connection (unexpected EOF),
	// its Dialer with the broker's error code.
	d := sec.Dialer()
	d.Timeout = timeout
	var errs []error
	for _, b := range brokers {
		conn, err := d.DialContext(ctx, "tcp", b)
		if err == nil {
			_, err = conn.Brokers() // one request after the handshake
			_ = conn.Close()
		}
		if err == nil {
			return nil
		}
		if refused := classifyAccess(err, sec); refused != nil {
			return refused
		}
		if mm := transportMismatch(parent, b, sec.tlsConf(), err); mm != nil {
			return mm
		}
		errs = append(errs, fmt.Errorf("%s: %w", b, err))
	}
	log.Warn("kafka brokers unreachable at start-up; clients will retry", "brokers", strings.Join(brokers, ","),
		"security", sec.String(), "err", errors.Join(errs...))
	return nil
}

// classifyAccess turns an error that retrying cannot fix into one naming
// the variables behind it, or returns nil.
func classifyAccess(err error, sec *Security) error {
	if why := config.KafkaTLS().Refusal(err); why != "" {
		return fmt.Errorf("%w: %s: %w", ErrKafkaAccess, why, err)
	}
	var kafkaErr kafka.Error
	mechanism := "none"
	if sec != nil && sec.mech != nil {
		mechanism = sec.mech.Name()
	}
	switch {
	case errors.As(err, &kafkaErr) && (kafkaErr == kafka.SASLAuthenticationFailed || kafkaErr == kafka.IllegalSASLState):
		return fmt.Errorf("%w: SASL %s authentication failed: check FLOODGATE_KAFKA_SASL_USERNAME and FLOODGATE_KAFKA_SASL_PASSWORD (or the AWS credentials for aws-msk-iam): %w", ErrKafkaAccess, mechanism, err)
	case errors.As(err, &kafkaErr) && kafkaErr == kafka.UnsupportedSASLMechanism:
		return fmt.Errorf("%w: the broker does not offer SASL %s: check FLOODGATE_KAFKA_SASL_MECHANISM and the port in FLOODGATE_KAFKA_BROKERS: %w", ErrKafkaAccess, mechanism, err)
	case errors.As(err, &kafkaErr) && kafkaErr == kafka.TopicAuthorizationFailed, errors.As(err, &kafkaErr) && kafkaErr == kafka.ClusterAuthorizationFailed:
		return fmt.Errorf("%w: the broker refused this user: check FLOODGATE_KAFKA_SASL_USERNAME and its ACLs: %w", ErrKafkaAccess, err)
	}
	return nil
}

// checkPlaintext asks the first broker that answers for metadata in
// plaintext; when one does not, an error wrapping ErrKafkaAccess if it
// speaks TLS on that port, nil if it is merely unreachable (the clients
// retry).
func checkPlaintext(ctx context.Context, brokers []string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	d := &kafka.Dialer{Timeout: timeout, DualStack: true}
	for _, b := range brokers {
		conn, err := d.DialContext(ctx, "tcp", b)
		if err == nil {
			_, err = conn.Brokers()
			_ = conn.Close()
		}
		if err == nil {
			return nil
		}
		if mm := transportMismatch(context.WithoutCancel(ctx), b, nil, err); mm != nil {
			return mm
		}
	}
	return nil
}

// transportMismatch explains a failed connection to broker b (made with TLS
// conf, nil for plaintext): an error wrapping ErrKafkaAccess naming the
// variables to fix when the broker speaks the other transport or wants a
// client certificate the client has not, nil otherwise.
func transportMismatch(ctx context.Context, b string, conf *tls.Config, err error) error {
	mm := config.ProbeTransport(ctx, b, conf, err, func(_ context.Context, c net.Conn) bool {
		_, err := kafka.NewConn(c, "", 0).ApiVersions()
		return err == nil
	}, time.Second)
	if mm == nil {
		return nil
	}
	return fmt.Errorf("%w: %s: %w", ErrKafkaAccess, config.KafkaTLS().Refusal(mm), mm)
}
