package membudget

import (
	"bufio"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// Where a default memory limit came from, for the start-up log line.
const (
	SourceFlag     = "configured"
	SourceEnv      = "GOMEMLIMIT"
	SourceCgroup   = "cgroup"
	SourceMachine  = "machine"
	SourceFallback = "fixed default"
)

// FallbackLimit is the budget when neither GOMEMLIMIT, a cgroup limit nor
// the machine's memory can be read.
const FallbackLimit = 1 * GiB

// maxMachineLimit caps the default taken from the machine's memory: a
// process without a cgroup limit shares its host, and a quarter of a
// large host is more than a data plane of this shape needs.
const maxMachineLimit = 4 * GiB

// DefaultLimit returns the memory budget to use when none is configured,
// and where it came from: GOMEMLIMIT when the environment sets it; else
// 90 % of the cgroup's memory limit (v2 memory.max, or v1
// memory.limit_in_bytes), leaving room for what the Go runtime does not
// count; else a quarter of the machine's memory, at most 4 GiB; else 1 GiB.
func DefaultLimit() (Bytes, string) {
	if env := debug.SetMemoryLimit(-1); env != math.MaxInt64 {
		return Bytes(env), SourceEnv
	}
	if lim, ok := cgroupLimit(); ok {
		return lim / 10 * 9, SourceCgroup
	}
	if total, ok := machineMemory(); ok {
		return min(total/4, maxMachineLimit), SourceMachine
	}
	return FallbackLimit, SourceFallback
}

// Apply sets the Go runtime's soft memory limit to limit, so that the
// collector works harder as the heap nears the budget instead of letting
// garbage — and pooled buffers nobody holds — grow to twice the live heap.
func Apply(limit Bytes) { debug.SetMemoryLimit(int64(limit)) }

func cgroupLimit() (Bytes, bool) {
	for _, path := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		raw, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
		// "max" (v2) or a huge page-rounded number (v1) mean no limit.
		if err != nil || n <= 0 || n >= 1<<60 {
			return 0, false
		}
		return Bytes(n), true
	}
	return 0, false
}

func machineMemory() (Bytes, bool) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil || kb <= 0 {
				return 0, false
			}
			return Bytes(kb) * KiB, true
		}
	}
	return 0, false
}
