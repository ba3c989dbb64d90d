package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/tracing"
)

// TracingConfig is the tracing a service runs with, read from the standard
// OpenTelemetry variables (the OTel SDK environment specification). Tracing
// is off unless OTEL_TRACES_EXPORTER names an exporter or an OTLP endpoint
// is set; off, no provider is built and every component skips its spans.
type TracingConfig struct {
	// Exporters: "otlp" and/or "console" (OTEL_TRACES_EXPORTER); none is off.
	Exporters []string
	// Protocol of the OTLP exporter: "http/protobuf" (default) or "grpc"
	// (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL).
	Protocol string
	// Endpoint is the OTLP traces URL: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as
	// given, else OTEL_EXPORTER_OTLP_ENDPOINT (with /v1/traces appended for
	// http/protobuf); "" is the exporter's default (localhost:4318 or 4317).
	Endpoint string
	// Sampler from OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG; default
	// parentbased_always_on.
	Sampler sdktrace.Sampler
	// Propagator from OTEL_PROPAGATORS (tracecontext, baggage, none); default
	// tracecontext,baggage.
	Propagator propagation.TextMapPropagator
	// ServiceName is the resource's service.name: OTEL_SERVICE_NAME, else a
	// service.name in OTEL_RESOURCE_ATTRIBUTES, else the service's own name.
	ServiceName string
	// Attributes are OTEL_RESOURCE_ATTRIBUTES' other resource attributes
	// (the SDK adds its telemetry.sdk.* ones).
	Attributes map[string]string
}

// Enabled reports whether any exporter is configured.
func (c TracingConfig) Enabled() bool { return len(c.Exporters) > 0 }

// TracingConfigFromEnv reads the OTEL_* variables for the service name;
// errors name the variable. OTEL_SDK_DISABLED=true turns tracing off whatever
// else is set. The OTLP exporter's other settings (OTEL_EXPORTER_OTLP_HEADERS,
// _TIMEOUT, _COMPRESSION, _CERTIFICATE, …) and the batch processor's
// (OTEL_BSP_*) are read by the OpenTelemetry SDK itself from the process
// environment.
func TracingConfigFromEnv(getenv config.Getenv, name string) (TracingConfig, error) {
	var c TracingConfig
	var errs []error
	bad := func(variable, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", variable, fmt.Sprintf(format, args...)))
	}
	get := func(k string) string { return strings.TrimSpace(getenv(k)) }
	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") {
		return c, nil
	}

	tracesEndpoint, endpoint := get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), get("OTEL_EXPORTER_OTLP_ENDPOINT")
	exporters := get("OTEL_TRACES_EXPORTER")
	if exporters == "" && (tracesEndpoint != "" || endpoint != "") {
		exporters = "otlp" // an endpoint asks for tracing; with nothing set it stays off
	}
	for _, e := range strings.Split(exporters, ",") {
		switch e = strings.TrimSpace(e); e {
		case "", "none":
		case "otlp", "console":
			if !slices.Contains(c.Exporters, e) {
				c.Exporters = append(c.Exporters, e)
			}
		default:
			bad("OTEL_TRACES_EXPORTER", "%q: want otlp, console or none", e)
		}
	}
	if slices.Contains(strings.Split(exporters, ","), "none") && len(c.Exporters) > 0 {
		bad("OTEL_TRACES_EXPORTER", "%q: none cannot be combined with an exporter", exporters)
	}

	protoVar := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	c.Protocol = get(protoVar)
	if c.Protocol == "" {
		protoVar, c.Protocol = "OTEL_EXPORTER_OTLP_PROTOCOL", get("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch c.Protocol {
	case "":
		c.Protocol = "http/protobuf"
	case "http/protobuf", "grpc":
	default:
		bad(protoVar, "%q: want http/protobuf or grpc (http/json is not supported)", c.Protocol)
	}

	switch {
	case tracesEndpoint != "":
		if err := checkEndpoint(tracesEndpoint); err != nil {
			bad("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "%v", err)
		}
		c.Endpoint = tracesEndpoint
	case endpoint != "":
		if err := checkEndpoint(endpoint); err != nil {
			bad("OTEL_EXPORTER_OTLP_ENDPOINT", "%v", err)
		}
		c.Endpoint = endpoint
		if c.Protocol == "http/protobuf" { // the base URL: signals go to /v1/<signal>
			c.Endpoint = strings.TrimSuffix(endpoint, "/") + "/v1/traces"
		}
	}

	sampler, err := samplerFromEnv(get("OTEL_TRACES_SAMPLER"), get("OTEL_TRACES_SAMPLER_ARG"))
	if err != nil {
		errs = append(errs, err)
	}
	c.Sampler = sampler

	c.Propagator, err = propagatorFromEnv(get("OTEL_PROPAGATORS"))
	if err != nil {
		errs = append(errs, err)
	}

	attrs, err := resourceAttrs(get("OTEL_RESOURCE_ATTRIBUTES"))
	if err != nil {
		errs = append(errs, err)
	}
	service := get("OTEL_SERVICE_NAME")
	if service == "" {
		service = attrs["service.name"]
	}
	if service == "" {
		service = name
	}
	delete(attrs, "service.name")
	c.ServiceName, c.Attributes = service, attrs
	if err := errors.Join(errs...); err != nil {
		return TracingConfig{}, err
	}
	return c, nil
}

func checkEndpoint(v string) error {
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q: want an http:// or https:// URL", v)
	}
	return nil
}

