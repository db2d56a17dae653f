package cache

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/guard/fanout"
	"github.com/sluice-dev/sluice/internal/testenv"
)

// Tests that 200 concurrent callers against a cap of 4 never open more
// than 4 connections, in the Cache's own counters and in the kernel's
// socket table, and that the excess callers wait instead of dialing.
func TestConnectionCapHolds(t *testing.T) {
	const capConns, callers, rounds = 4, 200, 10
	addr := testenv.StartMemcached(t).Addr()
	_, portStr, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(portStr)
	c := newCache(t, []string{addr}, func(cfg *Config) {
		cfg.MaxConnsPerServer = capConns
		cfg.Timeout = 2 * time.Second
	})
	uris := uniqueURIs(t, callers)

	var done atomic.Int32
	var peakOpen, peakDials, peakSockets int64
	samples := 0
	ctx := testContext(t, callers+1)
	_ = fanout.Each(ctx, callers+1, func(ctx context.Context, i int) error {
		if i == callers { // the sampler
			for done.Load() < callers {
				s := c.Stats()[0]
				peakOpen, peakDials = max(peakOpen, s.OpenConns), max(peakDials, s.Dials)
				peakSockets = max(peakSockets, int64(establishedTo(t, port)))
				samples++
				time.Sleep(time.Millisecond)
			}
			return nil
		}
		defer done.Add(1)
		u := uris[i]
		for r := range rounds {
			if r%2 == 0 {
				c.Fill(ctx, map[string]Entry{u: {Value: []byte(u)}})
			} else {
				c.GetMulti(ctx, []string{u, uris[(i+1)%callers]})
			}
		}
		return nil
	})

	s := c.Stats()[0]
	t.Logf("%d samples; peak open %d, peak sockets %d; final %+v", samples, peakOpen, peakSockets, s)
	if peakOpen > capConns || peakDials > capConns || s.Dials > capConns {
		t.Errorf("peak open conns %d, peak dials %d, final dials %d; want all ≤ %d", peakOpen, peakDials, s.Dials, capConns)
	}
	if peakSockets > capConns {
		t.Errorf("saw %d established sockets to memcached, want ≤ %d", peakSockets, capConns)
	}
	if peakSockets == 0 || samples < 3 {
		t.Errorf("sampler saw %d sockets in %d samples; the test did not observe the load", peakSockets, samples)
	}
	if s.Waits == 0 {
		t.Errorf("no caller waited; the cap was never reached")
	}
	if s.Errors != 0 || s.WaitExpired != 0 || s.Hits == 0 {
		t.Errorf("stats = %+v, want hits and no errors or expired waits", s)
	}
}

// tcpSocket is one row of /proc/net/tcp or /proc/net/tcp6.
type tcpSocket struct {
	local, remote netip.AddrPort
	state         uint8 // 1 is ESTABLISHED
	inode         uint64
}

const tcpEstablished = 1

// establishedTo counts this process's ESTABLISHED TCP sockets whose
// remote port is port.
func establishedTo(t *testing.T, port int) int {
	t.Helper()
	mine := socketInodes(t)
	n := 0
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		for _, s := range readTCPTable(t, file) {
			if s.state == tcpEstablished && int(s.remote.Port()) == port && mine[s.inode] {
				n++
			}
		}
	}
	return n
}

// socketInodes returns the inodes of the sockets this process has open.
func socketInodes(t *testing.T) map[uint64]bool {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("list fds: %v", err)
	}
	inodes := make(map[uint64]bool)
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err != nil || !strings.HasPrefix(link, "socket:[") {
			continue // closed since ReadDir, or not a socket
		}
		if ino, err := strconv.ParseUint(strings.Trim(link[len("socket:"):], "[]"), 10, 64); err == nil {
			inodes[ino] = true
		}
	}
	return inodes
}

// readTCPTable parses a /proc/net/tcp-format file. A missing file (no
// IPv6) is an empty table.
func readTCPTable(t *testing.T, path string) []tcpSocket {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer f.Close()
	var out []tcpSocket
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		s, err := parseTCPLine(sc.Text())
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return out
}

// parseTCPLine parses one row: "sl local rem st tx:rx tr:when retr uid
// timeout inode …".
func parseTCPLine(line string) (tcpSocket, error) {
	f := strings.Fields(line)
	if len(f) < 10 {
		return tcpSocket{}, fmt.Errorf("short line %q", line)
	}
	local, err := parseHexAddrPort(f[1])
	if err != nil {
		return tcpSocket{}, err
	}
	remote, err := parseHexAddrPort(f[2])
	if err != nil {
		return tcpSocket{}, err
	}
	state, err := strconv.ParseUint(f[3], 16, 8)
	if err != nil {
		return tcpSocket{}, fmt.Errorf("state %q: %w", f[3], err)
	}
	inode, err := strconv.ParseUint(f[9], 10, 64)
	if err != nil {
		return tcpSocket{}, fmt.Errorf("inode %q: %w", f[9], err)
	}
	return tcpSocket{local: local, remote: remote, state: uint8(state), inode: inode}, nil
}

// parseHexAddrPort parses "0100007F:2AF8": the address as 32-bit words in
// host (little-endian) order, the port big-endian.
func parseHexAddrPort(s string) (netip.AddrPort, error) {
	hexAddr, hexPort, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("address %q has no port", s)
	}
	raw, err := hex.DecodeString(hexAddr)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, fmt.Errorf("address %q: bad hex", s)
	}
	for i := 0; i < len(raw); i += 4 {
		binary.BigEndian.PutUint32(raw[i:], binary.LittleEndian.Uint32(raw[i:]))
	}
	port, err := strconv.ParseUint(hexPort, 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("port in %q: %w", s, err)
	}
	addr, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(addr, uint16(port)), nil
}

// Tests that the /proc/net/tcp parser reads addresses, ports and states.
func TestParseTCPLine(t *testing.T) {
	tests := []struct {
		name, line string
		want       tcpSocket
	}{
		{
			name: "ipv4 established",
			line: "   3: 0100007F:A1B2 0100007F:2BCB 01 00000000:00000000 00:00000000 00000000     0        0 123456 1 0000000000000000 20 4 30 10 -1",
			want: tcpSocket{local: netip.MustParseAddrPort("127.0.0.1:41394"), remote: netip.MustParseAddrPort("127.0.0.1:11211"), state: 1, inode: 123456},
		},
		{
			name: "ipv6 listen",
			line: "   0: 00000000000000000000000001000000:2BCB 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 42 1 0000000000000000 100 0 0 10 0",
			want: tcpSocket{local: netip.MustParseAddrPort("[::1]:11211"), remote: netip.MustParseAddrPort("[::]:0"), state: 0x0a, inode: 42},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseTCPLine(tc.line)
			if err != nil || got != tc.want {
				t.Fatalf("parseTCPLine = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}
