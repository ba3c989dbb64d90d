package h2guardtest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// CPU is the user plus system CPU time process pid has used, from
// /proc/<pid>/stat (utime and stime, in USER_HZ = 100 ticks a second).
func CPU(pid int) (time.Duration, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrNoProc, err)
	}
	// The command name (field 2) may hold spaces: fields after its ')'.
	rest := string(raw[strings.LastIndexByte(string(raw), ')')+2:])
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}
