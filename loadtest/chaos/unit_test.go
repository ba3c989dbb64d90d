package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/loadtest/internal/perfsplit"
	"github.com/floodgate-dev/floodgate/loadtest/internal/promtext"
	"github.com/floodgate-dev/floodgate/pkg/events"
)

func TestSummarise(t *testing.T) {
	t0 := time.Unix(1000, 0)
	checks := []Check{
		{Start: t0, Latency: time.Millisecond, OK: true, Allowed: true},
		{Start: t0.Add(time.Second), Latency: 2 * time.Millisecond, OK: true, Degraded: true, Allowed: true},
		{Start: t0.Add(2 * time.Second), Latency: 3 * time.Millisecond},
		{Start: t0.Add(3 * time.Second), Latency: 4 * time.Millisecond, OK: true},
	}
	for _, tc := range []struct {
		name     string
		from, to time.Time
		want     Window
		avail    string
	}{
		{"all", time.Time{}, time.Time{}, Window{Sent: 4, Answered: 3, Degraded: 1, Allowed: 2, P50: 3 * time.Millisecond, P99: 4 * time.Millisecond, Max: 4 * time.Millisecond}, "75.00 %"},
		{"half-open window", t0.Add(time.Second), t0.Add(3 * time.Second), Window{Sent: 2, Answered: 1, Degraded: 1, Allowed: 1, P50: 3 * time.Millisecond, P99: 3 * time.Millisecond, Max: 3 * time.Millisecond}, "50.00 %"},
		{"empty", t0.Add(time.Hour), time.Time{}, Window{}, "n/a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := Summarise(checks, tc.from, tc.to)
			require.Equal(t, tc.want, w)
			require.Equal(t, tc.avail, w.Availability())
		})
	}
}

func TestCompareLedger(t *testing.T) {
	a, b := DayKey{"user:a", "2026-11-22"}, DayKey{"user:b", "2026-11-22"}
	for _, tc := range []struct {
		name      string
		want, got map[DayKey]int64
		wrong     int
	}{
		{"exact", map[DayKey]int64{a: 3, b: 4}, map[DayKey]int64{a: 3, b: 4}, 0},
		{"double counted", map[DayKey]int64{a: 3, b: 4}, map[DayKey]int64{a: 6, b: 4}, 1},
		{"missing item", map[DayKey]int64{a: 3, b: 4}, map[DayKey]int64{a: 3}, 1},
		{"unexpected item", map[DayKey]int64{a: 3}, map[DayKey]int64{a: 3, b: 1}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wrong, _, _ := CompareLedger(tc.want, tc.got)
			require.Equal(t, tc.wrong, wrong)
		})
	}
}

// TestDynamoFaults checks the proxy against a fake upstream: reads always
// pass, writes fail at the set share in the three ways, and a lost answer
// still reaches the upstream.
func TestDynamoFaults(t *testing.T) {
	var upstreamWrites atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.Header.Get("X-Amz-Target"), "UpdateItem") {
			upstreamWrites.Add(1)
		}
		_, _ = io.WriteString(w, `{}`)
	}))
	defer up.Close()
	f, err := NewDynamoFaults(up.URL)
	require.NoError(t, err)
	defer f.Close()
	call := func(op string) int {
		req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, f.URL, strings.NewReader(`{}`))
		require.NoError(t, err)
		req.Header.Set("X-Amz-Target", "DynamoDB_20120810."+op)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		name       string
		rate       float64
		op         string
		wantFailed int
	}{
		{"off", 0, "UpdateItem", 0},
		{"reads pass", 1, "GetItem", 0},
		{"every write fails", 1, "UpdateItem", 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.SetRate(tc.rate)
			failed := 0
			for range 30 {
				if call(tc.op) != http.StatusOK {
					failed++
				}
			}
			require.Equal(t, tc.wantFailed, failed)
		})
	}
	counts, writes := f.Counts()
	require.Equal(t, map[string]int64{"throttled": 10, "server_error": 10, "lost_answer": 10}, counts)
	require.Equal(t, int64(60), writes)
	require.Equal(t, int64(30+10), upstreamWrites.Load(), "30 passed while off, 10 applied with a lost answer")
}

