// Package cputime reads how much CPU time processes have used, so a
// benchmark can split one path's cost between the processes that serve it
// (client, server, memcached) when they share the same cores.
package cputime

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// userHZ is the unit of /proc/PID/stat's times: Linux reports them in
// USER_HZ, which is 100 on every architecture it exposes to user space.
const userHZ = 100

// Of returns the user plus system CPU time process pid has used, from
// /proc/PID/stat (10 ms resolution).
func Of(pid int) (time.Duration, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("cputime: %w", err)
	}
	return parseStat(string(raw))
}

// Self returns the CPU time this process has used (microsecond
// resolution).
func Self() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// parseStat reads utime and stime (fields 14 and 15) from a stat line.
// The command name (field 2) is in parentheses and may hold spaces, so
// fields are counted from the last ')'.
func parseStat(line string) (time.Duration, error) {
	end := strings.LastIndexByte(line, ')')
	if end < 0 {
		return 0, fmt.Errorf("cputime: malformed stat line %q", line)
	}
	fields := strings.Fields(line[end+1:])
	// fields[0] is field 3 (state); utime is field 14, stime field 15.
	if len(fields) < 13 {
		return 0, fmt.Errorf("cputime: stat line has %d fields after the name, want at least 13", len(fields))
	}
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("cputime: stat time %q: %w", f, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// Meter samples the CPU time of a fixed set of processes; pid 0 means
// this process.
type Meter struct {
	pids []int
}

// NewMeter measures pids (0 for this process).
func NewMeter(pids ...int) *Meter { return &Meter{pids: pids} }

// Sample returns each process's CPU time so far, in NewMeter's order.
func (m *Meter) Sample() ([]time.Duration, error) {
	out := make([]time.Duration, len(m.pids))
	for i, pid := range m.pids {
		if pid == 0 {
			out[i] = Self()
			continue
		}
		d, err := Of(pid)
		if err != nil {
			return nil, err
		}
		out[i] = d
	}
	return out, nil
}

// Since returns, per process, the CPU time used between two samples.
func Since(before, after []time.Duration) []time.Duration {
	out := make([]time.Duration, len(after))
	for i := range after {
		out[i] = after[i] - before[i]
	}
	return out
}

// Machine returns the CPU time all cores have spent busy and in all, from
// the first line of /proc/stat.
func Machine() (busy, total time.Duration, err error) {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, fmt.Errorf("cputime: %w", err)
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	fields := strings.Fields(line)
	if len(fields) < 6 || fields[0] != "cpu" {
		return 0, 0, fmt.Errorf("cputime: /proc/stat starts with %q, want the cpu line", line)
	}
	var idle int64
	for i, f := range fields[1:] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("cputime: /proc/stat field %q: %w", f, err)
		}
		if i < 8 { // user nice system idle iowait irq softirq steal; guest time is inside user
			total += time.Duration(n) * time.Second / userHZ
		}
		if i == 3 || i == 4 {
			idle += n
		}
	}
	return total - time.Duration(idle)*time.Second/userHZ, total, nil
}
