package testenv

import (
	"net"
	"strconv"
	"testing"
)

// Tests that FreePort gives a port below the kernel's ephemeral range,
// which no outgoing connection can take before the server binds it, and
// that the port can be bound.
func TestFreePortIsBelowTheEphemeralRange(t *testing.T) {
	high := ephemeralLow()
	for range 20 {
		port := FreePort(t)
		if port < freePortFloor || port >= high {
			t.Fatalf("FreePort = %d, want a port in [%d, %d), below the ephemeral range", port, freePortFloor, high)
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatalf("listen on the port FreePort gave: %v", err)
		}
		l.Close()
	}
}
