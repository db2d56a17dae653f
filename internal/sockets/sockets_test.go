package sockets

import (
	"net"
	"net/netip"
	"testing"
)

// Tests that the /proc/net/tcp parser reads addresses, ports and states.
func TestParseTCPLine(t *testing.T) {
	tests := []struct {
		name, line string
		want       Socket
	}{
		{
			name: "ipv4 established",
			line: "   3: 0100007F:A1B2 0100007F:2BCB 01 00000000:00000000 00:00000000 00000000     0        0 123456 1 0000000000000000 20 4 30 10 -1",
			want: Socket{Local: netip.MustParseAddrPort("127.0.0.1:41394"), Remote: netip.MustParseAddrPort("127.0.0.1:11211"), State: Established, Inode: 123456},
		},
		{
			name: "ipv6 listen",
			line: "   0: 00000000000000000000000001000000:2BCB 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 42 1 0000000000000000 100 0 0 10 0",
			want: Socket{Local: netip.MustParseAddrPort("[::1]:11211"), Remote: netip.MustParseAddrPort("[::]:0"), State: Listen, Inode: 42},
		},
		{
			name: "time wait",
			line: "   9: 0100007F:C350 0100007F:2BCB 06 00000000:00000000 03:00000F3A 00000000     0        0 0 3 0000000000000000",
			want: Socket{Local: netip.MustParseAddrPort("127.0.0.1:50000"), Remote: netip.MustParseAddrPort("127.0.0.1:11211"), State: TimeWait, Inode: 0},
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
	if _, err := parseTCPLine("garbage"); err == nil {
		t.Error("parseTCPLine(garbage) succeeded")
	}
}

// Tests that To sees this process's own connection to a local listener.
func TestToCountsOwnConnection(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	counts, err := To(netip.MustParseAddrPort(l.Addr().String()))
	if err != nil {
		t.Fatal(err)
	}
	if counts[Established] != 1 {
		t.Fatalf("ESTABLISHED to listener = %d, want 1 (%v)", counts[Established], counts)
	}
	if TimeWait.String() != "TIME_WAIT" {
		t.Errorf("TimeWait.String() = %q", TimeWait.String())
	}
}

// Tests that a connection the table lists twice (it moved between two
// page reads, possibly changing state) is counted once, while two
// listeners sharing a port stay two.
func TestUniqueDropsRepeatedRows(t *testing.T) {
	server := netip.MustParseAddrPort("127.0.0.1:11211")
	client := netip.MustParseAddrPort("127.0.0.1:50000")
	anyAddr := netip.MustParseAddrPort("0.0.0.0:0")
	rows := []Socket{
		{Local: client, Remote: server, State: Established, Inode: 7},
		{Local: server, Remote: anyAddr, State: Listen, Inode: 1},
		{Local: server, Remote: anyAddr, State: Listen, Inode: 2},
		{Local: client, Remote: server, State: Established, Inode: 7},
		{Local: client, Remote: server, State: FinWait1, Inode: 7},
	}
	got := unique(rows)
	if len(got) != 3 || got[0].State != Established || got[1].Inode != 1 || got[2].Inode != 2 {
		t.Fatalf("unique = %+v; want the connection once and both listeners", got)
	}
}