// TestCapacityFindsThePeakGoodput: the capacity search goes past the knee
// to the most answers within the deadline any rate gets, stops two steps
// after they stop rising, and marks the knee.
func TestCapacityFindsThePeakGoodput(t *testing.T) {
	// A limiter that answers in time all it is offered up to 1,000/s, then
	// 1,000/s of what it is offered up to 1,500/s, then less.
	inTime := func(rate int) int {
		switch {
		case rate <= 1000:
			return rate
		case rate <= 1500:
			return 1000
		}
		return max(2500-rate, 0)
	}
	var offered []int
	got, gotRate, notes, err := capacity(2000, func(rate int) (capacityStepResult, error) {
		offered = append(offered, rate)
		return capacityStepResult{rate: rate, sent: rate, inTime: inTime(rate), span: time.Second}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got != 1000 || gotRate != 1171 {
		t.Errorf("capacity = %.0f/s at %d/s offered, want the peak, 1000/s, first at 1171/s (steps %v)", got, gotRate, notes)
	}
	if want := []int{600, 750, 937, 1171, 1464, 1831}; !slices.Equal(offered, want) {
		t.Errorf("offered %v, want %v: rising ×1.25 from 0.3× and two flat steps past the peak", offered, want)
	}
	for i, n := range notes {
		if knee := strings.Contains(n, "the knee"); knee != (i == 2) {
			t.Errorf("step %d (%s): knee marked %v, want it on 937/s only, the highest rate answered ≥ 95 %% in time", i, n, knee)
		}
	}

	// A goodput that never stops rising ends the search at capacitySteps;
	// a step's error ends it at once.
	steps := 0
	got, _, _, err = capacity(2000, func(rate int) (capacityStepResult, error) {
		steps++
		return capacityStepResult{rate: rate, sent: rate, inTime: rate, span: time.Second}, nil
	})
	if err != nil || steps != capacitySteps || got < 2000*capacityFrom*math.Pow(capacityRise, capacitySteps-2) {
		t.Errorf("rising forever: %d steps, capacity %.0f, err %v; want %d steps and the last step's rate", steps, got, err, capacitySteps)
	}
	boom := errors.New("boom")
	if _, _, _, err := capacity(2000, func(int) (capacityStepResult, error) { return capacityStepResult{}, boom }); !errors.Is(err, boom) {
		t.Errorf("a failed step: err %v, want %v", err, boom)
	}
}

// tallyPhase counts what an overload phase's callers got as the targets
// and invariants read it: a late answer is neither in time nor failed
// open, a critical call not answered counts as the deadline, and its
// latency at the socket is used where it was read.
func TestTallyPhase(t *testing.T) {
	began := time.Unix(1000, 0)
	abuser := events.Principal{Kind: events.PrincipalBot, ID: "abuser"}
	person := events.Principal{Kind: events.PrincipalUser, ID: "u1"}
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	checks := []Check{
		{Start: began, Latency: ms(10), Principal: person, OK: true, Allowed: true},
		{Start: began, Latency: ms(60), Principal: person, OK: true, Allowed: true, Degraded: true}, // late: not failed open
		{Start: began, Latency: ms(20), Principal: person, OK: true, Allowed: true, Degraded: true}, // failed open
		{Start: began, Latency: ms(20), Principal: person, OK: true, Degraded: true, Shed: true},    // shed
		{Start: began, Latency: ms(5), Principal: person, Overloaded: true},                         // UNAVAILABLE in time
		{Start: began, Latency: ms(70), Principal: person, Overloaded: true},                        // UNAVAILABLE, read late
		{Start: began, Latency: ms(15), Principal: abuser, OK: true, Allowed: true},                 // abuser admitted
		{Start: began, Latency: ms(15), Principal: abuser, OK: true},                                // abuser refused
		{Start: began, Latency: ms(30), Principal: person, OK: true, Dropped: true},                 // dropped while waiting
		{Start: began, Latency: ms(8), Arrival: ms(3), Principal: person, OK: true, Priority: "critical"},
		{Start: began.Add(ms(500)), Latency: ms(50), Principal: person, Priority: "critical", GaveUp: true}, // not answered, first second; its answer came after
		{Start: began.Add(ms(600)), Latency: ms(52), Principal: person, Priority: "critical", GaveUp: true}, // not answered, and no answer came
		{Start: began.Add(ms(1500)), Latency: ms(40), Principal: person, Priority: "critical"},              // not answered: counts as 50 ms
		{Start: began.Add(ms(1500)), Latency: ms(55), Principal: person, OK: true, Priority: "critical"},    // late
	}
	// What came for calls given up on: one answer that had reached the
	// socket 20 ms after it was sent, one with no receive time (not
	// counted), and one refused.
	after := []Check{
		{Start: began.Add(ms(500)), Latency: ms(80), Arrival: ms(20), OK: true, Priority: "critical", GaveUp: true},
		{Start: began.Add(ms(600)), Latency: ms(90), OK: true, Priority: "critical", GaveUp: true},
		{Start: began.Add(ms(600)), Latency: ms(90), Arrival: ms(30), Overloaded: true, Priority: "critical", GaveUp: true},
	}
	got := tallyPhase(checks, after, abuser, began)
	want := phaseTally{inTime: 7, late: 2, failedOpen: 1, shed: 1, overloaded: 1, droppedWaiting: 1, abuserAllowed: 1,
		crit: []time.Duration{ms(8), ms(50), ms(50), ms(52), ms(55)}, critArrived: []time.Duration{ms(3), ms(20), ms(50), ms(52), ms(55)},
		arrivals: true, critInTime: 1, critMissedFirst: 2, critGaveUp: 2, critGaveUpInTime: 1}
	require.Equal(t, want, got)
	require.Equal(t, ms(55), quantile(got.crit, 99))
	require.Equal(t, ms(3), quantile(got.critArrived, 0))
	require.Zero(t, quantile(nil, 99))
}

// A load with Rates and Slice offers each rate in its turn: the checks it
// starts in each slice follow that slice's rate.
func TestLoadInterleavesRates(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"allowed": true}`)
	}))
	defer srv.Close()
	const slice = 400 * time.Millisecond
	l := &Load{URL: srv.URL, Workers: 16, Rates: []int{50, 250}, Slice: slice,
		Next: func(w, i int) events.Principal { return events.Principal{Kind: events.PrincipalUser, ID: "u"} }}
	stop := startLoad(context.Background(), l)
	time.Sleep(4*slice + slice/2)
	stop()
	require.NoError(t, l.Err())
	start := l.Started()
	require.False(t, start.IsZero())
	per := make([]int, 4) // checks started in each of the first four slices
	for _, c := range l.Results() {
		if k := int(c.Start.Sub(start) / slice); k >= 0 && k < len(per) {
			per[k]++
		}
	}
	// 20 and 100 checks a slice as offered; the machine may run late, not
	// early, so the high slices hold well over twice the low ones.
	low, high := per[0]+per[2], per[1]+per[3]
	require.InDelta(t, 40, low, 12, "low slices %v", per)
	require.Greater(t, high, 3*low, "slices %v: 250/s against 50/s", per)
}

// A scenario has 5 minutes, and 2 more for each overload repeat past the
// first.
func TestScenarioTimeout(t *testing.T) {
	require.Equal(t, 5*time.Minute, scenarioTimeout(Size{}))
	require.Equal(t, 5*time.Minute, scenarioTimeout(Size{OverloadRepeat: 1}))
	require.Equal(t, 9*time.Minute, scenarioTimeout(Size{OverloadRepeat: 3}))
}

// The generator's own waits for a CPU read as the limiter's scrape does:
// cumulative buckets, +Inf last, that schedNote can read.
func TestOwnSchedLatencies(t *testing.T) {
	before := ownSchedLatencies()
	var wg sync.WaitGroup
	for range 256 { // goroutines that wait for a CPU (the runtime samples one transition in 8)
		wg.Add(1)
		go func() { defer wg.Done(); runtime.Gosched() }()
	}
	wg.Wait()
	after := ownSchedLatencies()
	require.NotEmpty(t, after)
	require.Len(t, after, len(before))
	require.True(t, math.IsInf(after[len(after)-1].LE, 1), "+Inf last")
	for i := 1; i < len(after); i++ {
		require.GreaterOrEqual(t, after[i].Count, after[i-1].Count, "cumulative")
		require.Greater(t, after[i].LE, after[i-1].LE, "by upper bound")
	}
	require.Greater(t, after[len(after)-1].Count, before[len(before)-1].Count, "the waits since were counted")
	require.Contains(t, schedNote(before, after), "waits for the CPU (the runtime's sample)")
}

// TestCheckNote: the engine's check times between two scrapes, by share
// over 10 and 25 ms.
func TestCheckNote(t *testing.T) {
	b := func(counts ...float64) []promtext.Bucket {
		les := []float64{0.005, 0.01, 0.025, 0.05, math.Inf(1)}
		out := make([]promtext.Bucket, len(les))
		for i := range les {
			out[i] = promtext.Bucket{LE: les[i], Count: counts[i]}
		}
		return out
	}
	from := b(10, 10, 10, 10, 10)
	to := b(90, 100, 105, 110, 110) // 100 decided: 10 over 10 ms, 5 over 25 ms, none over 50 ms
	require.Equal(t, "checks decided by the engine (floodgate_limiter_check_seconds, Redis round trip included): 100, 10.00 % over 10.0 ms, 5.00 % over 25.0 ms, all under 50.0 ms",
		checkNote(from, to))
	require.Equal(t, "checks decided by the engine (floodgate_limiter_check_seconds, Redis round trip included): not read", checkNote(nil, nil))
	none := b(100, 110, 110, 110, 110) // 100 decided, none over 10 ms
	require.Contains(t, checkNote(from, none), "0.00 % over 10.0 ms, 0.00 % over 25.0 ms, all under 10.0 ms")
}

func TestSpread(t *testing.T) {
	require.Equal(t, "none", spread(nil))
	require.Equal(t, "median 65 (45–107): 86, 48, 45, 107, 65", spread([]float64{86, 48, 45, 107, 65}))
	require.Equal(t, "median 57 (44–86): 86, 48, 44, 66", spread([]float64{86, 48, 44, 66}), "an even count: the mean of the middle two")
	require.Equal(t, "median 90 (90–90): 90", spread([]float64{90}))
}

// TestCoreProbe: the overload scenarios' line for core 1's speed (the
// scenarios need two cores, as this test does).
func TestCoreProbe(t *testing.T) {
	require.Regexp(t, `^sha256 of 64 MiB in [0-9.]+ ms \([0-9.]+ ms of CPU\)$`, coreProbe(context.Background()))
}

// TestRenice: every thread of a process gets the nice value.
func TestRenice(t *testing.T) {
	if os.Getenv("FLOODGATE_RENICE_HELPER") != "" {
		time.Sleep(10 * time.Second) // a Go process: several threads
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestRenice$")
	cmd.Env = append(os.Environ(), "FLOODGATE_RENICE_HELPER=1")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := cmd.Process.Pid
	tasks := func() []os.DirEntry {
		d, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		require.NoError(t, err)
		return d
	}
	require.Eventually(t, func() bool { return len(tasks()) > 1 }, 5*time.Second, 10*time.Millisecond, "the helper's threads")
	require.NoError(t, renice(pid, 7))
	for _, task := range tasks() {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		require.NoError(t, err)
		// After the command name's ")": state is field 3, nice field 19.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		require.Equal(t, "7", fields[16], "nice of thread %s", task.Name())
	}
	require.Error(t, renice(1<<22, 0), "no such process")
}

func TestInterleavedPerfNote(t *testing.T) {
	const fg = "github.com/floodgate-dev/floodgate/"
	read, decide := "runtime.goexit;"+fg+"pkg/grpcfast.(*conn).readLoop;syscall.read", "runtime.goexit;"+fg+"pkg/limiter/server.(*Server).Check"
	o := &overloadRun{perfHz: 999, profiles: "/work"}
	rs := []interleavedRate{
		// 1,000 answers on 100 ms of CPU: 100 µs each, half reading.
		{rate: 100, inTime: 1000, cpu: 100 * time.Millisecond, stacks: perfsplit.Stacks{read: 50, decide: 50}},
		// 2,000 answers on 300 ms: 150 µs each, two thirds reading.
		{rate: 200, inTime: 2000, cpu: 300 * time.Millisecond, stacks: perfsplit.Stacks{read: 200, decide: 100}},
	}
	note := o.interleavedPerfNote("interleaved #2", rs, []string{"1.0×", "2.0×"})
	assert.Contains(t, note, "/work/interleaved-2-limiters.perf.data")
	assert.Contains(t, note, "1.0× 100 samples, transport 50.0 + engine 50.0 +")
	assert.Contains(t, note, "2.0× 300 samples, transport 100.0 + engine 50.0 +")
	assert.Contains(t, note, "grew most from 1.0× to 2.0× (µs per answer, inclusive): "+fg+"pkg/grpcfast.(*conn).readLoop 50.0 → 100.0")

	rs[0].perfErr = errors.New("perf record: exit status 255")
	assert.Equal(t, "perf: perf record: exit status 255", o.interleavedPerfNote("interleaved", rs, []string{"1.0×", "2.0×"}))
}

func TestTallyRedisSlow(t *testing.T) {
	at := time.Unix(1000, 0)
	checks := []Check{
		{Start: at, Latency: 30 * time.Millisecond, OK: true},                             // decided
		{Start: at, Latency: 10 * time.Millisecond, OK: true, Degraded: true, Shed: true}, // degraded (shed)
		{Start: at, Latency: 5 * time.Millisecond, Overloaded: true},                      // the gate's UNAVAILABLE
		{Start: at, Latency: 51 * time.Millisecond, OK: true},                             // too late
		{Start: at, Latency: 50 * time.Millisecond, GaveUp: true},                         // none
		{Start: at.Add(-time.Millisecond), Latency: time.Millisecond, OK: true},           // before the phase
		{Start: at.Add(time.Second), Latency: time.Millisecond, OK: true},                 // after it
	}
	got := tallyRedisSlow(checks, at, at.Add(time.Second))
	require.Equal(t, redisSlowTally{sent: 5, inTime: 1, degraded: 1, overloaded: 1, none: 2}, got)
	require.InDelta(t, 20.0, got.pct(got.inTime), 1e-9)
}
