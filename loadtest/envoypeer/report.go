package envoypeer

// Report is what `peerbench -json` writes: Floodgate and envoy ratelimit side
// by side, per protocol, from one run (make bench renders it).
type Report struct {
	Rounds   int    `json:"rounds"`
	Duration string `json:"round_duration"`
	Callers  int    `json:"callers"`
	Conns    int    `json:"grpc_connections"`
	Users    int    `json:"users"`
	// Placement says where the processes ran: pinned (the service under
	// test on cores of its own) or not.
	Placement string `json:"placement,omitempty"`
	// Quota is the CPU quota, in cores, each service ran its closed-loop
	// rounds under (peerbench -quota), so that its saturation was within
	// the generator's reach; 0: none.
	Quota       float64      `json:"quota_cores,omitempty"`
	Comparisons []Comparison `json:"comparisons"`
	// Events is what became of Floodgate's decision events over the run.
	Events *Events `json:"decision_events,omitempty"`
}

// Events accounts for Floodgate's decision events after a run: every
// answered call must have left one (issue 15: 0 dropped, checked in the run).
type Events struct {
	Calls          int64   `json:"calls_answered"`  // Floodgate's answered calls, warm-ups included
	Sent           float64 `json:"sent"`            // floodgate_stream_async_sent_total
	Dropped        float64 `json:"refused"`         // floodgate_stream_async_dropped_total
	Failed         float64 `json:"failed"`          // floodgate_stream_async_failed_total
	JournalDropped float64 `json:"journal_dropped"` // floodgate_stream_journal_dropped_total
}

// Delivered reports whether every answered call's event reached Kafka and
// none was refused, failed or dropped.
func (e Events) Delivered() bool {
	return e.Dropped == 0 && e.Failed == 0 && e.JournalDropped == 0 && e.Sent >= float64(e.Calls)
}

// Comparison is one protocol's figures.
type Comparison struct {
	Protocol string          `json:"protocol"` // grpc or http
	Services []ServiceResult `json:"services"` // envoy ratelimit, floodgate, then the do-nothing floor when it ran
	// Ratio is Floodgate's calls/s over envoy ratelimit's.
	Ratio float64 `json:"ratio"`
	// ServiceCPURatio is envoy ratelimit's CPU per call over Floodgate's,
	// each service process alone: the part of the work each service does
	// itself, apart from the Redis, broker and load generator they share
	// the machine with.
	ServiceCPURatio float64 `json:"service_cpu_ratio"`
	// FloorCPURatio is the do-nothing floor's CPU per call over Floodgate's
	// (Floodgate's calls per core-second over the floor's; 1 would be free):
	// 0 when no floor ran.
	FloorCPURatio float64 `json:"floor_cpu_ratio,omitempty"`
	// Open is each service's latencies in the open-loop rounds at a fixed
	// offered rate (peerbench -rate; EqualLoad's, from the rounds its sums
	// hold), in EqualLoad.Services' order; empty when none ran.
	Open []OpenResult `json:"open_loop,omitempty"`
	// Offered is the calls/s every service was offered in these rounds:
	// 0 for the closed-loop rounds, the rate in EqualLoad.
	Offered float64 `json:"offered_per_sec,omitempty"`
	// EqualLoad is the open-loop rounds (peerbench -rate): every service
	// offered the same calls/s over alternating rounds, accounted as the
	// closed-loop ones (CPU per call, cores busy, INVALID rounds left
	// out), so its per core-second ratios hold where the closed loop's
	// generator saturates its cores first (issue 34); nil when none ran.
	EqualLoad *Comparison `json:"equal_load,omitempty"`
}

// OpenResult is one service's open-loop round: calls sent on a fixed
// schedule, each latency from when its call was due.
type OpenResult struct {
	Name     string  `json:"name"`
	Offered  float64 `json:"offered_per_sec"`
	Achieved float64 `json:"achieved_per_sec"`
	Calls    int64   `json:"calls"`
	Errors   int64   `json:"errors"`
	P50Ms    float64 `json:"p50_ms"`
	P99Ms    float64 `json:"p99_ms"`
	P999Ms   float64 `json:"p999_ms"`
}

// ServiceResult sums one service's rounds.
type ServiceResult struct {
	Name        string  `json:"name"`
	Calls       int64   `json:"calls"`
	Errors      int64   `json:"errors"`
	CallsPerSec float64 `json:"calls_per_sec"`
	P50Ms       float64 `json:"p50_ms"`
	P99Ms       float64 `json:"p99_ms"`
	P999Ms      float64 `json:"p999_ms,omitempty"`
	// LoadgenCPU is the load generator's own CPU time over its rounds'
	// wall time × cores: the share of the machine the measurement took.
	LoadgenCPU float64 `json:"loadgen_cpu_share"`
	// CPU is the CPU time each process on the call's path spent per call
	// over the service's rounds, in µs (Linux /proc): where the machine's
	// time went. Broker is 0 for envoy ratelimit, which publishes nothing.
	CPU CallCPU `json:"cpu_us_per_call"`
	// Rounds counts the service's rounds; Invalid the rounds left out
	// because the generator's cores were over 90 % busy (pinned runs; when
	// every round was, the figures sum them all and AllInvalid says so);
	// Behind the open-loop rounds that achieved under 99 % of the offered
	// calls/s.
	Rounds     int  `json:"rounds"`
	Invalid    int  `json:"invalid_rounds"`
	AllInvalid bool `json:"all_invalid,omitempty"`
	Behind     int  `json:"behind_schedule_rounds,omitempty"`
	// CoreBusy is each core's busy share (0..1, /proc/stat) over the
	// service's rounds, cpu0 first.
	CoreBusy []float64 `json:"core_busy,omitempty"`
}

// PerCoreSecond is the calls one core-second of the service's own CPU
// answers (1e6 / its CPU µs per call).
func (s ServiceResult) PerCoreSecond() float64 {
	if s.CPU.Service <= 0 {
		return 0
	}
	return 1e6 / s.CPU.Service
}

// CallCPU is CPU time per call, in µs, by process.
type CallCPU struct {
	Service   float64 `json:"service"`
	Redis     float64 `json:"redis"`
	Broker    float64 `json:"broker"`
	Generator float64 `json:"load_generator"`
}

// Total is the machine's CPU time per call.
func (c CallCPU) Total() float64 { return c.Service + c.Redis + c.Broker + c.Generator }
