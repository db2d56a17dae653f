package telemetry

import (
	"net/netip"
	"testing"
)

// Tests that the socket counts look for the address the memcached client
// dials: a name that resolves to IPv6 and IPv4 addresses is dialed on its
// first IPv4 one (as net.ResolveTCPAddr resolves it), whatever the order.
func TestSocketsCountTheDialedAddress(t *testing.T) {
	v6, v4 := netip.MustParseAddr("::1"), netip.MustParseAddr("127.0.0.1")
	for _, addrs := range [][]netip.Addr{{v6, v4}, {v4, v6}, {netip.MustParseAddr("::ffff:127.0.0.1")}} {
		if got := dialedAddr(addrs); got != v4 {
			t.Errorf("dialedAddr(%v) = %v, want %v", addrs, got, v4)
		}
	}
	if got := dialedAddr([]netip.Addr{v6}); got != v6 {
		t.Errorf("dialedAddr([%v]) = %v, want it", v6, got)
	}
}