func samplerFromEnv(name, arg string) (sdktrace.Sampler, error) {
	ratio := func() (float64, error) {
		if arg == "" {
			return 1, nil
		}
		f, err := strconv.ParseFloat(arg, 64)
		if err != nil || f < 0 || f > 1 {
			return 0, fmt.Errorf("OTEL_TRACES_SAMPLER_ARG: %q: want a ratio in [0, 1]", arg)
		}
		return f, nil
	}
	switch name {
	case "", "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "traceidratio":
		r, err := ratio()
		return sdktrace.TraceIDRatioBased(r), err
	case "parentbased_traceidratio":
		r, err := ratio()
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(r)), err
	}
	return nil, fmt.Errorf("OTEL_TRACES_SAMPLER: %q: want always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio", name)
}

func propagatorFromEnv(v string) (propagation.TextMapPropagator, error) {
	if v == "" {
		return tracing.DefaultPropagator(), nil
	}
	var ps []propagation.TextMapPropagator
	for _, p := range strings.Split(v, ",") {
		switch p = strings.TrimSpace(p); p {
		case "tracecontext":
			ps = append(ps, propagation.TraceContext{})
		case "baggage":
			ps = append(ps, propagation.Baggage{})
		case "none":
		default:
			return nil, fmt.Errorf("OTEL_PROPAGATORS: %q: want tracecontext, baggage or none", p)
		}
	}
	return propagation.NewCompositeTextMapPropagator(ps...), nil
}

// resourceAttrs parses OTEL_RESOURCE_ATTRIBUTES: key=value pairs separated by
// commas, values percent-encoded.
func resourceAttrs(v string) (map[string]string, error) {
	out := map[string]string{}
	if v == "" {
		return out, nil
	}
	for _, kv := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %q: want key=value pairs separated by commas", kv)
		}
		dec, err := url.PathUnescape(strings.TrimSpace(val))
		if err != nil {
			return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %q: %w", kv, err)
		}
		out[k] = dec
	}
	return out, nil
}

// StartTracing builds the tracer provider cfg asks for: spans batched to
// the configured exporters (console spans go to stdout, os.Stdout when
// nil). Off, it returns the zero Tracing and a no-op shutdown. shutdown
// flushes the spans still queued and stops the exporters; call it once, as
// the process ends.
func StartTracing(ctx context.Context, cfg TracingConfig, stdout io.Writer) (t tracing.Tracing, shutdown func(context.Context) error, err error) {
	if !cfg.Enabled() {
		return tracing.Tracing{}, func(context.Context) error { return nil }, nil
	}
	attrs := []attribute.KeyValue{semconv.ServiceName(cfg.ServiceName)}
	for _, k := range slices.Sorted(maps.Keys(cfg.Attributes)) {
		attrs = append(attrs, attribute.String(k, cfg.Attributes[k]))
	}
	res, err := resource.New(ctx, resource.WithTelemetrySDK(), resource.WithSchemaURL(semconv.SchemaURL), resource.WithAttributes(attrs...))
	if err != nil {
		return tracing.Tracing{}, nil, fmt.Errorf("tracing: resource: %w", err)
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithSampler(cfg.Sampler), sdktrace.WithResource(res)}
	for _, name := range cfg.Exporters {
		var exp sdktrace.SpanExporter
		switch name {
		case "otlp":
			if cfg.Protocol == "grpc" {
				var o []otlptracegrpc.Option
				if cfg.Endpoint != "" {
					o = append(o, otlptracegrpc.WithEndpointURL(cfg.Endpoint))
				}
				exp, err = otlptracegrpc.New(ctx, o...)
			} else {
				var o []otlptracehttp.Option
				if cfg.Endpoint != "" {
					o = append(o, otlptracehttp.WithEndpointURL(cfg.Endpoint))
				}
				exp, err = otlptracehttp.New(ctx, o...)
			}
		case "console":
			if stdout == nil {
				stdout = os.Stdout
			}
			exp, err = stdouttrace.New(stdouttrace.WithWriter(stdout))
		}
		if err != nil {
			return tracing.Tracing{}, nil, fmt.Errorf("tracing: %s exporter: %w", name, err)
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	return tracing.Tracing{Provider: tp, Propagator: cfg.Propagator}, tp.Shutdown, nil
}
