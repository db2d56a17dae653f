package telemetry

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/internal/sockets"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// ObserveProcess exports sluice_process_os_threads: the OS threads of the
// process, read from /proc/self/status. The Go collector's go_threads
// counts threads the Go runtime created, which misses threads created
// outside it; the kernel's count is the figure that jumped in the outage.
func (t *Telemetry) ObserveProcess() error {
	_, err := t.meter.Int64ObservableGauge("sluice.process.os_threads",
		metric.WithDescription("OS threads of the process, as the kernel counts them (/proc/self/status Threads)."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			n, err := OSThreads()
			if err != nil {
				return err
			}
			o.Observe(int64(n))
			return nil
		}))
	return err
}

// ObserveGoroutineBound exports sluice_process_goroutine_bound: the most
// goroutines the config's caps allow (see GoroutineBound), which
// go_goroutines is alerted against.
func (t *Telemetry) ObserveGoroutineBound(bound int64) error {
	_, err := t.meter.Int64ObservableGauge("sluice.process.goroutine_bound",
		metric.WithDescription("The most goroutines the config's caps allow: 2 per open stream, 1 per in-flight item, 5 per connection, 200 for the runtime and servers."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(bound)
			return nil
		}))
	return err
}

// GoroutineBound is the goroutine count the process-wide caps imply:
// every open stream (max_streams: the requests in flight and those
// queued for a slot) runs a handler plus gRPC's stream goroutine, fan-out
// tasks never exceed the in-flight items, each connection holds gRPC's
// reader, writer and keepalive goroutines (5 allowed), and a fixed 200
// cover the runtime and the admin server's own goroutines.
func GoroutineBound(maxStreams, maxInflightItems int64, maxConnections int) int64 {
	return 2*maxStreams + maxInflightItems + goroutinesPerConnection*int64(maxConnections) + 200
}

// goroutinesPerConnection is what GoroutineBound allows an open gRPC
// connection.
const goroutinesPerConnection = 5

// OSThreads returns the number of OS threads of this process, as the
// kernel counts them in /proc/self/status.
func OSThreads() (int, error) {
	const path = "/proc/self/status"
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("telemetry: os threads: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				return 0, fmt.Errorf("telemetry: os threads: %q: %w", v, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("telemetry: os threads: no Threads line in %s", path)
}

// alwaysReportedStates get a series per server even at zero, so that a
// dashboard shows a flat line instead of "no data".
var alwaysReportedStates = []sockets.State{sockets.Established, sockets.TimeWait}

// ObserveSockets exports sluice_memcached_sockets{server,state}: the
// process's TCP sockets to each memcached server by state, read from the
// kernel's tables at scrape time. TIME_WAIT sockets belong to no process,
// so that figure counts every such socket toward the server on this host.
func (t *Telemetry) ObserveSockets(servers []string) error {
	_, err := t.meter.Int64ObservableGauge("sluice.memcached.sockets",
		metric.WithDescription("TCP sockets to each memcached server by state (ESTABLISHED, TIME_WAIT, …), from /proc/net/tcp{,6}."),
		metric.WithInt64Callback(func(ctx context.Context, o metric.Int64Observer) error {
			for _, server := range servers {
				remote, err := resolve(ctx, server)
				if err != nil {
					continue // an unresolvable name has no sockets to count
				}
				counts, err := sockets.To(remote)
				if err != nil {
					return err
				}
				for _, st := range alwaysReportedStates {
					counts[st] += 0
				}
				for st, n := range counts {
					o.Observe(int64(n), metric.WithAttributes(attribute.String("server", server), attribute.String("state", st.String())))
				}
			}
			return nil
		}))
	return err
}

// resolve turns host:port into the address the kernel table shows.
func resolve(ctx context.Context, server string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(server); err == nil {
		return ap, nil
	}
	host, portStr, err := net.SplitHostPort(server)
	if err != nil {
		return netip.AddrPort{}, err
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return netip.AddrPort{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil || len(addrs) == 0 {
		return netip.AddrPort{}, fmt.Errorf("telemetry: resolve %s: %w", server, err)
	}
	return netip.AddrPortFrom(dialedAddr(addrs), uint16(port)), nil
}

// dialedAddr is the address of addrs the memcached client connects to:
// it resolves a server name as net.ResolveTCPAddr does, to the first IPv4
// address when there is one.
func dialedAddr(addrs []netip.Addr) netip.Addr {
	for _, a := range addrs {
		if a.Unmap().Is4() {
			return a.Unmap()
		}
	}
	return addrs[0]
}
