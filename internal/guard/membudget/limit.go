package membudget

import (
	"bufio"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// Where a default memory limit or GOGC came from, for the start-up log
// line.
const (
	SourceFlag     = "configured"
	SourceEnv      = "GOMEMLIMIT"
	SourceGOGC     = "GOGC"
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
// garbage — and pooled buffers nobody holds — grow without bound, and
// sets GOGC to gcPercent (0 leaves the environment's GOGC in force).
func Apply(limit Bytes, gcPercent int) {
	debug.SetMemoryLimit(int64(limit))
	if gcPercent != 0 {
		debug.SetGCPercent(gcPercent)
	}
}

// The collector's GOGC when none is configured, and the range a
// configured one must lie in.
//
// Go's own default, 100, collects each time the heap doubles: on a read
// path whose live heap is small (tens of MiB) and whose garbage is
// almost all per-request, that is a collection every few milliseconds
// under load, a tenth of the CPU. With a soft memory limit in force the
// heap cannot grow past the budget whatever GOGC says, so the default is
// raised to 400: the heap may grow to five times the live heap, up to
// the budget, and the collector's share of the CPU falls about fourfold.
const (
	defaultGCPercent = 400
	MinGCPercent     = 25
	MaxGCPercent     = 2000
)

// SourceDefault says a setting took sluice's default.
const SourceDefault = "default"

// DefaultGCPercent returns the GOGC to set when none is configured, and
// where it came from: 0 and SourceGOGC when the environment sets GOGC
// (the runtime already applied it), else defaultGCPercent.
func DefaultGCPercent() (int, string) {
	if os.Getenv("GOGC") != "" {
		return 0, SourceGOGC
	}
	return defaultGCPercent, SourceDefault
}

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
