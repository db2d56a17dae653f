// Package sockets reads the kernel's TCP socket tables
// (/proc/net/tcp and /proc/net/tcp6) so that sluice and its tests can
// count the process's connections to a server by TCP state — the figure
// that showed the outage this project answers (thousands of sockets in
// TIME_WAIT toward memcached). It is Linux-only and read-only.
package sockets

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// State is a TCP state as the kernel numbers it.
type State uint8

// The TCP states, as in include/net/tcp_states.h.
const (
	Established State = 1 + iota
	SynSent
	SynRecv
	FinWait1
	FinWait2
	TimeWait
	Close
	CloseWait
	LastAck
	Listen
	Closing
)

var stateNames = map[State]string{
	Established: "ESTABLISHED", SynSent: "SYN_SENT", SynRecv: "SYN_RECV", FinWait1: "FIN_WAIT1",
	FinWait2: "FIN_WAIT2", TimeWait: "TIME_WAIT", Close: "CLOSE", CloseWait: "CLOSE_WAIT",
	LastAck: "LAST_ACK", Listen: "LISTEN", Closing: "CLOSING",
}

// String returns the state's conventional name, e.g. "TIME_WAIT".
func (s State) String() string {
	if n, ok := stateNames[s]; ok {
		return n
	}
	return "UNKNOWN"
}

// Socket is one row of the kernel's TCP table.
type Socket struct {
	Local, Remote netip.AddrPort
	State         State
	Inode         uint64 // 0 for sockets no process owns (TIME_WAIT)
}

// All returns every TCP socket on the machine (IPv4 and IPv6), each once.
func All() ([]Socket, error) {
	var out []Socket
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		rows, err := readTCPTable(file)
		if err != nil {
			return nil, err
		}
		out = append(out, rows...)
	}
	return unique(out), nil
}

// unique drops repeated rows. The kernel's table is read a page at a
// time, and a socket that moves in its hash table between two reads
// appears twice; on a busy machine that happens often enough to make one
// connection count as two. A connection is one 4-tuple, whatever state
// each copy caught it in; listening sockets, which share a zero remote
// end, are told apart by inode.
func unique(rows []Socket) []Socket {
	type key struct {
		local, remote netip.AddrPort
		inode         uint64
	}
	seen := make(map[key]bool, len(rows))
	out := rows[:0]
	for _, s := range rows {
		k := key{local: s.Local, remote: s.Remote}
		if s.State == Listen {
			k.inode = s.Inode
		}
		if seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, s)
	}
	return out
}

// To counts sockets whose remote end is remote, by state. Sockets a
// process owns are counted only if this process owns them; sockets in
// TIME_WAIT belong to no process and are counted whoever closed them, so
// on a shared machine that figure is an upper bound for this process.
func To(remote netip.AddrPort) (map[State]int, error) {
	all, err := All()
	if err != nil {
		return nil, err
	}
	mine, err := socketInodes()
	if err != nil {
		return nil, err
	}
	counts := map[State]int{}
	for _, s := range all {
		if s.Remote != remote {
			continue
		}
		if mine[s.Inode] || ownerless(s) {
			counts[s.State]++
		}
	}
	return counts, nil
}

// ownerless reports whether s is a socket no process holds any more: one
// closed and still in TIME_WAIT or another closing state. An open
// connection always has its owner's inode, so an ESTABLISHED row with
// none is the server's end of one not yet accepted, never this process's.
func ownerless(s Socket) bool { return s.Inode == 0 && s.State != Established }

// socketInodes returns the inodes of the sockets this process has open.
func socketInodes() (map[uint64]bool, error) {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil, fmt.Errorf("sockets: list fds: %w", err)
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
	return inodes, nil
}

// readTCPTable parses a /proc/net/tcp-format file. A missing file (no
// IPv6) is an empty table.
func readTCPTable(path string) ([]Socket, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sockets: %w", err)
	}
	defer f.Close()
	var out []Socket
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		s, err := parseTCPLine(sc.Text())
		if err != nil {
			return nil, fmt.Errorf("sockets: %s: %w", path, err)
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("sockets: read %s: %w", path, err)
	}
	return out, nil
}

// parseTCPLine parses one row: "sl local rem st tx:rx tr:when retr uid
// timeout inode …".
func parseTCPLine(line string) (Socket, error) {
	f := strings.Fields(line)
	if len(f) < 10 {
		return Socket{}, fmt.Errorf("short line %q", line)
	}
	local, err := parseHexAddrPort(f[1])
	if err != nil {
		return Socket{}, err
	}
	remote, err := parseHexAddrPort(f[2])
	if err != nil {
		return Socket{}, err
	}
	state, err := strconv.ParseUint(f[3], 16, 8)
	if err != nil {
		return Socket{}, fmt.Errorf("state %q: %w", f[3], err)
	}
	inode, err := strconv.ParseUint(f[9], 10, 64)
	if err != nil {
		return Socket{}, fmt.Errorf("inode %q: %w", f[9], err)
	}
	return Socket{Local: local, Remote: remote, State: State(state), Inode: inode}, nil
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
